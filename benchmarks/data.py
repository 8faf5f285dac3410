"""dew's data path against its peers, each part a ratio measured side by side in one run.

Design targets (issue 25, item 7; DESIGN.md "Performance targets"):

- `tokenize`: building dew's token cache for a corpus runs at >= 0.8x the MB/s of the
  `tokenizers` library's own `encode_batch` on the same files.

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

Run: `python benchmarks/data.py` (all parts), `--part tokenize`, `--quick` (a 1 MB corpus, 2
rounds). The benchmark asserts nothing and always exits 0; `tokenizers` missing skips the part.
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


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {"tokenize": tokenize}


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
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}, {sys.platform}")
    for name in args.part or list(PARTS):
        PARTS[name](args)


if __name__ == "__main__":
    main()
