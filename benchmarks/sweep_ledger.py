"""Per-trial cost of a sweep's ledger as the sweep grows, against bare Optuna and an fsync floor.

A sweep's ledger at N trials: what does trial N + 1 cost? Each size N in 10, 100, 1,000, 10,000
starts from a ledger (and, for Optuna, a study) already holding N finished trials, then times
`--timed` more trials; the per-trial cost is the median time (wall and CPU) between two
consecutive timed trials' objective calls, so opening the ledger (reading its N entries once) is
not part of it. This script asserts nothing and always exits 0.

Sides, each on the disk given (`--disk`, repeatable: a tmpfs such as /dev/shm and a real disk):

- `ledger alone`: the ledger path of a trial without a search or training: under the ledger's
  lock, load and record the trial as running; then load and record it as finished (dew's
  `_Ledger`, whichever dew is imported: main's rewrites the whole file twice per trial).
- `floor: 2 fsynced appends`: `os.write` of the same two lines to a file and `fdatasync`
  after each: the least two durable events per trial can cost.
- `dew sweep + optuna TPE`: `dew.config.sweep.sweep(..., search=optuna_search(sampler=
  TPESampler(seed)))` with its in-memory study (dew's default) and a trivial objective.
- `bare optuna TPE, in memory`: `study.optimize` with the same sampler and seed and the same
  N trials added first (`study.add_trials`): no durability at all.
- `bare optuna TPE, journal`: the same with `JournalStorage(JournalFileBackend(<disk>/...))`,
  Optuna's own durable file storage on the same disk (it fsyncs each append).
- `dew sweep + random_search`: the sweep's loop with dew's own search (sampling nearly free).

The ledgers start as version-1 files (one JSON object: what dew wrote before decision 0045, read
by both versions of dew); the current dew converts one when it opens it, before the timed trials.
Run the script twice for before and after: `PYTHONPATH=/work/main/src python benchmarks/
sweep_ledger.py` (main's code), then with the branch's `src`. Within one run the sides alternate
order round by round; when the load average is above 2 the process is pinned to one core.

Run: `python benchmarks/sweep_ledger.py --disk /dev/shm --disk /work/tmp` (full: sizes 10 to
10,000, 3 rounds), `--quick` (sizes 10 and 100, 1 round, TPE sides skipped above 100),
`--sizes`, `--rounds`, `--timed`, `--no-tpe`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import itertools
import json
import logging
import math
import os
import pathlib
import platform
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable

LOW, HIGH, TARGET = 1e-4, 1e-1, 0.003
PATH = "optim.learning_rate"
SEED = 20261204


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "n/a"


def history(size: int) -> list[tuple[float, float]]:
    """`size` finished trials: log-uniform points and their scores."""
    rng = random.Random(SEED)
    points = [math.exp(rng.uniform(math.log(LOW), math.log(HIGH))) for _ in range(size)]
    return [(point, (point - TARGET) ** 2) for point in points]


class Bench:
    def __init__(self, folder: pathlib.Path, timed: int) -> None:
        import optuna

        from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
        from dew.config.sweep import Uniform
        from dew.config.sweep._space import _normalize_space, _space_json
        from dew.telemetry.records import encode_json_value

        self.optuna, self.folder, self.timed = optuna, folder, timed
        self.config = RunConfig(
            ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name="ledger-bench")
        )
        self.space = {PATH: Uniform(LOW, HIGH, log=True)}
        self.fields = _normalize_space(self.space)
        self.space_json = _space_json(self.fields)
        self.config_json = json.loads(json.dumps(encode_json_value(self.config.to_dict())))
        self.distributions = {PATH: optuna.distributions.FloatDistribution(LOW, HIGH, log=True)}
        self.points: dict[tuple[str, int], list[float]] = {}
        shm = pathlib.Path("/dev/shm")  # where writing the prefilled journals costs no fsyncs
        self.journals = pathlib.Path(tempfile.mkdtemp(dir=shm if shm.is_dir() else folder))

    def old_ledger(self, size: int, search: str) -> pathlib.Path:
        """A version-1 ledger holding `size` finished trials of `history(size)`."""
        trials = [
            {"index": index, "overrides": {PATH: point}, "value": value}
            for index, (point, value) in enumerate(history(size))
        ]
        data = {
            "version": 1,
            "space": self.space_json,
            "search": search,
            "config": self.config_json,
            "direction": "minimize",
            "budget": max(size, 1),
            "trials": trials,
            "running": [],
        }
        path = self.folder / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(data))
        return path

    def frozen(self, size: int) -> list:
        return [
            self.optuna.trial.create_trial(
                params={PATH: point}, distributions=self.distributions, value=value
            )
            for point, value in history(size)
        ]

    def prefilled_journal(self, size: int) -> pathlib.Path:
        """An Optuna journal file of study "bench" holding `size` finished trials."""
        path = self.journals / f"{size}.log"
        if not path.exists():
            optuna = self.optuna
            backend = optuna.storages.journal.JournalFileBackend(str(path))
            study = optuna.create_study(
                study_name="bench", storage=optuna.storages.JournalStorage(backend)
            )
            study.add_trials(self.frozen(size))
        return path

    # -- the sides: each returns the objective's call times of its timed trials -------------

    def ledger_alone(self, size: int) -> list[float]:
        from dew.config.sweep._search import Trial

        try:  # this branch: the file's class, events appended
            from dew.config.sweep._ledger_file import _Ledger
        except ImportError:  # main: the ledger rewritten whole
            from dew.config.sweep._ledger import _Ledger
        path = self.old_ledger(size, "random(seed=0)")
        book = _Ledger(path, self.fields, "random(seed=0)", self.config.to_dict(), "minimize")
        book.trials = size + self.timed
        times = []
        rng = random.Random(size)
        with book:
            with book.locked():
                book.load()
                if hasattr(book, "begin"):
                    book.begin()
            for index in range(size, size + self.timed):
                times.append(now())
                point = {PATH: math.exp(rng.uniform(math.log(LOW), math.log(HIGH)))}
                with book.locked():
                    state = book.load()
                    book.claim(index)
                    if hasattr(book, "start"):
                        book.start(index, point)
                    else:
                        state.running[index] = point
                        book.store(state)
                trial = Trial(index, point, (point[PATH] - TARGET) ** 2)
                with book.locked():
                    state = book.load()
                    if hasattr(book, "finish"):
                        book.finish(trial)
                    else:
                        state.running.pop(index, None)
                        state.finished[index] = trial
                        book.store(state)
                book.release(index)
        path.unlink()
        return times

    def floor(self, size: int) -> list[float]:
        path = self.folder / f"{uuid.uuid4().hex}.jsonl"
        entry = {"index": 0, "overrides": {PATH: 0.001234567890123}}
        running = (json.dumps({"running": entry}) + "\n").encode()
        finished = (json.dumps({"finished": {**entry, "value": 1.5e-6}}) + "\n").encode()
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.write(descriptor, b"x" * 200 * size)  # the same bytes as `size` trials' lines
        os.fsync(descriptor)
        times = []
        try:
            for _ in range(self.timed):
                times.append(now())
                os.write(descriptor, running)
                os.fdatasync(descriptor)
                os.write(descriptor, finished)
                os.fdatasync(descriptor)
        finally:
            os.close(descriptor)
            path.unlink()
        return times

    def dew_sweep(self, search_name: str) -> Callable[[int], list[float]]:
        from dew.config.sweep import optuna_search, random_search, sweep

        def run(size: int) -> list[float]:
            if search_name == "tpe":
                search = optuna_search(sampler=self.optuna.samplers.TPESampler(seed=SEED))
                name = "optuna"
            else:
                search, name = random_search(seed=SEED), f"random(seed={SEED})"
            ledger = self.old_ledger(size, name)
            times = []

            def train(run_config):
                times.append(now())
                return (run_config.optim.learning_rate - TARGET) ** 2

            done = sweep(
                self.config,
                self.space,
                train=train,
                trials=size + self.timed,
                ledger=ledger,
                search=search,
            )
            self.points[("dew " + search_name, size)] = [t.overrides[PATH] for t in done[size:]]
            ledger.unlink()
            return times

        return run

    def bare(self, journal: bool) -> Callable[[int], list[float]]:
        optuna = self.optuna

        def run(size: int) -> list[float]:
            sampler = optuna.samplers.TPESampler(seed=SEED)
            if journal:  # the N trials' journal is written once (fsyncs off the clock), copied
                journal_path = self.folder / f"{uuid.uuid4().hex}.log"
                shutil.copyfile(self.prefilled_journal(size), journal_path)
                backend = optuna.storages.journal.JournalFileBackend(str(journal_path))
                storage = optuna.storages.JournalStorage(backend)
                study = optuna.load_study(study_name="bench", storage=storage, sampler=sampler)
            else:
                study = optuna.create_study(sampler=sampler)
                study.add_trials(self.frozen(size))
            times, points = [], []

            def objective(trial):
                times.append(now())
                rate = trial.suggest_float(PATH, LOW, HIGH, log=True)
                points.append(rate)
                return (rate - TARGET) ** 2

            study.optimize(objective, n_trials=self.timed)
            self.points[("bare journal" if journal else "bare memory", size)] = points
            if journal:
                with contextlib.suppress(OSError):
                    journal_path.unlink()
                    pathlib.Path(str(journal_path) + ".lock").unlink()
            return times

        return run


def now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def per_trial(times: list[tuple[float, float]]) -> tuple[float, float]:
    """The median wall and CPU time between consecutive timed trials (a shared machine's
    stalls are outliers of a few intervals, not of the median)."""
    pairs = list(itertools.pairwise(times))
    wall = statistics.median(later[0] - earlier[0] for earlier, later in pairs)
    cpu = statistics.median(later[1] - earlier[1] for earlier, later in pairs)
    return wall, cpu


def measure(bench: Bench, sizes: list[int], rounds: int, tpe_limit: int) -> dict:
    sides: list[tuple[str, Callable[[int], list[float]], bool]] = [
        ("ledger alone", bench.ledger_alone, False),
        ("floor: 2 fsynced appends", bench.floor, False),
        ("dew sweep + random_search", bench.dew_sweep("random"), False),
        ("dew sweep + optuna TPE", bench.dew_sweep("tpe"), True),
        ("bare optuna TPE, in memory", bench.bare(journal=False), True),
        ("bare optuna TPE, journal", bench.bare(journal=True), True),
    ]
    results: dict[tuple[str, int], list[float]] = {}
    for size in sizes:
        active = [side for side in sides if not side[2] or size <= tpe_limit]
        for _, run, _ in active:  # warm-up, untimed
            run(min(size, 10))
        for round_ in range(rounds):
            for label, run, _ in active if round_ % 2 == 0 else list(reversed(active)):
                gc.collect()
                gc.disable()
                try:
                    wall, cpu = per_trial(run(size))
                    results.setdefault((label, size), []).append(wall)
                    results.setdefault((label + " [cpu]", size), []).append(cpu)
                finally:
                    gc.enable()
        print(f"  size {size} done (load {load_average()})", flush=True)
    return results


def show(disk: str, sizes: list[int], results: dict, points: dict) -> None:
    print(f"== ledgers on {disk} ==")
    labels = list(dict.fromkeys(label for label, _ in results))
    header = "".join(f"{f'N={size:,}':>22}" for size in sizes)
    print(f"{'ms per trial: median [min-max]':<30}{header}")
    medians = {}
    for label in labels:
        cells = []
        for size in sizes:
            values = results.get((label, size))
            if not values:
                cells.append(f"{'-':>22}")
                continue
            medians[label, size] = median = statistics.median(values) * 1e3
            spread = f"[{min(values) * 1e3:.2f}-{max(values) * 1e3:.2f}]"
            cells.append(f"{median:>9.2f} {spread:>12}")
        print(f"{label:<30}{''.join(cells)}")
    print()
    ratios = [
        ("ledger alone / floor", "ledger alone", "floor: 2 fsynced appends", None),
        ("dew TPE / bare TPE journal", "dew sweep + optuna TPE", "bare optuna TPE, journal", 1.5),
        ("dew TPE / bare TPE memory", "dew sweep + optuna TPE", "bare optuna TPE, in memory", 1.5),
        (
            "  the same, CPU: / journal",
            "dew sweep + optuna TPE [cpu]",
            "bare optuna TPE, journal [cpu]",
            1.5,
        ),
        (
            "  the same, CPU: / memory",
            "dew sweep + optuna TPE [cpu]",
            "bare optuna TPE, in memory [cpu]",
            1.5,
        ),
    ]
    for name, top, bottom, target in ratios:
        cells = []
        for size in sizes:
            if (top, size) in medians and (bottom, size) in medians:
                cells.append(f"{medians[top, size] / medians[bottom, size]:>21.2f}x")
            else:
                cells.append(f"{'-':>22}")
        note = "" if target is None else f"   target <= {target}x"
        print(f"{name:<30}{''.join(cells)}{note}")
    for label in (
        "ledger alone",
        "ledger alone [cpu]",
        "dew sweep + random_search",
        "dew sweep + random_search [cpu]",
    ):
        ends = [size for size in sizes if (label, size) in medians]
        if len(ends) >= 2:
            growth = medians[label, ends[-1]] / medians[label, ends[0]]
            verdict = "met" if growth <= 1.25 else "not met"
            print(
                f"{label}: N={ends[-1]:,} costs {growth:.2f}x N={ends[0]:,} per trial "
                f"(target: flat, <= 1.25x): {verdict}"
            )
    for size in sizes:
        dew, bare = points.get(("dew tpe", size)), points.get(("bare memory", size))
        if dew is not None and bare is not None:
            same = "yes" if dew == bare else "NO"
            print(f"N={size:,}: dew and bare Optuna TPE drew the same points: {same}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--disk", action="append", help="folder for ledgers (repeatable)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timed", type=int, default=12, help="timed trials per size")
    parser.add_argument("--tpe-limit", type=int, default=10000, help="largest N for TPE sides")
    parser.add_argument("--quick", action="store_true", help="smoke run: N 10 and 100, 1 round")
    parser.add_argument("--core", type=int, default=1, help="the core to pin to under load")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds, args.timed = [10, 100], 1, 6
    try:
        import optuna
    except ImportError:
        print('optuna is not installed (pip install "dew-ml[hpo]"): skipped.')
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    import dew

    pinned = ""
    if os.getloadavg()[0] > 2 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(args.core, os.cpu_count() - 1)})
        pinned = " (load above 2: pinned to one core)"
    began = time.perf_counter()
    print("sweep ledger: per-trial cost at N trials, dew vs bare Optuna and an fsync floor")
    print(
        f"python {platform.python_version()}, optuna {version('optuna')}, dew from "
        f"{pathlib.Path(dew.__file__).parent}"
    )
    print(f"{os.cpu_count()} cores; load avg at start: {load_average()}{pinned}")
    print(f"sizes {args.sizes}, {args.timed} timed trials each, {args.rounds} rounds (+ warm-up)")
    print()
    for disk in args.disk or [tempfile.gettempdir()]:
        folder = pathlib.Path(disk) / f"dew-ledger-bench-{uuid.uuid4().hex[:8]}"
        folder.mkdir(parents=True)
        try:
            bench = Bench(folder, args.timed)
            results = measure(bench, args.sizes, args.rounds, args.tpe_limit)
            show(disk, args.sizes, results, bench.points)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(bench.journals, ignore_errors=True)
    print(
        "ms per trial: the median time between consecutive timed trials' objective calls,\n"
        "median [min-max] of the rounds; '[cpu]' rows: the process's CPU time (no waits on\n"
        "fsync, no time the shared core ran other processes). 'journal': Optuna's\n"
        "JournalStorage(JournalFileBackend) on the same disk; 'in memory': no durability.\n"
        "TPE's own cost grows with N on every side: the ratio is what counts."
    )
    print(f"load avg at the end: {load_average()}; wall time {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
