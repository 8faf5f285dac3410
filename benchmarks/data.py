"""Data loading: the loader's batch rate against the trainer's step rate, resume latency without
replay against replay, and the measurements behind the epoch order (decision 0034).

Targets (issue 25, item 7), each a ratio measured side by side in one run:

- `loader`: the loader's batches per second at least 10x the trainer's steps per second for
  `tiny_lm` (the loader never the bottleneck). The loader side reads
  `data.train.batch_at(step, partition)` for consecutive steps, as `Trainer.fit` does, on
  `tiny_lm`'s own data (`token_windows`' synthetic Markov chain, 8,191 windows of 33 tokens,
  batch 32) and on `dew.data.tokens` over memory-mapped token files written for the run (the
  same 262,144 tokens as a `.npy`, and 64M uint16 tokens as a raw `.bin`, 128 MiB); each side is
  timed after one warm-up batch, over whole epochs' worth of steps where that is short. The
  trainer side is `Trainer.fit` on `tiny_lm`'s configuration (model, objective, optimizer,
  batch 32, `log_every=50`), continued with `state=` after a warm-up fit (compilation excluded).
- `resume`: the time a fit resumed at step `s` takes to produce its first batch, for `s` in
  10, 1,000, 100,000: a step-indexed source reads batch `s` directly (its epoch permutation
  computed afresh: the permutation cache is cleared first), while an iterator of the same
  batches (today's fallback, `Dataset(train=callable)`) is replayed: its first `s` batches
  drawn and discarded, as `Trainer.fit` does. Target: under 1 s at step 100,000, and flat in
  the step. Then the whole resume through `Trainer.fit` (a checkpoint at step `s` restored by
  orbax, one step trained, compilation warm) for both sources.
- `tokenize`: building dew's token cache for a corpus runs at >= 0.8x the MB/s of the
  `tokenizers` library's own `encode_batch` on the same files. The corpus is the Python
  standard library's own sources (`sysconfig.get_paths()["stdlib"]`, `**/*.py` in sorted
  order, as many files as fit in `--megabytes`, 8 by default; present on every machine, and
  nobody here wrote it), and a byte-level BPE `tokenizer.json` of `--vocab-size` (8192) IDs
  trained on it with `dew.data.tokenizers.train_tokenizer` before any timing (or
  `--tokenizer PATH`). Each
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
- `order`: why the epoch order is NumPy's permutation and not Grain's `index_shuffle`
  (decision 0034): the cost of one batch of 32 through `index_shuffle` at several row counts
  against a lookup into NumPy's cached permutation, the cost of computing that permutation once
  an epoch, and Grain's own `MapDataset.range(65537).shuffle(seed=5)`, which is no
  permutation (one row never comes, another comes twice).
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

Run: `python benchmarks/data.py` (every part), `--part loader|resume|tokenize|images|hf|order`
(repeatable), `--quick` (fewer batches and steps, a 1 MB corpus and 2 rounds, fewer images and
rows). It asserts nothing and always exits 0; a part whose optional package (`tokenizers`,
Pillow, `datasets`) is missing is skipped.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.metadata
import os
import pathlib
import platform
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dew.config import builtin
from dew.config._recipe import build_objective
from dew.data import Dataset, Partition, tokens
from dew.data import _indexed as indexed
from dew.training import Trainer

RESUME_STEPS = (10, 1_000, 100_000)
TOKENIZE_TARGET = 0.8  # dew's cache build / tokenizers' encode_batch, MB/s


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def header(args: argparse.Namespace) -> None:
    versions = ", ".join(
        f"{package} {_version(package)}" for package in ("dew-ml", "jax", "numpy", "grain")
    )
    print("Data loading: loader rate vs trainer step rate, resume latency, the epoch order")
    print(f"python {platform.python_version()}, {versions}")
    print(
        f"cpu cores {os.cpu_count()}, jax devices {jax.devices()}, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, mode {'quick' if args.quick else 'full'}"
    )
    print()


def _rate(call: Callable[[int], Any], count: int) -> float:
    """Calls per second of `call(0) ... call(count - 1)` after one warm-up call."""
    call(0)
    started = time.perf_counter()
    for index in range(count):
        call(index)
    return count / (time.perf_counter() - started)


def _tiny_lm() -> tuple[Any, Dataset]:
    config = builtin("tiny_lm")
    data = config.data.build(batch_size=config.trainer.batch_size, seed=config.trainer.seed)
    return config, data


def _trainer_rate(config: Any, data: Dataset, steps: int) -> float:
    """`tiny_lm`'s optimizer steps per second through `Trainer.fit` (compilation excluded)."""
    key = jax.random.key(config.trainer.seed)
    objective = build_objective(config, None, key)
    trainer = Trainer(objective, config.optim.build(10 * steps), key=key)
    log_every = config.trainer.log_every
    state = trainer.fit(data, log_every, log_every=log_every, progress=False)
    started = time.perf_counter()
    state = trainer.fit(data, log_every + steps, log_every=log_every, state=state, progress=False)
    jax.block_until_ready(state.params)
    return steps / (time.perf_counter() - started)


def loader(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="dew-data-bench-") as folder:
        _loader(args, pathlib.Path(folder))


def _loader(args: argparse.Namespace, folder: pathlib.Path) -> None:
    config, data = _tiny_lm()
    batches = 500 if args.quick else 5000
    partition = Partition()
    stream = np.asarray(data.train.rows.tokens)
    np.save(folder / "tiny_lm.npy", stream)
    big = np.random.default_rng(0).integers(0, 16, 1 << 26, dtype=np.uint16)
    big.tofile(folder / "big.bin")
    seq_len, batch = 32, config.trainer.batch_size
    sources = {
        "tiny_lm data (token_windows, in memory)": data.train,
        "tokens: the same tokens as a .npy": tokens(
            folder / "tiny_lm.npy", seq_len=seq_len, batch=batch, val_fraction=0.02
        ).train,
        "tokens: 64M uint16 tokens as a raw .bin": tokens(
            folder / "big.bin", dtype="uint16", seq_len=seq_len, batch=batch
        ).train,
    }
    rates = {
        name: _rate(lambda step, s=s: s.batch_at(step, partition), batches)
        for name, s in sources.items()
    }
    steps = 30 if args.quick else 200
    trainer = _trainer_rate(config, data, steps)
    print(
        f"loader: batches per second vs tiny_lm's Trainer.fit steps per second ({batches} "
        f"batches of {batch}, {steps} steps)"
    )
    print(f"  trainer: {trainer:10.1f} steps/s  ({1e3 / trainer:.2f} ms a step)")
    for name, rate in rates.items():
        ratio = rate / trainer
        print(
            f"  {name}: {rate:10.1f} batches/s  ({1e3 / rate:.3f} ms a batch)  "
            f"{ratio:8.1f}x the step rate  (target >= 10x: {'met' if ratio >= 10 else 'NOT met'})"
        )
    print()


def _replayed(train: Any, partition: Partition, step: int) -> Any:
    """The first batch of an iterator resumed at `step`: `step` batches drawn and discarded."""
    batches = iter(train(partition))
    for _ in range(step):
        next(batches)
    return next(batches)


def resume(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="dew-data-bench-") as folder:
        _resume(args, pathlib.Path(folder))


def _resume(args: argparse.Namespace, folder: pathlib.Path) -> None:
    from dew.checkpoints import Checkpointer
    from dew.steps import TrainState

    config, data = _tiny_lm()
    partition = Partition()
    # The fallback: the same batches as an iterator (Dataset(train=callable)), replayed.
    iterator = Dataset(train=lambda p: data.train(p), batch=data.batch)
    print("resume: time to the first batch of a fit resumed at step s")
    print(f"  {'step':>8}  {'read by step':>14}  {'replayed':>12}  ratio")
    steps = RESUME_STEPS[:2] if args.quick else RESUME_STEPS
    for step in steps:
        indexed._permutation.cache_clear()
        started = time.perf_counter()
        data.train.batch_at(step, partition)
        direct = time.perf_counter() - started
        started = time.perf_counter()
        _replayed(iterator.train, partition, step)
        replay = time.perf_counter() - started
        print(
            f"  {step:>8}  {direct * 1e3:11.3f} ms  {replay * 1e3:9.1f} ms  {replay / direct:8.1f}x"
        )
    print("  target: read by step under 1 s at step 100,000 and flat in the step")
    key = jax.random.key(0)
    objective = build_objective(config, None, key)
    optimizer = config.optim.build(200_000)
    start = TrainState.create(objective, optimizer, key=key)
    print("  whole resume through Trainer.fit (orbax restore, one step, the final save;")
    print("  compilation warm: a resume at step 5 first, excluded):")
    for step in (5, *steps):
        timings = []
        for name, source in (("read by step", data), ("replayed", iterator)):
            directory = folder / f"resume-{name.replace(' ', '-')}-{step}"
            state = eqx.tree_at(lambda s: s.step, start, jnp.asarray(step, jnp.int32))
            with Checkpointer(directory) as checkpoints:
                checkpoints.save(step, state, {"data_start": 0})
            indexed._permutation.cache_clear()
            trainer = Trainer(objective, optimizer, key=key, checkpoint_dir=directory)
            started = time.perf_counter()
            trainer.fit(source, step + 1, log_every=1, progress=False)
            timings.append(time.perf_counter() - started)
        if step == 5:
            continue
        print(
            f"  {step:>8}  {timings[0]:11.3f} s   {timings[1]:9.3f} s  "
            f"{timings[1] / timings[0]:8.1f}x"
        )
    print()


def order(args: argparse.Namespace) -> None:
    try:
        import grain
        from grain.experimental import index_shuffle
    except ImportError:
        print("order: skipped, Grain is not installed (pip install 'dew-ml[grain]')\n")
        return

    batch, repeats = 32, 20 if args.quick else 100
    print("order: one batch of 32 rows' positions in an epoch's permutation")
    print(f"  {'rows':>11}  {'index_shuffle':>14}  {'numpy lookup':>13}  {'numpy epoch':>12}")
    for count in (300, 8_191, 65_536, 1_000_000, 10_000_000):
        positions = np.arange(batch, dtype=np.int64) + min(count - batch, 12_345)
        started = time.perf_counter()
        for _ in range(repeats):
            [index_shuffle(int(p), count - 1, 7, 4) for p in positions.tolist()]
        grain_ms = (time.perf_counter() - started) / repeats * 1e3
        indexed._permutation.cache_clear()
        started = time.perf_counter()
        indexed.epoch_positions("f", 0, count, positions)
        epoch_ms = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        for _ in range(repeats):
            indexed.epoch_positions("f", 0, count, positions)
        lookup_ms = (time.perf_counter() - started) / repeats * 1e3
        print(f"  {count:>11,}  {grain_ms:11.3f} ms  {lookup_ms:10.4f} ms  {epoch_ms:9.1f} ms")
    shuffled = grain.MapDataset.range(65_537).shuffle(seed=5)
    drawn = [shuffled[index] for index in range(len(shuffled))]
    missing = sorted(set(range(65_537)) - set(drawn))
    twice = sorted(row for row, times in collections.Counter(drawn).items() if times > 1)
    print(
        f"  grain.MapDataset.range(65537).shuffle(seed=5): {len(set(drawn))} distinct rows of "
        f"65537; never drawn {missing}, drawn twice {twice}"
    )
    print()


def stdlib_files(megabytes: float) -> list[pathlib.Path]:
    """The standard library's `**/*.py` files in sorted order, as many as fit in `megabytes`,
    leaving out the few that are not UTF-8 (the test suite's `encoded_modules`, written in
    Latin-1 on purpose: a text tokenizer refuses them)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or not path.is_file():
            continue
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
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
    "loader": loader,
    "resume": resume,
    "tokenize": tokenize,
    "images": images,
    "hf": hf,
    "order": order,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--part", action="append", choices=sorted(PARTS), help="a part to run (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer batches and steps")
    parser.add_argument("--rounds", type=int, default=7, help="tokenize: timed rounds per side")
    parser.add_argument("--megabytes", type=float, default=8.0, help="tokenize: corpus size")
    parser.add_argument("--vocab-size", type=int, default=8192, help="tokenize: BPE vocabulary")
    parser.add_argument("--tokenizer", help="tokenize: a tokenizer.json to use instead")
    parser.add_argument("--images", type=int, default=5000, help="images: the folder's images")
    parser.add_argument("--rows", type=int, default=100_000, help="hf: the dataset's rows")
    args = parser.parse_args()
    header(args)
    for name in args.part or list(PARTS):
        PARTS[name](args)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
