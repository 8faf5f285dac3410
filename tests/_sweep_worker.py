"""A sweep worker for the subprocess tests of `dew.config.sweep` (and importable by them).

Its `train` appends `start <index> <pid>` to a side log, sleeps, appends `end <index> <pid>`
and returns a score that depends only on the trial's config, so an interrupted sweep and an
uninterrupted one end with equal trials.

    python tests/_sweep_worker.py --ledger L --side-log S --trials N --search random
        [--sleep SECONDS] [--storage URL --study NAME] [--ready FILE --go FILE]
        [--kill-after create|ask --kill-index N]

`--kill-after` makes the worker SIGKILL itself when Optuna trial N exists in the study but
not in the ledger: right after the storage created it (`create`, before its parameters are
drawn) or after the search returned it (`ask`, before the ledger records it).
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
    """SIGKILL this process once Optuna trial `index` is created (`create`) or asked (`ask`)."""
    from dew.config import sweep as sweep_module

    name = "_create" if moment == "create" else "ask"
    original = getattr(sweep_module._OptunaRun, name)

    def dying(self, *arguments):
        result = original(self, *arguments)
        number = result.number if moment == "create" else (result or (None,))[0]
        if number == index:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(sweep_module._OptunaRun, name, dying)


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
    parser.add_argument("--kill-after", choices=("create", "ask"))
    parser.add_argument("--kill-index", type=int)
    args = parser.parse_args()
    if args.kill_after is not None:
        kill_after(args.kill_after, args.kill_index)

    if args.search == "optuna":
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        search = optuna_search(
            storage=args.storage,
            study_name=args.study,
            sampler=optuna.samplers.RandomSampler(seed=os.getpid()),
        )
    else:
        search = random_search(seed=3)
    if args.ready:
        pathlib.Path(args.ready).touch()
    if args.go:
        while not pathlib.Path(args.go).exists():
            time.sleep(0.01)
    trials = sweep(
        base_config(),
        SPACE,
        train=make_train(args.side_log, args.sleep),
        trials=args.trials,
        ledger=args.ledger,
        search=search,
    )
    print(" ".join(str(trial.index) for trial in trials))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
