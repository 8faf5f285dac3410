"""A sweep worker for the subprocess tests of `dew.config.sweep` (and importable by them).

Its `train` appends `start <index> <pid>` to a side log, sleeps, appends `end <index> <pid>`
and returns a score that depends only on the trial's config, so an interrupted sweep and an
uninterrupted one end with equal trials.

    python tests/_sweep_worker.py --ledger L --side-log S --trials N --search random
        [--sleep SECONDS] [--storage URL --study NAME] [--ready FILE --go FILE]
        [--kill-after create|reserve|ask --kill-index N] [--sampler random|grid|brute]
        [--hold-draw N --held FILE --go-on FILE]

`--kill-after` makes the worker SIGKILL itself when Optuna trial N exists in the study but
not in the ledger: right after the storage created it (`create`, before its parameters are
drawn), once the search reserved it (`reserve`: its index claimed, the ledger's lock let go,
its point not drawn) or after the search returned its point (`ask`, before the ledger
records it).

`--sampler grid` or `brute` samples Optuna's `GridSampler` or `BruteForceSampler` over the
12 points of `GRID` (as the space's choices) instead of random.
`--hold-draw` makes the sampler, drawing trial N's point, create `--held` and wait for
`--go-on` (the trial created and claimed, the ledger's lock let go, nothing recorded).
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import random
import signal
import sys
import time

from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
from dew.config.sweep import IntUniform, Uniform, optuna_search, random_search, sweep

NAME = "sweep-test"
SPACE = {
    "optim.learning_rate": Uniform(1e-4, 1e-1, log=True),
    "trainer.batch_size": [8, 16, 32],
    "trainer.steps": IntUniform(10, 100),
}
GRID = {
    "optim.learning_rate": [1e-3, 1e-2],
    "trainer.batch_size": [8, 16, 32],
    "trainer.steps": [10, 50],
}


def base_config() -> RunConfig:
    return RunConfig(ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name=NAME))


def score(run: RunConfig) -> float:
    """A score that depends only on the trial's config."""
    rate = (math.log10(run.optim.learning_rate) + 2.5) ** 2
    return rate + run.trainer.batch_size / 64 + run.trainer.steps / 1000


def trial_index(run: RunConfig) -> int:
    prefix = f"{NAME}/trial-"
    assert run.trainer.name.startswith(prefix), run.trainer.name
    return int(run.trainer.name[len(prefix) :])


def make_train(side_log: str | os.PathLike[str], sleep: float, seed: int | None = None):
    """`train` logging each start and end to `side_log` (one `write` per line, so a kill
    leaves whole lines), sleeping a random time up to `sleep` seconds in between."""
    rng = random.Random(seed)

    def log(line: str) -> None:
        with open(side_log, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def train(run: RunConfig) -> float:
        index = trial_index(run)
        log(f"start {index} {os.getpid()}")
        time.sleep(rng.uniform(0.0, sleep))
        log(f"end {index} {os.getpid()}")
        return score(run)

    return train


def kill_after(moment: str, index: int) -> None:
    """SIGKILL this process once Optuna trial `index` is created (`create`), reserved
    (`reserve`: created and claimed under the ledger's lock, its point not drawn) or asked
    (`ask`: its point drawn, not yet recorded)."""
    from dew.config import sweep as sweep_module

    run = sweep_module._OptunaRun
    names = {"create": ["_create"], "reserve": ["reserve"], "ask": ["ask", "draw"]}[moment]

    def dying(original, name):
        def wrapper(self, *arguments):
            result = original(self, *arguments)
            if name == "_create":
                number = result.number
            elif name == "reserve":
                number = result
            elif name == "draw":
                number = arguments[0]
            else:
                number = (result or (None,))[0]
            if number == index:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        return wrapper

    for name in names:
        setattr(run, name, dying(getattr(run, name), name))


def hold_draw(index: int, held: str, go_on: str) -> None:
    """Hold the sampler drawing trial `index`'s point: create `held`, wait for `go_on`."""
    from dew.config import sweep as sweep_module

    suggest = sweep_module._OptunaRun._suggest

    def holding(self, trial):
        if trial.number == index:
            pathlib.Path(held).touch()
            while not pathlib.Path(go_on).exists():
                time.sleep(0.01)
        return suggest(self, trial)

    sweep_module._OptunaRun._suggest = holding


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--side-log", required=True)
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--search", choices=("random", "optuna"), default="random")
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--storage")
    parser.add_argument("--study")
    parser.add_argument("--ready", help="file to create once imports are done")
    parser.add_argument("--go", help="file to wait for before sweeping")
    parser.add_argument("--kill-after", choices=("create", "reserve", "ask"))
    parser.add_argument("--kill-index", type=int)
    parser.add_argument("--sampler", choices=("random", "grid", "brute"), default="random")
    parser.add_argument("--hold-draw", type=int)
    parser.add_argument("--held")
    parser.add_argument("--go-on")
    args = parser.parse_args()
    if args.kill_after is not None:
        kill_after(args.kill_after, args.kill_index)
    if args.hold_draw is not None:
        hold_draw(args.hold_draw, args.held, args.go_on)

    if args.search == "optuna":
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if args.sampler == "grid":
            sampler = optuna.samplers.GridSampler(GRID, seed=0)  # one grid order for all
        elif args.sampler == "brute":
            sampler = optuna.samplers.BruteForceSampler(seed=0)
        else:
            sampler = optuna.samplers.RandomSampler(seed=os.getpid())
        search = optuna_search(storage=args.storage, study_name=args.study, sampler=sampler)
    else:
        search = random_search(seed=3)
    if args.ready:
        pathlib.Path(args.ready).touch()
    if args.go:
        while not pathlib.Path(args.go).exists():
            time.sleep(0.01)
    trials = sweep(
        base_config(),
        SPACE if args.sampler == "random" else GRID,
        train=make_train(args.side_log, args.sleep),
        trials=args.trials,
        ledger=args.ledger,
        search=search,
    )
    print(" ".join(str(trial.index) for trial in trials))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
