"""Worker of tests/test_distributed_training.py: `Trainer.fit` under real `jax.distributed`.

`python _dist_train_worker.py RANK COUNT PORT OUT PHASE`: PHASE `main` runs every training
scenario of one launch (replicated, sharded params, fused steps, tracking on process zero
only, a first-batch row mismatch, a fit checkpointed at step CHECKPOINT_AT); PHASE
`resume` continues that checkpointed fit to STEPS. Each scenario's params on this rank go
to OUT/<scenario>-rank<R>.npz, everything else to OUT/<phase>-rank<R>.json. The test
imports this module (without running it) for the model and the data, to train the
one-process reference on the concatenated batches.
"""

import itertools
import json
import pathlib
import sys

import jax
import numpy as np
import optax

from dew import Trainer
from dew.data import Dataset
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective

STEPS = 6
CHECKPOINT_AT = 4
ROWS = 4  # rows a process reads per step
KEY = 5


def objective() -> LMObjective:
    model = CausalTransformer(
        vocab_size=8,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        mlp_features=32,
        max_seq_len=16,
        dtype="float32",
        attention_impl="xla",
        key=jax.random.key(3),
    )
    return LMObjective(model, seq_len=8)


def shard(step: int, rank: int, rows: int = ROWS) -> np.ndarray:
    """Process `rank`'s batch of `step` (1-based): different on every step and process."""
    rng = np.random.default_rng(1000 * step + rank)
    return rng.integers(0, 8, (rows, 9)).astype(np.int32)


def local_batches(rank: int, rows: int = ROWS):
    return ({"text": shard(step, rank, rows)} for step in itertools.count(1))


def concatenated_batches(count: int):
    """The one-process reference's batches: process 0's rows, then process 1's, ..."""
    for step in itertools.count(1):
        yield {"text": np.concatenate([shard(step, rank) for rank in range(count)])}


def val_batches(rank: int, count: int = 2):
    return iter([{"text": shard(100 + index, rank)} for index in range(count)])


def trainer(**options) -> Trainer:
    return Trainer(objective(), optax.sgd(0.5, momentum=0.9), key=jax.random.key(KEY), **options)


def save(path: pathlib.Path, state) -> None:
    from jax.experimental import multihost_utils

    leaves = [
        np.asarray(leaf)
        if leaf.is_fully_replicated
        else np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        for leaf in jax.tree.leaves(state.params)
    ]
    np.savez(path, *leaves, step=np.asarray(state.step))


class Recording:
    """A tracker that records every call: on a process other than zero it must get none."""

    def __init__(self):
        self.calls = []

    def log_params(self, values):
        self.calls.append("log_params")

    def log_metrics(self, values, *, step):
        self.calls.append("log_metrics")

    def log_artifact(self, name, value, *, step=None):
        self.calls.append(f"log_artifact {name}")

    def close(self):
        self.calls.append("close")


class Events:
    def __init__(self):
        self.seen = []

    def on_event(self, event):
        self.seen.append([event.name, event.step])


def outcome(function):
    try:
        return {"value": function()}
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error)}


def main_phase(rank: int, count: int, out: pathlib.Path) -> dict:
    from jax.sharding import NamedSharding, PartitionSpec

    from dew import LocalTracker, TensorBoardTracker, Trackers
    from dew.distributed import data_mesh

    results: dict = {}
    data = Dataset(train=lambda partition: local_batches(partition.index), batch=ROWS)

    # Replicated params, tracking on process zero only, a user sink on every process.
    events = Events()
    if rank == 0:
        tracker = Trackers(LocalTracker(out / "local"), TensorBoardTracker(out / "tb"))
    else:
        tracker = Recording()
    state = trainer().fit(
        data, STEPS, log_every=3, tracker=tracker, event_sinks=[events], progress=True
    )
    if rank == 0:
        tracker.close()
    else:
        results["calls_on_other_process"] = tracker.calls
    save(out / f"replicated-rank{rank}.npz", state)
    results["events"] = events.seen
    results["history"] = {tag: list(map(list, v)) for tag, v in state.metric_history.items()}

    # Sharded params: every leaf whose first axis the devices divide is split by rows.
    devices = data_mesh().devices.size

    def by_rows(path, leaf):
        spec = PartitionSpec("data") if leaf.ndim and leaf.shape[0] % devices == 0 else None
        return NamedSharding(data_mesh(), spec if spec is not None else PartitionSpec())

    state = trainer(param_sharding=by_rows).fit(data, STEPS, log_every=3, progress=False)
    leaves = jax.tree.leaves(state.params)
    results["sharded_leaves"] = sum(not leaf.sharding.is_fully_replicated for leaf in leaves)
    save(out / f"sharded-rank{rank}.npz", state)

    # Fused steps: two optimizer steps per compiled call.
    state = trainer().fit(data, STEPS, log_every=2, steps_per_call=2, progress=False)
    save(out / f"fused-rank{rank}.npz", state)

    # A first batch whose rows differ on process 1: the same ValueError on both.
    uneven = Dataset(train=lambda partition: local_batches(partition.index, 4 - 2 * rank))
    results["row_mismatch"] = outcome(
        lambda: trainer().fit(uneven, STEPS, log_every=3, progress=False) and None
    )

    # Checkpointed to CHECKPOINT_AT (the resume phase continues it), with early stopping's
    # and the history's state in the JSON item.
    state = trainer(checkpoint_dir=out / "checkpoints").fit(
        data, CHECKPOINT_AT, log_every=2, checkpoint_every=2, progress=False
    )
    results["checkpointed_step"] = int(state.step)
    return results


def resume_phase(rank: int, count: int, out: pathlib.Path) -> dict:
    data = Dataset(train=lambda partition: local_batches(partition.index), batch=ROWS)
    state = trainer(checkpoint_dir=out / "checkpoints").fit(
        data, STEPS, log_every=2, checkpoint_every=2, progress=True
    )
    save(out / f"resumed-rank{rank}.npz", state)
    return {"history": {tag: list(map(list, v)) for tag, v in state.metric_history.items()}}


if __name__ == "__main__":
    import faulthandler

    from _multiprocess import start

    faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where
    rank, count, out, args = start()
    phase = args[0]
    run = {"main": main_phase, "resume": resume_phase}[phase]
    results = run(rank, count, out)
    (out / f"{phase}-rank{rank}.json").write_text(json.dumps(results))
    print(f"rank {rank} {phase} done", flush=True)
    sys.stdout.flush()
