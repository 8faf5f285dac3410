"""Per-trial cost of N `dew.config.sweep` workers on one Optuna RDB storage vs N bare Optuna ones.

Issue 30, item 5. Both sides minimise the trivial objective of `sweep_overhead.py`,
`(lr - 0.003) ** 2` with `lr` log-uniform in `[1e-4, 1e-1]`, so a trial costs only the sampler,
the storage and whatever the loop around them adds. This script asserts nothing and always
exits 0.

A group is one side running T trials in total with N worker processes (N in 1, 2, 4) on one
fresh storage:

- `bare`: each worker runs `optuna.load_study(storage=URL, sampler=S(seed=SEED + worker))`
  and `study.optimize(objective, n_trials=...)`, the T trials split evenly between the
  workers (Optuna's own recipe for several workers).
- `dew`: each worker runs `sweep(config, space, train=..., trials=T, ledger=<one path>,
  search=optuna_search(storage=URL, study_name=..., sampler=S(seed=SEED + worker)))`, the
  Python API of `dew sweep --workers N` (decision 0054): one ledger path and one storage
  shared by all, the budget T shared through the storage.

Storages: `sqlite`, one SQLite file per group on the disk given (`--dir`, default /work/tmp
when it exists); `postgresql`, a server this script starts with `tests/_postgres.py`'s
`PostgresServer` (Debian's `postgresql` package; the module needs no pytest) with its data on
the same disk and PostgreSQL's default `fsync=on`, one fresh database per group. The study is
created before the clock starts (table creation is a one-off), the ledgers lie beside the
SQLite files. Samplers: `TPESampler` (Optuna's default) and `RandomSampler` (cheap sampling, so
the loop's and storage's costs show).

Timing: the workers are a pool of 4 processes started once (their imports are not timed). For
each group the parent hands the first N workers their job; each builds its sampler and says
ready; the parent then says go to all and reads `time.perf_counter` from go to the last
worker's answer (wall), each worker its own `time.process_time` over the same stretch (CPU,
summed over the workers; the PostgreSQL server's own processes are not counted, on both
sides). Garbage collection is paused in the workers while they run. Per group: wall ms per
trial (wall / T) and CPU ms per trial (summed CPU / T). One untimed warm-up group per side and
storage, then `--rounds` rounds; within a round every (T, N) cell runs both sides, the order
of the sides reversed every round. When the load average is above 2 the script (its workers
and the PostgreSQL server with them) is pinned to one core (`--core`), as the other sweep
benchmarks are: the workers then share that core, so N > 1 shows contention, not speed-up,
and the ratios are the figures that count. Each group is checked afterwards (printed, not
asserted): T complete trials in the study, and for dew T finished trials in the ledger.

Run: `python benchmarks/sweep_workers.py` (full: T in 50, 200, 800, 3 rounds, both storages,
both samplers: long on a loaded machine), `--quick` (T in 20, 40, 1 round, TPE), `--sizes`,
`--workers`, `--rounds`, `--storage sqlite|postgresql` and `--sampler` (repeatable).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import logging
import multiprocessing
import os
import pathlib
import platform
import statistics
import sys
import time
import uuid
from typing import Any

LOW, HIGH, TARGET = 1e-4, 1e-1, 0.003
PATH = "optim.learning_rate"
SEED = 20261210
STUDY = "bench"
ROOT = pathlib.Path(__file__).resolve().parent.parent


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


# -- the worker processes ---------------------------------------------------------------------


def _quiet() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    return optuna


def _bare(optuna: Any, job: dict) -> Any:
    sampler = getattr(optuna.samplers, job["sampler"])(seed=job["seed"])
    count = [0]

    def objective(trial: Any) -> float:
        count[0] += 1
        return (trial.suggest_float(PATH, LOW, HIGH, log=True) - TARGET) ** 2

    def run() -> int:
        storage = optuna.storages.RDBStorage(job["url"])  # what load_study would build
        study = optuna.load_study(study_name=STUDY, storage=storage, sampler=sampler)
        study.optimize(objective, n_trials=job["trials"])
        storage.engine.dispose()
        return count[0]

    return run


def _dew(optuna: Any, job: dict) -> Any:
    from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
    from dew.config.sweep import Uniform, optuna_search, sweep

    sampler = getattr(optuna.samplers, job["sampler"])(seed=job["seed"])
    config = RunConfig(ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name="workers"))
    space = {PATH: Uniform(LOW, HIGH, log=True)}
    search = optuna_search(storage=job["url"], study_name=STUDY, sampler=sampler)
    count = [0]

    def train(run_config: Any) -> float:
        count[0] += 1
        return (run_config.optim.learning_rate - TARGET) ** 2

    def run() -> int:
        sweep(config, space, train=train, trials=job["trials"], ledger=job["ledger"], search=search)
        return count[0]

    return run


def worker(connection: Any) -> None:
    """Answer jobs until told None: prepare, say ready, wait for go, run, report."""
    optuna = _quiet()
    import dew.config.sweep  # noqa: F401  (imported before any clock runs)

    while (job := connection.recv()) is not None:
        run = (_dew if job["side"] == "dew" else _bare)(optuna, job)
        connection.send("ready")
        connection.recv()  # go
        gc.collect()
        gc.disable()
        try:
            cpu = time.process_time()
            try:
                done, error = run(), None
            except Exception as failure:  # reported, not raised: the benchmark goes on
                done, error = 0, f"{type(failure).__name__}: {failure}"
            cpu = time.process_time() - cpu
        finally:
            gc.enable()
        connection.send({"cpu": cpu, "trials": done, "error": error})
        del run
        gc.collect()  # the group's storage engine and its connections go


class Pool:
    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.connections, self.processes = [], []
        for _ in range(size):
            parent, child = context.Pipe()
            process = context.Process(target=worker, args=(child,), daemon=True)
            process.start()
            self.connections.append(parent)
            self.processes.append(process)

    def group(self, jobs: list[dict]) -> tuple[float, float, int, list[str]]:
        """Run one job per worker together: (wall s, summed CPU s, trials run, errors)."""
        used = self.connections[: len(jobs)]
        for connection, job in zip(used, jobs, strict=True):
            connection.send(job)
        for connection in used:
            connection.recv()  # ready
        start = time.perf_counter()
        for connection in used:
            connection.send("go")
        answers = [connection.recv() for connection in used]
        wall = time.perf_counter() - start
        errors = [answer["error"] for answer in answers if answer["error"]]
        cpu = sum(answer["cpu"] for answer in answers)
        return wall, cpu, sum(answer["trials"] for answer in answers), errors

    def close(self) -> None:
        for connection in self.connections:
            with contextlib.suppress(OSError):
                connection.send(None)
        for process in self.processes:
            process.join(timeout=30)


# -- the storages -----------------------------------------------------------------------------


class Storages:
    """A fresh storage URL per group, its study created; the ledger path beside it."""

    def __init__(self, kind: str, folder: pathlib.Path, stack: contextlib.ExitStack) -> None:
        self.kind, self.folder, self.server = kind, folder, None
        if kind == "postgresql":
            sys.path.insert(0, str(ROOT / "tests"))
            from _postgres import PostgresServer, server_binaries

            binaries = server_binaries()
            if binaries is None:
                raise RuntimeError("no PostgreSQL server installed (apt-get install postgresql)")
            import psycopg  # noqa: F401  (the driver: pip install "dew-ml[postgres]")

            self.server = PostgresServer(binaries, parent=str(folder), fsync=True).start()
            stack.callback(self.server.remove)

    def fresh(self) -> tuple[str, str]:
        import optuna

        name = f"g{uuid.uuid4().hex[:12]}"
        if self.server is not None:
            url = self.server.create_database(name)
        else:
            url = f"sqlite:///{self.folder / name}.db"
        storage = optuna.storages.RDBStorage(url)
        optuna.create_study(study_name=STUDY, storage=storage)
        storage.engine.dispose()
        return url, str(self.folder / f"{name}.ledger.json")

    def check(self, url: str, ledger: str, side: str, trials: int) -> bool:
        import optuna

        storage = optuna.storages.RDBStorage(url)
        study = optuna.load_study(study_name=STUDY, storage=storage)
        states = [trial.state for trial in study.get_trials(deepcopy=False)]
        storage.engine.dispose()
        good = states.count(optuna.trial.TrialState.COMPLETE) == trials == len(states)
        if side == "dew":
            from dew.config.sweep._ledger import read_ledger

            good = good and sorted(read_ledger(ledger).state.finished) == list(range(trials))
        return good


def jobs_for(side: str, sampler: str, workers: int, trials: int, url: str, ledger: str):
    jobs = []
    for number in range(workers):
        share = trials if side == "dew" else trials // workers + (number < trials % workers)
        jobs.append(
            {
                "side": side,
                "sampler": sampler,
                "seed": SEED + number,
                "url": url,
                "ledger": ledger,
                "trials": share,
            }
        )
    return jobs


def measure(pool: Pool, storages: Storages, sampler: str, args: argparse.Namespace) -> dict:
    results: dict[tuple, list[tuple[float, float]]] = {}
    bad: list[str] = []

    def one(side: str, workers: int, trials: int) -> tuple[float, float]:
        url, ledger = storages.fresh()
        wall, cpu, _, errors = pool.group(jobs_for(side, sampler, workers, trials, url, ledger))
        if errors or not storages.check(url, ledger, side, trials):
            bad.append(f"{side} N={workers} T={trials}: {errors or 'trials missing'}")
        return wall / trials, cpu / trials

    for side in ("dew", "bare"):  # warm-up, untimed
        one(side, max(args.workers), 10)
    for round_ in range(args.rounds):
        sides = ("dew", "bare") if round_ % 2 == 0 else ("bare", "dew")
        for trials in args.sizes:
            for workers in args.workers:
                for side in sides:
                    results.setdefault((side, workers, trials), []).append(
                        one(side, workers, trials)
                    )
        print(f"  {storages.kind} {sampler} round {round_ + 1} done (load {load_average()})")
    checks = "every group complete" if not bad else "PROBLEMS: " + "; ".join(bad)
    print(f"  checks: {checks}", flush=True)
    return results


def show(title: str, results: dict, args: argparse.Namespace) -> None:
    print(f"== {title} ==")
    print(
        f"{'N':>2} {'T':>5} | {'bare wall':>17} {'dew wall':>17} | {'bare cpu':>8} "
        f"{'dew cpu':>8} | {'dew/bare wall':>13} {'paired':>7} {'cpu':>6}"
    )
    ratios: dict[tuple[int, int], float] = {}
    for workers in args.workers:
        for trials in args.sizes:
            bare, dew = results[("bare", workers, trials)], results[("dew", workers, trials)]

            def cell(pairs: list[tuple[float, float]]) -> str:
                walls = [wall * 1e3 for wall, _ in pairs]
                spread = f"[{min(walls):.1f}-{max(walls):.1f}]"
                return f"{statistics.median(walls):>6.2f} {spread:>10}"

            def cpu(pairs: list[tuple[float, float]]) -> float:
                return statistics.median(c for _, c in pairs) * 1e3

            wall_ratio = statistics.median(w for w, _ in dew) / statistics.median(
                w for w, _ in bare
            )
            paired = statistics.median(d[0] / b[0] for d, b in zip(dew, bare, strict=True))
            ratios[workers, trials] = wall_ratio
            print(
                f"{workers:>2} {trials:>5} | {cell(bare):>17} {cell(dew):>17} | "
                f"{cpu(bare):>8.2f} {cpu(dew):>8.2f} | {wall_ratio:>12.2f}x {paired:>6.2f}x "
                f"{cpu(dew) / cpu(bare):>5.2f}x"
            )
    over = [f"N={n} T={t} ({r:.2f}x)" for (n, t), r in ratios.items() if r > 1.5]
    verdict = "met" if not over else "not met at " + ", ".join(over)
    print(f"target dew/bare <= 1.5x per trial: {verdict}")
    for workers in args.workers:
        first, last = args.sizes[0], args.sizes[-1]
        print(
            f"N={workers}: dew/bare at T={last} over T={first}: "
            f"{ratios[workers, last] / ratios[workers, first]:.2f} (flat: about 1)"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 800])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", action="append", choices=("sqlite", "postgresql"))
    parser.add_argument("--sampler", action="append", choices=("TPESampler", "RandomSampler"))
    parser.add_argument("--dir", help="folder for storages and ledgers (default /work/tmp)")
    parser.add_argument("--core", type=int, default=1, help="the core to pin to under load")
    parser.add_argument("--no-pin", action="store_true", help="never pin, whatever the load")
    parser.add_argument("--quick", action="store_true", help="smoke run: T 20 and 40, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds, args.sampler = [20, 40], 1, args.sampler or ["TPESampler"]
    try:
        _quiet()
    except ImportError:
        print('optuna is not installed (pip install "dew-ml[hpo]"): skipped.')
        return
    import dew

    pinned = ""
    if not args.no_pin and os.getloadavg()[0] > 2 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(args.core, os.cpu_count() - 1)})
        pinned = " (load above 2: pinned to one core, workers and server included)"
    base = pathlib.Path(args.dir or ("/work/tmp" if pathlib.Path("/work/tmp").is_dir() else "."))
    began = time.perf_counter()
    print("sweep workers: N dew sweep workers vs N bare Optuna workers on one RDB storage")
    print(
        f"python {platform.python_version()}, optuna {version('optuna')}, sqlalchemy "
        f"{version('sqlalchemy')}, psycopg {version('psycopg')}, dew from "
        f"{pathlib.Path(dew.__file__).parent}"
    )
    print(f"{os.cpu_count()} cores; load avg at start: {load_average()}{pinned}")
    print(
        f"T (trials per group) {args.sizes}, N (workers) {args.workers}, {args.rounds} rounds "
        f"(+ warm-up); storages and ledgers under {base}"
    )
    print()
    pool = Pool(max(args.workers))
    try:
        for kind in args.storage or ["sqlite", "postgresql"]:
            with contextlib.ExitStack() as stack:
                folder = base / f"dew-workers-bench-{uuid.uuid4().hex[:8]}"
                folder.mkdir(parents=True)
                stack.callback(lambda folder=folder: __import__("shutil").rmtree(folder, True))
                try:
                    storages = Storages(kind, folder, stack)
                except (RuntimeError, ImportError) as error:
                    print(f"{kind}: skipped ({error})\n")
                    continue
                for sampler in args.sampler or ["TPESampler", "RandomSampler"]:
                    results = measure(pool, storages, sampler, args)
                    show(f"{kind}, {sampler}(seed={SEED} + worker)", results, args)
    finally:
        pool.close()
    print(
        "ms per trial: wall = the group's wall time / T, median [min-max] of the rounds; cpu =\n"
        "the workers' summed process CPU time / T (median; no database server, no waits).\n"
        "'paired' = median of the per-round ratios. > 1 means dew is slower."
    )
    print(f"load avg at the end: {load_average()}; wall time {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
