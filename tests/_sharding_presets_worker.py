"""The 8-device cases of tests/test_sharding_presets.py, in one process started with
`--xla_force_host_platform_device_count=8`: `python _sharding_presets_worker.py OUT_JSON`.

It trains one small causal transformer under each sharding preset and against a one-device
fit, reads the compiled step's memory analysis under "data" and "fsdp", moves checkpoints
between presets, and writes what the test checks to OUT_JSON.
"""

import json
import pathlib
import sys
import tempfile
from typing import Any

import equinox as eqx
import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from dew import metrics
from dew.data import Dataset
from dew.distributed import data_mesh
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.tracking import InMemoryTracker
from dew.training import Trainer

STEPS = 3
ROWS = 16
SEQ = 16


def objective(remat: bool = False) -> LMObjective:
    model = CausalTransformer(64, 64, 2, 4, 256, SEQ, remat=remat, key=jax.random.key(0))
    return LMObjective(model, seq_len=SEQ)


BATCHES = [
    {"text": np.random.default_rng(step).integers(0, 64, (ROWS, SEQ + 1)).astype(np.int32)}
    for step in range(8)
]
DATA = Dataset(train=lambda partition: iter(BATCHES), val=lambda partition: iter(BATCHES[:2]))
MESH8 = jax.make_mesh((8,), ("data",))
MESH42 = jax.make_mesh((4, 2), ("data", "model"))


def trainer(built: LMObjective, **kwargs: Any) -> Trainer:
    return Trainer(built, optax.adam(1e-2), key=jax.random.key(1), **kwargs)


def fit(built: LMObjective, steps: int = STEPS, **kwargs: Any) -> Any:
    return trainer(built, **kwargs).fit(DATA, steps=steps, log_every=steps, progress=False)


def validated(built: LMObjective, **kwargs: Any) -> tuple[Any, float]:
    """A fit that evaluates at its last step, and the perplexity it reports."""
    tracker = InMemoryTracker()
    state = trainer(built, **kwargs).fit(
        DATA,
        steps=STEPS,
        log_every=STEPS,
        eval_every=STEPS,
        metrics=(metrics.perplexity(),),
        tracker=tracker,
        progress=False,
    )
    ((_, value),) = tracker.scalars["lm/validation/perplexity"]
    return state, float(value)


def gap(state: Any, reference: Any) -> float:
    pairs = zip(jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True)
    return max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in pairs)


def specs(state: Any) -> dict[str, str]:
    paths = jax.tree_util.tree_flatten_with_path(state.params)[0]
    return {jax.tree_util.keystr(path): str(leaf.sharding.spec) for path, leaf in paths}


def step_memory(built: LMObjective, strategy: str) -> dict[str, int]:
    """The compiled step's memory analysis (per device) under `strategy` on 8 devices, and
    the bytes of the placed state one device holds."""
    from dew._loop import with_history
    from dew.steps import EMPTY_HISTORY
    from dew.training._compiled_step import state_leaves
    from dew.training._placement import Placement
    from dew.training._resume import initial_state
    from dew.training._window import _empty, window_names

    made = trainer(built, mesh=MESH8, strategy=strategy)
    placement = Placement(made.optimizer, None, made.strategy)
    first = initial_state(made.objective, made.optimizer, made.key)
    state = with_history(placement.state(first), EMPTY_HISTORY)
    leaves, state_def = state_leaves(state)
    step, _, objective_leaves, _ = placement.compiled_steps(
        made._objective_def, made._static, leaves, made._objective_leaves
    )
    batch = placement.batch(BATCHES[0])
    names = made._output_names((None, 1), state_def, leaves, batch)
    window = placement.replicated(_empty(len(window_names(names))))
    analysis = step.lower(leaves, window, batch, objective_leaves, state_def).compile()
    analysis = analysis.memory_analysis()
    device = jax.devices()[0]
    held = sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves((state.params, state.opt_state))
        for shard in leaf.addressable_shards
        if shard.device == device
    )
    return {
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "state_bytes_on_device_0": int(held),
    }


class Scaled(eqx.Module):
    """A user's module declaring its own tensor sharding."""

    weight: jax.Array
    scale: jax.Array

    def tensor_sharding(self) -> dict[str, PartitionSpec]:
        return {"weight": PartitionSpec(None, "model")}


class Odd(eqx.Module):
    weight: jax.Array

    def tensor_sharding(self) -> dict[str, PartitionSpec]:
        return {"weight": PartitionSpec("model")}


def main(out: pathlib.Path) -> None:
    assert jax.device_count() == 8, jax.devices()
    results: dict[str, Any] = {}
    built = objective()
    # one device: a Trainer without a mesh runs on the default device
    reference, results["reference_perplexity"] = validated(built)
    results["reference_devices"] = len(jax.tree.leaves(reference.params)[0].devices())
    presets = {
        "data": {"mesh": MESH8},
        "fsdp": {"mesh": MESH8, "strategy": "fsdp"},
        "fsdp_default_mesh": {"strategy": "fsdp"},
    }
    for name, kwargs in presets.items():
        state = fit(built, **kwargs)
        results[name] = {"gap": gap(state, reference), "specs": specs(state)}
    state, perplexity = validated(built, mesh=MESH42, strategy="fsdp+tensor")  # evaluates too
    results["fsdp+tensor"] = {"gap": gap(state, reference), "specs": specs(state)}
    results["fsdp+tensor"]["perplexity"] = perplexity

    remat = objective(remat=True)  # blocks stacked and scanned inside the step
    remat_state = fit(remat, mesh=MESH42, strategy="fsdp+tensor")
    results["remat_fsdp+tensor"] = {
        "gap": gap(remat_state, fit(remat)),
        "specs": specs(remat_state),
    }

    def by_rows(path: Any, leaf: Any) -> Any:
        return NamedSharding(data_mesh(), PartitionSpec("data" if leaf.shape[0] % 8 == 0 else None))

    def by_model(path: Any, leaf: Any) -> Any:  # on the user's own (explicit-axis) mesh
        return NamedSharding(MESH42, PartitionSpec("model" if leaf.shape[0] % 2 == 0 else None))

    state = fit(built, param_sharding=by_rows)
    results["param_sharding"] = {"gap": gap(state, reference), "specs": specs(state)}
    state = fit(built, mesh=MESH42, param_sharding=by_model)
    results["param_sharding_mesh"] = {"gap": gap(state, reference), "specs": specs(state)}

    results["memory"] = {name: step_memory(built, name) for name in ("data", "fsdp")}

    with tempfile.TemporaryDirectory() as folder:
        saved = fit(built, checkpoint_dir=folder, mesh=MESH8, strategy="fsdp")
        # continued under fsdp+tensor from fsdp's checkpoint, two steps more, saved again
        longer = fit(built, STEPS + 2, checkpoint_dir=folder, mesh=MESH42, strategy="fsdp+tensor")
        back = {
            "data": fit(built, STEPS + 2, checkpoint_dir=folder, mesh=MESH8),
            "fsdp": fit(built, STEPS + 2, checkpoint_dir=folder, mesh=MESH8, strategy="fsdp"),
        }
        restored_steps = {name: int(state.step) for name, state in back.items()}
        results["checkpoints"] = {
            "saved_step": int(saved.step),
            "continued_gap": gap(longer, fit(built, STEPS + 2)),
            "restored_steps": restored_steps,
            "restored_gaps": {name: gap(state, longer) for name, state in back.items()},
            "restored_specs": {name: specs(state) for name, state in back.items()},
        }

    from dew.training._strategies import sharding_strategy

    preset = sharding_strategy(MESH42, "fsdp+tensor")
    assert preset is not None
    user = {"inner": Scaled(np.zeros((3, 8), np.float32), np.zeros((8,), np.float32))}
    shardings = preset.shardings(user)
    results["user_module"] = {
        "weight": str(shardings["inner"].weight.spec),
        "scale": str(shardings["inner"].scale.spec),
    }
    try:
        preset.shardings({"odd": Odd(np.zeros((3, 8), np.float32))})
        results["indivisible"] = None
    except ValueError as error:
        results["indivisible"] = str(error)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
