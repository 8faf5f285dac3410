"""Per-trial overhead of `dew.config.sweep` with `optuna_search` against a bare Optuna loop.

Both sides minimise the same trivial objective, `(lr - 0.003) ** 2` with `lr` log-uniform in
`[1e-4, 1e-1]`, on an in-memory study with the same sampler class and seed, so the time per
trial is Optuna's sampling plus whatever the loop around it adds. This script measures the
ratio side by side in one run; it asserts nothing and always exits 0.

Sides, per round of N trials (each round starts from nothing, so the sampler sees the same
growing history on both sides):

- `bare study.optimize`: `optuna.create_study(sampler=S(seed=...))`, then
  `study.optimize(objective, n_trials=N)` where `objective(trial)` calls
  `trial.suggest_float("optim.learning_rate", 1e-4, 1e-1, log=True)`.
- `dew sweep + optuna_search`: `sweep(config, {"optim.learning_rate": Uniform(1e-4, 1e-1,
  log=True)}, train=..., trials=N, ledger=<fresh path>, search=optuna_search(sampler=S(seed=
  ...)))` where `train(run)` reads `run.optim.learning_rate`. Per trial dew adds: two
  `override` calls' worth of `RunConfig.to_dict`/`from_dict` (the point, then the trial's
  name), two ledger events under the ledger lock (the trial as running, then as finished: read what
  was appended since, append one JSON line, fdatasync; decision 0045), a trial-number lock,
  and the study size check before each ask. No tracker. (`sweep_ledger.py` shows how this
  cost grows with the ledger.)
- `dew sweep + random_search` (reference, no Optuna): the same sweep with dew's own random
  search, i.e. the loop's cost with sampling nearly free.

Both Optuna sides draw the same points (checked and printed: same sampler, same seed, same
calls). Groups: `RandomSampler` (sampling is cheap, so the loop's own cost shows) and
`TPESampler` (Optuna's default; its cost grows with the history).

Timing: one untimed warm-up round per side, then `--rounds` rounds; within a round each side
runs its N trials under one `time.perf_counter` interval (process CPU time read alongside),
garbage collection paused and run before each interval; the order of the sides reverses
every round. The table shows per side the median and best round's ms per trial and the
median CPU ms per trial, and dew / bare as the ratio of the medians, the median of the
per-round paired ratios, and the ratio of CPU medians, plus dew's added ms per trial.

Run: `python benchmarks/sweep_overhead.py` (full: 200 trials x 7 rounds per side, about a
minute on 2 cores), `--quick` (20 trials, 1 round), `--trials N`, `--rounds R`, `--ledger-dir
DIR` (where the ledgers go; default a temporary folder: put it on the disk you sweep on, since
the fsyncs are part of the cost).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import logging
import os
import pathlib
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

LOW, HIGH, TARGET = 1e-4, 1e-1, 0.003
PATH = "optim.learning_rate"
SEED = 20261130


@dataclass
class Side:
    label: str
    run: Callable[[int], list[float]]  # trials -> the points drawn, in trial order
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    points: list[float] = field(default_factory=list)

    def time(self, trials: int) -> None:
        gc.collect()
        gc.disable()
        try:
            cpu = time.process_time()
            start = time.perf_counter()
            points = self.run(trials)
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
        finally:
            gc.enable()
        self.wall.append(elapsed / trials)
        self.cpu.append(cpu / trials)
        self.points = points


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "n/a"


def sides_for(sampler_name: str, folder: pathlib.Path) -> list[Side]:
    import optuna

    from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
    from dew.config.sweep import Uniform, optuna_search, random_search, sweep

    sampler_class = getattr(optuna.samplers, sampler_name)
    config = RunConfig(
        ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name="overhead")
    )
    space = {PATH: Uniform(LOW, HIGH, log=True)}

    def bare(trials: int) -> list[float]:
        study = optuna.create_study(sampler=sampler_class(seed=SEED))
        points: list[float] = []

        def objective(trial: optuna.Trial) -> float:
            rate = trial.suggest_float(PATH, LOW, HIGH, log=True)
            points.append(rate)
            return (rate - TARGET) ** 2

        study.optimize(objective, n_trials=trials)
        return points

    def dew_sweep(search_for: Callable[[], object]) -> Callable[[int], list[float]]:
        def run(trials: int) -> list[float]:
            ledger = folder / f"{uuid.uuid4().hex}.json"
            done = sweep(
                config,
                space,
                train=lambda run: (run.optim.learning_rate - TARGET) ** 2,
                trials=trials,
                ledger=ledger,
                search=search_for(),
            )
            return [trial.overrides[PATH] for trial in done]

        return run

    return [
        Side(
            "dew sweep + optuna_search",
            dew_sweep(lambda: optuna_search(sampler=sampler_class(seed=SEED))),
        ),
        Side("bare study.optimize", bare),
        Side("dew sweep + random_search", dew_sweep(lambda: random_search(seed=SEED))),
    ]


def show(title: str, sides: list[Side]) -> None:
    dew, bare = sides[:2]
    print(f"== {title} ==")
    print(f"{'side':<28}{'median':>10}{'best':>10}{'cpu':>10}   ms per trial")
    for side in sides:
        print(
            f"{side.label:<28}{statistics.median(side.wall) * 1e3:>10.3f}"
            f"{min(side.wall) * 1e3:>10.3f}{statistics.median(side.cpu) * 1e3:>10.3f}"
        )
    median = statistics.median(dew.wall) / statistics.median(bare.wall)
    paired = statistics.median(d / b for d, b in zip(dew.wall, bare.wall, strict=True))
    cpu = statistics.median(dew.cpu) / statistics.median(bare.cpu)
    added = (statistics.median(dew.wall) - statistics.median(bare.wall)) * 1e3
    print(
        f"dew / bare: median {median:.2f}x, paired {paired:.2f}x, cpu {cpu:.2f}x; "
        f"dew adds {added:.3f} ms per trial"
    )
    print(f"same points drawn on both Optuna sides: {'yes' if dew.points == bare.points else 'NO'}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 trials, 1 round")
    parser.add_argument("--trials", type=int, default=200, help="trials per side per round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per side")
    parser.add_argument("--ledger-dir", help="folder for the ledgers (default: a temporary one)")
    parser.add_argument(
        "--sampler",
        action="append",
        choices=("RandomSampler", "TPESampler"),
        help="time only these samplers (repeatable)",
    )
    args = parser.parse_args()
    if args.quick:
        args.trials, args.rounds = 20, 1
    try:
        import optuna
    except ImportError:
        print('optuna is not installed (pip install "dew-ml[hpo]"): skipped.')
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    began = time.perf_counter()

    with contextlib.ExitStack() as stack:
        if args.ledger_dir:
            folder = pathlib.Path(args.ledger_dir)
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cores = os.cpu_count()
        print("sweep overhead: dew sweep + optuna_search vs a bare Optuna study.optimize loop")
        print(
            f"python {platform.python_version()}, optuna {version('optuna')}, "
            f"dew-ml {version('dew-ml')}, numpy {version('numpy')}"
        )
        print(f"cpu: {cpu_model()} ({cores} cores); load avg at start: {load_average()}")
        print(
            f"{args.trials} trials per side per round, {args.rounds} timed rounds "
            f"(+1 warm-up); ledgers in {folder}"
        )
        print()
        for sampler_name in args.sampler or ("RandomSampler", "TPESampler"):
            sides = sides_for(sampler_name, folder)
            for side in sides:  # warm-up, untimed
                side.run(min(args.trials, 20))
            for round_ in range(args.rounds):
                for side in sides if round_ % 2 == 0 else reversed(sides):
                    side.time(args.trials)
            show(f"{sampler_name}(seed={SEED}), in-memory study", sides)
    print(
        "ms per trial: 'median' and 'best' of the rounds' wall time per trial, 'cpu' the median\n"
        "process CPU time per trial (waits on fsync do not count). 'paired' = median of the\n"
        "per-round ratios. > 1 means dew is slower. 'dew sweep + random_search' is the loop\n"
        "without Optuna, for reference."
    )
    print(f"load avg at the end: {load_average()}; wall time {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
