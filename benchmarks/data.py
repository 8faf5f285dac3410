"""dew's data path against its peers, each part a ratio measured side by side in one run.

Design targets (issue 25, item 7; DESIGN.md "Performance targets"):

- `tokenize`: building dew's token cache for a corpus runs at >= 0.8x the MB/s of the
  `tokenizers` library's own `encode_batch` on the same files.
- `images`: `dew.data.image_folder`'s batches per second at least 10x the trainer's steps per
  second for `tiny_classifier` (the loader never the bottleneck).
- `hf`: `dew.data.huggingface`'s batches per second (columns, and a text column's windows) at
  least 10x the trainer's steps per second for `tiny_lm`.

Parts (`--part NAME`, repeatable; all by default):

- `tokenize`: the corpus is the Python standard library's own sources
  (`sysconfig.get_paths()["stdlib"]`, `**/*.py` in sorted order, as many files as fit in
  `--megabytes`, 8 by default; present on every machine, and nobody here wrote it), and a
  byte-level BPE `tokenizer.json` of `--vocab-size` (8192) IDs trained on it with
  `dew.data.tokenizers.train_tokenizer` before any timing (or `--tokenizer PATH`). Each
  round, in alternating order:
  - `dew text cache`: `dew.data.text(files, tokenizer=PATH, seq_len=128, batch=8,
    cache_dir=<fresh folder>)`, the call a user makes: it fingerprints the files, reads them,
    tokenizes them (`tokenizers`' `encode_batch_fast` through `HFTokenizer`, in batches of
    about 8 MB of text), appends each document's end-of-document ID, checks the IDs against
    the vocabulary, writes and fsyncs the cache, renames it into place and memory-maps it;
  - `tokenizers encode_batch`: `Tokenizer.from_file(PATH)` (loaded each round, as dew's
    side loads it: both start from a cold BPE word cache), each file read as text
    (`pathlib.Path.read_text`), `encode_batch(texts, add_special_tokens=False)` and every
    encoding's `.ids` (the IDs a consumer needs): the library's documented batch call;
  - `tokenizers encode_batch_fast`: the same through `encode_batch_fast` (no offsets), the
    library's fastest call and the one dew makes;
  - `dew text cache (bytes)`: the same `dew.data.text` call with the built-in bytes
    tokenizer, for scale (no peer).
  MB/s is the corpus's bytes on disk (10**6 bytes a MB) over a round's wall time; both sides
  use every core (`tokenizers`' Rayon pool). The table shows per side the median and best
  round's MB/s and the tokens a side produced (dew's include one end-of-document ID per
  file), and dew / peer as the ratio of the medians and of the best rounds (the steadier on
  a shared machine).
- `images`: a folder of `--images` (5,000) 32x32 RGB PNGs of noise in 3 class folders
  (`tiny_classifier`'s 3 classes), written for the run. Sides: the cache build
  (`image_folder(...)` into a fresh cache: every header scanned, every file decoded by Pillow,
  written, fsynced, renamed); `image_folder` batches of 64 read by
  `data.train.batch_at(step)` for consecutive steps, as `Trainer.fit` reads them; the same
  batches decoded per batch by Pillow instead (the files of each batch's rows through
  `decode_image`, stacked and scaled: what a loader without the cache pays); and
  `Trainer.fit` steps per second for `tiny_classifier`'s model, objective and optimizer (batch
  64) on its own 16x16 images and on these 32x32 ones (the ViT's `image_size` 32), each fed
  by a fixed in-memory batch and, at 32x32, by `image_folder` itself; continued with `state=`
  after a warm-up fit (compilation excluded).
- `hf`: a `datasets.Dataset` of `--rows` (100,000) rows of a 64-float list column and a
  `ClassLabel`, read as `huggingface(columns=...)` batches of 64 (`datasets`' own
  `dataset[indices]`, one call a batch), and a JSON Lines file of the standard library's
  sources (2 MB) read as `huggingface(text_column=..., seq_len=32)` batches of 32, against
  `Trainer.fit` steps per second for `tiny_lm` (batch 32).

Run: `python benchmarks/data.py` (all parts), `--part tokenize` (repeatable), `--quick` (a 1 MB
corpus, 2 rounds, fewer images, rows and steps). The benchmark asserts nothing and always exits
0; a part whose optional package (`tokenizers`, Pillow, `datasets`) is missing is skipped.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import platform
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from typing import Any

TOKENIZE_TARGET = 0.8  # dew's cache build / tokenizers' encode_batch, MB/s


def stdlib_files(megabytes: float) -> list[pathlib.Path]:
    """The standard library's `**/*.py` files in sorted order, as many as fit in `megabytes`."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or not path.is_file():
            continue
        size = path.stat().st_size
        if total + size > megabytes * 10**6:
            break
        chosen.append(path)
        total += size
    return chosen


def _timed(run: Callable[[], int]) -> tuple[float, int]:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        produced = run()
        return time.perf_counter() - start, produced
    finally:
        gc.enable()


def tokenize(args: argparse.Namespace) -> None:
    """The `tokenize` part: dew's token-cache build against `tokenizers`' `encode_batch`."""
    try:
        import tokenizers
    except ImportError:
        print("tokenize: skipped (tokenizers is not installed: pip install 'dew-ml[tokenizers]')")
        return
    from dew.data import text
    from dew.data.tokenizers import train_tokenizer

    megabytes = 1.0 if args.quick else args.megabytes
    rounds = 2 if args.quick else args.rounds
    files = stdlib_files(megabytes)
    size = sum(path.stat().st_size for path in files)
    work = pathlib.Path(tempfile.mkdtemp(prefix="dew-bench-data-"))
    if args.tokenizer:
        path = pathlib.Path(args.tokenizer)
    else:
        path = work / "tokenizer.json"
        started = time.perf_counter()
        train_tokenizer(files, args.vocab_size, path, progress=False)
        taken = time.perf_counter() - started
        print(f"trained a {args.vocab_size}-ID byte-level BPE in {taken:.1f} s")
    fresh = iter(range(10**6))

    def dew_cache(tokenizer: Any) -> Callable[[], int]:
        def run() -> int:
            data = text(files, tokenizer=tokenizer, seq_len=128, batch=8,
                        cache_dir=work / f"cache-{next(fresh)}", progress=False)  # fmt: skip
            return int(data.train.rows.tokens.shape[0])

        return run

    def library(call: str) -> Callable[[], int]:
        def run() -> int:
            tokenizer = tokenizers.Tokenizer.from_file(os.fspath(path))  # a cold BPE cache,
            texts = [file.read_text() for file in files]  # as dew's side loads it each round
            encodings = getattr(tokenizer, call)(texts, add_special_tokens=False)
            return sum(len(encoding.ids) for encoding in encodings)

        return run

    sides = {
        "dew text cache": dew_cache(path),
        "tokenizers encode_batch": library("encode_batch"),
        "tokenizers encode_batch_fast": library("encode_batch_fast"),
        "dew text cache (bytes)": dew_cache("bytes"),
    }
    for run in sides.values():  # warm-up: the page cache, the Rayon pool, imports
        run()
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    produced: dict[str, int] = {}
    for round_ in range(rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            elapsed, produced[name] = _timed(sides[name])
            seconds[name].append(elapsed)
    print(
        f"\ntokenize: {len(files)} files of the standard library, {size / 1e6:.2f} MB, "
        f"{rounds} rounds; tokenizers {tokenizers.__version__}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'side':32} {'median MB/s':>12} {'best MB/s':>10} {'tokens':>10}")
    rate = {
        name: (size / 1e6 / statistics.median(s), size / 1e6 / min(s))
        for name, s in seconds.items()
    }
    for name in sides:
        print(f"{name:32} {rate[name][0]:12.2f} {rate[name][1]:10.2f} {produced[name]:10d}")
    for peer in ("tokenizers encode_batch", "tokenizers encode_batch_fast"):
        median = rate["dew text cache"][0] / rate[peer][0]
        best = rate["dew text cache"][1] / rate[peer][1]
        print(
            f"dew / {peer}: {median:.2f}x (medians), {best:.2f}x (best rounds); "
            f"target >= {TOKENIZE_TARGET}x"
        )


LOADER_TARGET = 10.0  # the loader's batches/s / the trainer's steps/s


def _rate(run: Callable[[int], object], steps: int) -> float:
    """`run(step)` for steps 1 .. `steps` (after step 0, a warm-up), per second; each result
    is dropped before the next, as a training loop drops a batch it has used."""
    run(0)

    def every() -> int:
        for step in range(1, steps + 1):
            run(step)
        return steps

    elapsed, _ = _timed(every)
    return steps / elapsed


def _steps_per_second(config: Any, data: Any, steps: int) -> float:
    """`Trainer.fit` steps per second on `config`'s model, objective and optimizer, after a
    warm-up fit of 20 steps (compilation excluded), continued with `state=`."""
    import jax

    from dew.config._recipe import build_objective
    from dew.training import Trainer

    objective = build_objective(config, None, jax.random.key(0))
    trainer = Trainer(objective, config.optim.build(steps + 20), key=jax.random.key(1))
    state = trainer.fit(data, 20, log_every=50, progress=False)
    started = time.perf_counter()
    trainer.fit(data, steps + 20, state=state, log_every=50, progress=False)
    return steps / (time.perf_counter() - started)


def _fixed(batch: dict[str, Any], records: int) -> Any:
    import itertools

    from dew.data import Dataset

    return Dataset(train=lambda partition: itertools.repeat(batch), records=records, batch=64)


def _loader_rows(name: str, rate: float, steps: float, what: str) -> None:
    print(f"{name:58} {rate:10.1f} {rate / steps:8.1f}x  / {what} ({steps:.1f}); target >= 10x")


def images(args: argparse.Namespace) -> None:
    """The `images` part: `image_folder`'s batch rate against `tiny_classifier`'s step rate."""
    try:
        from PIL import Image
    except ImportError:
        print("images: skipped (Pillow is not installed: pip install 'dew-ml[images]')")
        return
    import dataclasses

    import numpy as np

    from dew.config import ModelConfig, builtin
    from dew.data import Partition, image_folder
    from dew.data._image_cache import decode_image
    from dew.data._image_folder import find_images

    count = 1000 if args.quick else args.images
    steps = 100 if args.quick else 1000
    work = pathlib.Path(tempfile.mkdtemp(prefix="dew-bench-images-"))
    rng = np.random.default_rng(0)
    for number in range(count):
        folder = work / "images" / f"class{number % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{number:05d}.png")
    built, data = _timed(lambda: image_folder(work / "images", batch=64, cache_dir=work / "c"))
    files = find_images(work / "images")[0]

    def decoded(step: int) -> object:
        chosen = data.train.indices(step, Partition())
        pixels = np.stack([decode_image("bench", files[row], 3, (32, 32)) for row in chosen])
        return pixels.astype(np.float32) / np.float32(255)

    cached = _rate(lambda step: data.train.batch_at(step, Partition()), steps)
    per_batch = _rate(decoded, max(20, steps // 10))
    base = builtin("tiny_classifier")
    wide = dataclasses.replace(
        base, model=ModelConfig("vit", {**base.model.kwargs, "image_size": 32})
    )
    train_steps = 60 if args.quick else 300
    small = {"images": np.zeros((64, 16, 16, 3), np.float32), "labels": np.zeros(64, np.int32)}
    own = _steps_per_second(base, _fixed(small, 1024), train_steps)
    at_32 = _steps_per_second(wide, _fixed(data.train.batch_at(0, Partition()), count), train_steps)
    fed = _steps_per_second(wide, data, train_steps)
    print(
        f"\nimages: {count} 32x32 RGB PNGs in 3 class folders, batch 64; {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"cache build: {built:.2f} s ({count / built:.0f} images/s, every file decoded once)")
    print(f"{'side':58} {'batches/s':>10} {'ratio':>9}")
    _loader_rows(
        "image_folder, read from the cache (batch_at)", cached, own, "tiny_classifier 16x16 steps/s"
    )
    _loader_rows(
        "image_folder, read from the cache (batch_at)",
        cached,
        at_32,
        "tiny_classifier's ViT at 32x32 steps/s",
    )
    _loader_rows(
        "Pillow decoding each batch's files instead",
        per_batch,
        own,
        "tiny_classifier 16x16 steps/s",
    )
    _loader_rows(
        "Pillow decoding each batch's files instead",
        per_batch,
        at_32,
        "tiny_classifier's ViT at 32x32 steps/s",
    )
    print(
        f"Trainer.fit at 32x32 fed by image_folder: {fed:.1f} steps/s against {at_32:.1f} "
        f"fed by a fixed in-memory batch ({fed / at_32:.2f}x)"
    )


def hf(args: argparse.Namespace) -> None:
    """The `hf` part: `huggingface`'s batch rate against `tiny_lm`'s step rate."""
    try:
        import datasets
    except ImportError:
        print("hf: skipped (datasets is not installed: pip install 'dew-ml[hf]')")
        return
    import json

    import numpy as np

    from dew.config import builtin
    from dew.data import Partition, huggingface

    rows = 10_000 if args.quick else args.rows
    steps = 100 if args.quick else 1000
    work = pathlib.Path(tempfile.mkdtemp(prefix="dew-bench-hf-"))
    rng = np.random.default_rng(0)
    features = datasets.Features(
        {
            "x": datasets.List(datasets.Value("float32"), length=64),
            "y": datasets.ClassLabel(num_classes=10),
        }
    )
    table = datasets.Dataset.from_dict(
        {"x": rng.normal(size=(rows, 64)).astype(np.float32), "y": rng.integers(0, 10, rows)},
        features=features,
    )
    columns = huggingface(table, columns={"inputs": "x", "labels": "y"}, batch=64)
    corpus = work / "stdlib.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"text": path.read_text(errors="replace")}) + "\n"
            for path in stdlib_files(2.0)
        )
    )
    windows = huggingface(corpus, text_column="text", seq_len=32, batch=32, cache_dir=work)
    column_rate = _rate(lambda step: columns.train.batch_at(step, Partition()), steps)
    window_rate = _rate(lambda step: windows.train.batch_at(step, Partition()), steps)
    base = builtin("tiny_lm")
    lm_steps = _steps_per_second(
        base, base.data.build(batch_size=32, seed=0), 60 if args.quick else 300
    )
    print(
        f"\nhf: datasets {datasets.__version__}, {rows} rows; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(f"{'side':58} {'batches/s':>10} {'ratio':>9}")
    _loader_rows(
        "huggingface columns (64 x 64 floats + a label)", column_rate, lm_steps, "tiny_lm steps/s"
    )
    _loader_rows(
        "huggingface text_column windows (32 x 33 tokens)", window_rate, lm_steps, "tiny_lm steps/s"
    )


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {
    "tokenize": tokenize,
    "images": images,
    "hf": hf,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--part", action="append", choices=sorted(PARTS), help="a part to run (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: small inputs, 2 rounds")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per side")
    parser.add_argument("--megabytes", type=float, default=8.0, help="tokenize: corpus size")
    parser.add_argument("--vocab-size", type=int, default=8192, help="tokenize: BPE vocabulary")
    parser.add_argument("--tokenizer", help="tokenize: a tokenizer.json to use instead")
    parser.add_argument("--images", type=int, default=5000, help="images: the folder's images")
    parser.add_argument("--rows", type=int, default=100_000, help="hf: the dataset's rows")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}, {sys.platform}")
    for name in args.part or list(PARTS):
        PARTS[name](args)


if __name__ == "__main__":
    main()
