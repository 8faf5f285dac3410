"""Worker of tests/test_distributed_cli.py's sweep driver scenarios: `dew.config.sweep.sweep`
under two processes with a `train` that records what it trains (no Trainer), in one launch;
each rank's outcomes go into OUT/rank<R>.json."""

import json

from _multiprocess import start

rank, count, out, args = start()

from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig  # noqa: E402
from dew.config.sweep import grid_search, random_search, sweep  # noqa: E402
from dew.registry import datasets  # noqa: E402
from dew.tracking import InMemoryTracker  # noqa: E402

CONFIG = RunConfig(
    model=ModelConfig("causal_transformer", {"vocab_size": 16, "emb_features": 8}),
    data=datasets["token_windows"](seq_len=8, num_tokens=256),
    optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
    trainer=TrainerConfig(name="grid", checkpoint_dir=str(out / "runs"), steps=1),
)
results: dict = {}


def ledger(scenario: str) -> str:
    # Each process is given its own ledger path: process 1's must never be created.
    return str(out / f"rank{rank}" / scenario / "ledger.json")


def outcome(function):
    try:
        return {"value": function()}
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error)}


def recording(trained: list, fail_at=None):
    def train(run: RunConfig) -> float:
        rate = run.optim.learning_rate
        trained.append([run.trainer.name, rate])
        if fail_at is not None and run.trainer.name.endswith(f"trial-{fail_at}") and rank == 1:
            raise ValueError(f"process 1 cannot train {run.trainer.name}")
        return rate * 10 + rank  # process zero's score is the one recorded

    return train


def trials_json(trials):
    return [[trial.index, trial.overrides, trial.value] for trial in trials]


space = {"optim.learning_rate": [0.1, 0.2, 0.3]}

# A grid of three trials: every process trains every trial, in the same order.
trained: list = []
tracker = InMemoryTracker()
results["grid"] = outcome(
    lambda: trials_json(
        sweep(
            CONFIG,
            space,
            train=recording(trained),
            trials=5,
            ledger=ledger("grid"),
            tracker=tracker,
            search=grid_search,
        )
    )
)
results["grid_trained"] = trained
results["grid_reported"] = tracker.scalars.get("sweep/validation/value", [])

# Random search: process zero's draws, shared.
trained = []
results["random"] = outcome(
    lambda: trials_json(
        sweep(
            CONFIG,
            {"optim.learning_rate": [0.1, 0.2, 0.3, 0.4], "trainer.seed": [1, 2, 3]},
            train=recording(trained),
            trials=3,
            ledger=ledger("random"),
            search=random_search(seed=rank),  # process 1's own seed must not matter
        )
    )
)
results["random_trained"] = trained

# Trial 1 fails on process 1 only: every process raises the same error.
trained = []
results["failing"] = outcome(
    lambda: sweep(
        CONFIG,
        space,
        train=recording(trained, fail_at=1),
        trials=3,
        ledger=ledger("failing"),
        search=grid_search,
    )
)
results["failing_trained"] = trained

# The same sweep again: trial 1 (left running) is retrained first, then trial 2.
trained = []
results["resumed"] = outcome(
    lambda: trials_json(
        sweep(
            CONFIG,
            space,
            train=recording(trained),
            trials=3,
            ledger=ledger("failing"),
            search=grid_search,
        )
    )
)
results["resumed_trained"] = trained


# A trial whose own agreed phase fails on process 1 (as `Trainer`'s checks do): every process
# raises that phase's error once, not wrapped again in the sweep's "training trial" phase.
def agreeing(run: RunConfig) -> float:
    from dew._processes import agree_process_phase

    problem = ValueError(f"process 1 refuses {run.trainer.name}") if rank == 1 else True
    agree_process_phase("checking the configuration", problem)
    return 0.0


results["agreed"] = outcome(
    lambda: sweep(
        CONFIG, space, train=agreeing, trials=1, ledger=ledger("agreed"), search=grid_search
    )
)

(out / f"rank{rank}.json").write_text(json.dumps(results))
