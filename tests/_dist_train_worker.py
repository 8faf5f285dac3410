"""Worker of tests/test_distributed_training.py: `Trainer.fit` under real `jax.distributed`.

`python _dist_train_worker.py RANK COUNT PORT OUT PHASE`: PHASE `main` runs every training
scenario of one launch (replicated, sharded params, fused steps, tracking on process zero
only, a first-batch row mismatch, a token file read by step and one read in another order on
each process, a fit checkpointed at step CHECKPOINT_AT); PHASE
`resume` continues that checkpointed fit to STEPS. Each scenario's params on this rank go
to OUT/<scenario>-rank<R>.npz, everything else to OUT/<phase>-rank<R>.json. The test
imports this module (without running it) for the model and the data, to train the
one-process reference on the concatenated batches.
"""

import itertools
import json
import logging
import os
import pathlib
import sys
from typing import ClassVar
from unittest import mock

import equinox as eqx
import jax
import numpy as np
import optax

from dew import Trainer, metrics
from dew.artifacts import Artifact, TokenScores
from dew.data import Dataset, tokens
from dew.naming import Split
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.supervised import EarlyStopper
from dew.training import _placement as placement

STEPS = 6
LONG_STEPS = 30  # past three blocks of batches drawn ahead and agreed at once
LATER_BLOCK = 10  # steps of a later block: `_AHEAD_BYTES` is set to 10 batches' bytes
CHECKPOINT_AT = 4
ROWS = 4  # rows a process reads per step
KEY = 5
TOKEN_SEED = 1


def token_ids() -> np.ndarray:
    """The token file's IDs (the test writes it to OUT/tokens.npy before the launch)."""
    return np.random.default_rng(9).integers(0, 8, 4000)


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


class HostMeanLoss(metrics.Metric[TokenScores]):
    """A host metric (the weighted mean loss in NumPy) that marks each update in a file of
    the process that ran it: only process zero may."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    host: ClassVar[bool] = True
    marker: str = eqx.field(static=True, default="")
    name: str = eqx.field(static=True, default="host_mean_loss")

    def init(self):
        return np.zeros(2)

    def statistics(self, artifact: TokenScores):
        with open(f"{self.marker}{jax.process_index()}.txt", "a") as file:
            file.write(f"{len(artifact.losses)}\n")
        losses, weights = np.asarray(artifact.losses), np.asarray(artifact.weights)
        return np.array([np.sum(losses * weights), np.sum(weights)])

    def merge(self, accumulated, contribution):
        return accumulated + contribution

    def finalize(self, accumulated):
        return float(accumulated[0] / accumulated[1])


# One optimizer object for every Trainer of a launch: the compiled step is cached by the
# optimizer's identity (among the model's structure and the shardings), so the scenarios that
# share a layout reuse one compilation instead of compiling the same step again (a fresh
# `optax.sgd(...)` is a fresh set of closures). Each fit still starts from its own initial
# optimizer state; the compilation count the test checks is the first fit's, which compiles.
OPTIMIZER = optax.sgd(0.5, momentum=0.9)


def trainer(**options) -> Trainer:
    return Trainer(objective(), OPTIMIZER, key=jax.random.key(KEY), **options)


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


class Compilations(logging.Handler):
    """Counts XLA compilations of the trainer's step (`jax_log_compiles` messages)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += record.getMessage().startswith("Finished XLA compilation of jit(step)")

    def __enter__(self):
        self.count = 0
        jax.config.update("jax_log_compiles", True)
        logging.getLogger("jax").addHandler(self)
        return self

    def __exit__(self, *exc_info):
        logging.getLogger("jax").removeHandler(self)
        jax.config.update("jax_log_compiles", False)


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

    # Replicated params, tracking on process zero only, a user sink on every process,
    # validation with a device and a host metric, previews (process zero's tracker decides).
    events = Events()
    validated = Dataset(
        train=lambda partition: local_batches(partition.index),
        val=lambda partition: val_batches(partition.index),
        batch=ROWS,
    )
    if rank == 0:
        tracker = Trackers(LocalTracker(out / "local"), TensorBoardTracker(out / "tb"))
    else:
        tracker = Recording()
    compiled = Compilations()
    with compiled:
        state = trainer().fit(
            validated,
            STEPS,
            log_every=3,
            eval_every=3,
            metrics=[metrics.perplexity(), HostMeanLoss(marker=str(out / "host_updates_rank"))],
            tracker=tracker,
            event_sinks=[events],
            preview=True,
            progress=True,
        )
    if rank == 0:
        tracker.close()
    else:
        results["calls_on_other_process"] = tracker.calls
    save(out / f"replicated-rank{rank}.npz", state)
    results["step_compilations"] = compiled.count
    results["events"] = events.seen
    results["history"] = {tag: list(map(list, v)) for tag, v in state.metric_history.items()}

    # Uneven validation shards: process 0 has a third batch, left out of the metrics.
    uneven_val = Dataset(
        train=lambda partition: local_batches(partition.index),
        val=lambda partition: val_batches(partition.index, 3 - partition.index),
    )
    # ... with early stopping on the validation split: no improvement counts (min_delta),
    # so the second event stops the fit on every process.
    never = EarlyStopper(metric="perplexity", patience=0, min_delta=1e9, source=Split.VALIDATION)
    state = trainer().fit(
        uneven_val,
        4,
        log_every=1,
        eval_every=1,
        metrics=[metrics.perplexity()],
        early_stopper=never,
        progress=True,
    )
    results["uneven_history"] = {tag: list(map(list, v)) for tag, v in state.metric_history.items()}
    results["stopped_at"] = int(state.step)

    # A training loss that turns NaN (a NaN learning rate): the same error on every process.
    nan_rate = Trainer(objective(), optax.sgd(float("nan")), key=jax.random.key(KEY))
    results["nonfinite"] = outcome(
        lambda: nan_rate.fit(data, 3, log_every=1, progress=False) and None
    )

    # Sharded params: every leaf whose first axis the devices divide is split by rows.
    devices = data_mesh().devices.size

    def by_rows(path, leaf):
        spec = PartitionSpec("data") if leaf.ndim and leaf.shape[0] % devices == 0 else None
        return NamedSharding(data_mesh(), spec if spec is not None else PartitionSpec())

    with compiled:
        state = trainer(param_sharding=by_rows).fit(data, STEPS, log_every=3, progress=False)
    results["sharded_step_compilations"] = compiled.count
    leaves = jax.tree.leaves(state.params)
    results["sharded_leaves"] = sum(not leaf.sharding.is_fully_replicated for leaf in leaves)
    save(out / f"sharded-rank{rank}.npz", state)

    # Fused steps: two optimizer steps per compiled call.
    state = trainer().fit(data, STEPS, log_every=2, steps_per_call=2, progress=False)
    save(out / f"fused-rank{rank}.npz", state)

    # Past the batches every process draws ahead and agrees on at once: 5 steps one at a
    # time, then to LONG_STEPS in fused calls of 4 (steps 6-7 one at a time). A fit's first
    # block is 8 steps, later ones as many as `_AHEAD_BYTES` of batches (decision 0090),
    # set here to LATER_BLOCK batches' bytes; each exchange's step count is recorded.
    data = Dataset(train=lambda partition: local_batches(partition.index))
    blocks, exchange = [], placement._allgather

    def recorded(row):
        blocks.append(int(row[1]))  # how many steps this process drew and agreed on
        return exchange(row)

    with (
        mock.patch.object(placement, "_allgather", recorded),
        mock.patch.object(placement, "_AHEAD_BYTES", LATER_BLOCK * shard(1, rank).nbytes),
    ):
        state = trainer().fit(data, 5, log_every=5, progress=False)
        state = trainer().fit(
            data, LONG_STEPS, log_every=4, steps_per_call=4, state=state, progress=False
        )
    results["long_blocks"] = blocks
    save(out / f"long-rank{rank}.npz", state)

    # A batch of step 10 whose rows differ on process 1; a token ID outside the vocabulary
    # on process 1 at step 11: in the second block drawn ahead, the same error on both,
    # raised when the fit reaches that step (the steps before it run: `late_<kind>_steps`).
    def late(rank, kind):
        for step in itertools.count(1):
            rows = 2 if kind == "rows" and rank == 1 and step == 10 else ROWS
            text = shard(step, rank, rows)
            if kind == "token" and rank == 1 and step == 11:
                text[0, 3] = 77
            yield {"text": text}

    for kind in ("rows", "token"):
        late_data = Dataset(train=lambda partition, kind=kind: late(partition.index, kind))
        events = Events()
        results[f"late_{kind}"] = outcome(
            lambda data=late_data, events=events: (
                trainer().fit(data, LONG_STEPS, log_every=1, progress=False, event_sinks=[events])
                and None
            )
        )
        results[f"late_{kind}_steps"] = [step for name, step in events.seen if name == "step_end"]

    # A first batch whose rows differ on process 1: the same ValueError on both.
    uneven = Dataset(train=lambda partition: local_batches(partition.index, 4 - 2 * rank))
    results["row_mismatch"] = outcome(
        lambda: trainer().fit(uneven, STEPS, log_every=3, progress=False) and None
    )

    # A token ID outside the vocabulary on process 1 at step 2; a loader failing on
    # process 0 at step 2: checked on the host, the same error on every process.
    def faulty(rank, kind):
        for step in itertools.count(1):
            text = shard(step, rank)
            if kind == "token" and rank == 1 and step == 2:
                text[1, 2] = 99
            if kind == "loader" and rank == 0 and step == 2:
                raise OSError("the shard file vanished")
            yield {"text": text}

    for kind in ("token", "loader"):
        faulty_data = Dataset(train=lambda partition, kind=kind: faulty(partition.index, kind))
        results[f"bad_{kind}"] = outcome(
            lambda data=faulty_data: (
                trainer().fit(data, STEPS, log_every=3, progress=False) and None
            )
        )

    # A token file read by step (dew.data.tokens): each process reads its slice of the
    # global batch; and with another seed on process 1, every process raises the same error.
    windows = tokens(out / "tokens.npy", seq_len=8, batch=ROWS, vocab_size=8, seed=TOKEN_SEED)
    state = trainer().fit(windows, STEPS, log_every=3, progress=False)
    save(out / f"tokens-rank{rank}.npz", state)
    other = tokens(out / "tokens.npy", seq_len=8, batch=ROWS, vocab_size=8, seed=rank)
    results["order_mismatch"] = outcome(
        lambda: trainer().fit(other, STEPS, log_every=3, progress=False) and None
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

    from _multiprocess import WATCHDOG, start

    # A hang shows where, just before the test's deadline (a loaded machine runs slowly).
    faulthandler.dump_traceback_later(float(os.environ.get(WATCHDOG, "90")), exit=True)
    rank, count, out, args = start()
    phase = args[0]
    run = {"main": main_phase, "resume": resume_phase}[phase]
    results = run(rank, count, out)
    (out / f"{phase}-rank{rank}.json").write_text(json.dumps(results))
    print(f"rank {rank} {phase} done", flush=True)
    sys.stdout.flush()
