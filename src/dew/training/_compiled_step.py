"""The Trainer's compiled steps: one optimizer step, and several fused in a `lax.scan`.

The objective is partitioned and flattened once, and the state travels as a flat list of
leaves with its buffers donated: a step pays no Python-level pytree flattening and adds no
copies the hand-written loop lacks. Trainers of one objective structure and one optimizer
share their compiled steps.
"""

import functools
from typing import Any

import equinox as eqx
import jax
import optax

from dew._domains import TRAIN_STEP_DOMAIN
from dew._processes import replicated_sharding
from dew.steps import train_step

__all__ = ["compiled_steps"]


def _step_function(objective_def: Any, static: Any, optimizer: optax.GradientTransformation):
    def step(state_leaves: list, batch: Any, objective_leaves: list, state_def: Any):
        objective = eqx.combine(jax.tree.unflatten(objective_def, objective_leaves), static)
        state = jax.tree.unflatten(state_def, state_leaves)
        key = jax.random.fold_in(jax.random.fold_in(state.key, TRAIN_STEP_DOMAIN), state.step)
        next_state, outputs = train_step(
            objective, optimizer, state, batch, key, ema_decay=objective.ema_decay
        )
        return jax.tree.leaves(next_state), outputs

    return step


def _compile_step(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    shardings: tuple[Any, ...] | None = None,
):
    return jax.jit(
        _step_function(objective_def, static, optimizer),
        donate_argnums=0,
        static_argnums=3,
        **_kept(shardings),
    )


def _kept(shardings: tuple[Any, ...] | None) -> dict[str, Any]:
    """`jax.jit`'s `out_shardings` that keep the state's leaves where they were placed
    (`shardings`, one per leaf) and the training metrics replicated; none in one process."""
    if shardings is None:
        return {}
    return {"out_shardings": (list(shardings), replicated_sharding())}


def _compile_fused(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    shardings: tuple[Any, ...] | None = None,
):
    """Several steps in one compiled call: a `lax.scan` of the step over stacked batches,
    returning the last step's training metrics."""
    step = _step_function(objective_def, static, optimizer)

    def fused(state_leaves: list, batches: Any, objective_leaves: list, state_def: Any):
        def body(leaves: list, batch: Any):
            return step(leaves, batch, objective_leaves, state_def)

        leaves, outputs = jax.lax.scan(body, state_leaves, batches)
        return leaves, jax.tree.map(lambda value: value[-1], outputs)

    return jax.jit(fused, donate_argnums=0, static_argnums=3, **_kept(shardings))


_cached_step = functools.lru_cache(maxsize=32)(_compile_step)
_cached_fused = functools.lru_cache(maxsize=32)(_compile_fused)


def compiled_steps(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    shardings: tuple[Any, ...] | None = None,
):
    """The compiled single step and fused steps of one objective structure and optimizer;
    the state's EMA params are updated in them when the objective declares an `ema_decay`.

    With `shardings` (one `jax.sharding.Sharding` per state leaf: a placed fit under
    `jax.distributed`), the steps return the state's leaves in those shardings (so the
    donated buffers are reused and a sharded param stays sharded) and the training
    metrics replicated (every process reads the same loss)."""
    try:  # Trainers of one model structure and one optimizer share a compiled step
        return (
            _cached_step(objective_def, static, optimizer, shardings),
            _cached_fused(objective_def, static, optimizer, shardings),
        )
    except TypeError:  # an unhashable static field: compile for this Trainer alone
        return (
            _compile_step(objective_def, static, optimizer, shardings),
            _compile_fused(objective_def, static, optimizer, shardings),
        )
