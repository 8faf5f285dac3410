"""The Trainer's compiled steps: one optimizer step, and several fused in a `lax.scan`.

The objective is partitioned and flattened once, and the state travels as a flat list of
leaves with its buffers donated: a step pays no Python-level pytree flattening and adds no
copies the hand-written loop lacks. The training window (`_window.TrainWindow`'s array)
travels beside it, donated too, and is the steps' one training output. Trainers of one
objective structure and one optimizer share their compiled steps.
"""

import contextlib
import functools
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from dew._checks import held_on_host, ids_checked_on_host
from dew._compiled_calls import CompiledCalls
from dew._domains import train_step_key
from dew._processes import is_multiprocess, replicated_sharding
from dew.steps import LearningRate, train_step
from dew.training._window import accumulated

__all__ = ["StateLayout", "by_where_batches_lie", "compiled_steps", "state_leaves", "state_of"]


class StateLayout(NamedTuple):
    """How a state travels through the compiled calls (their static argument): its treedef,
    and the leaves that are typed PRNG keys, with their implementations. A key travels as its
    raw `key_data`: a typed key in or out of a call costs Python per call (measured: 2.5 us
    a call, the tiny MLP's step is about 90)."""

    treedef: Any
    keys: tuple[tuple[int, str], ...]


def state_leaves(state: Any) -> tuple[list[Any], StateLayout]:
    """A state's leaves as the compiled calls take them, and its layout."""
    leaves, treedef = jax.tree.flatten(state)
    keys = tuple(
        (index, str(jax.random.key_impl(leaf)))
        for index, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )
    return _raw(leaves, keys), StateLayout(treedef, keys)


def state_of(layout: StateLayout, leaves: list[Any]) -> Any:
    """The state of `leaves` (`state_leaves`' inverse; inside a trace or outside)."""
    leaves = list(leaves)
    for index, impl in layout.keys:
        leaves[index] = jax.random.wrap_key_data(leaves[index], impl=impl)
    return jax.tree.unflatten(layout.treedef, leaves)


def _raw(leaves: list[Any], keys: tuple[tuple[int, str], ...]) -> list[Any]:
    leaves = list(leaves)
    for index, _ in keys:
        leaves[index] = jax.random.key_data(leaves[index])
    return leaves


Telemetry = tuple[LearningRate | None] | None
"""What `Trainer.fit(log_optimizer=True)` compiles in: `(learning_rate,)`, the Trainer's
`learning_rate` (`None`: read from the optimizer state), or `None`: no telemetry."""


def _step_function(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    checked_on_host: bool = False,
    telemetry: Telemetry = None,
    accumulate: int = 1,
    precision: str = "float32",
):
    """`step(state_leaves, batch, objective_leaves, state_def) -> (leaves, outputs)`;
    `telemetry`: `None`, or `(learning_rate,)` for `train_step(log_optimizer=True)`;
    `accumulate`: the micro-batches of `train_step(accumulate=...)` (1: the step without
    a scan, as before accumulation); `precision`: `train_step(precision=...)`'s policy."""

    def step(state_leaves: list, batch: Any, objective_leaves: list, state_def: StateLayout):
        objective = eqx.combine(jax.tree.unflatten(objective_def, objective_leaves), static)
        state = state_of(state_def, state_leaves)
        key = train_step_key(state.key, state.step)
        logging: dict[str, Any] = {}
        if telemetry is not None:
            logging = {"log_optimizer": True, "learning_rate": telemetry[0]}
        if accumulate > 1:  # the micro-batches' gradients summed in a scan, one update
            logging["accumulate"] = accumulate
        if precision != "float32":  # computed in bfloat16, the params kept in float32
            logging["precision"] = precision
        with ids_checked_on_host() if checked_on_host else contextlib.nullcontext():
            next_state, outputs = train_step(
                objective, optimizer, state, batch, key, ema_decay=objective.ema_decay, **logging
            )
        return _raw(jax.tree.leaves(next_state), state_def.keys), outputs

    return step


def _windowed(one_step: Any):
    """`one_step` carrying the training window: `(leaves, window, batch, objective_leaves,
    state_def) -> (leaves, window)`, the step's outputs added to the window (compiled as
    `jit(step)`, as before the window). The window is the one training output: a call
    returning the outputs beside it would carry a buffer per metric more."""

    def step(state_leaves: list, window: Any, batch: Any, objective_leaves: list, state_def):
        leaves, outputs = one_step(state_leaves, batch, objective_leaves, state_def)
        return leaves, accumulated(window, outputs)

    return step


def _compile_step(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    shardings: tuple[Any, ...] | None = None,
    telemetry: Telemetry = None,
    checked_on_host: bool = False,
    accumulate: int = 1,
    precision: str = "float32",
):
    checked = checked_on_host or _on_host(shardings)
    step = _step_function(
        objective_def, static, optimizer, checked, telemetry, accumulate, precision
    )
    return jax.jit(_windowed(step), donate_argnums=(0, 1), static_argnums=4, **_kept(shardings))


def _on_host(shardings: tuple[Any, ...] | None) -> bool:
    """Whether the step's batches are checked on the host, not in the step: under
    `jax.distributed` (a traced check is a host callback that fires on the process
    holding the bad rows alone, and would leave the others blocked)."""
    return shardings is not None and is_multiprocess()


def _kept(shardings: tuple[Any, ...] | None) -> dict[str, Any]:
    """`jax.jit`'s `out_shardings` that keep the state's leaves where they were placed
    (`shardings`, one per leaf), and the training window replicated (on the leaves' mesh: a
    `Trainer`'s own may be another than the data mesh); none in one process."""
    if shardings is None:
        return {}
    meshes = [sharding.mesh for sharding in shardings if isinstance(sharding, NamedSharding)]
    window = NamedSharding(meshes[0], PartitionSpec()) if meshes else replicated_sharding()
    return {"out_shardings": (list(shardings), window)}


def _compile_fused(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    shardings: tuple[Any, ...] | None = None,
    telemetry: Telemetry = None,
    checked_on_host: bool = False,
    accumulate: int = 1,
    precision: str = "float32",
):
    """Several steps in one compiled call: a `lax.scan` of the step over stacked batches,
    each step added to the window (which ends holding the last step's values)."""
    checked = checked_on_host or _on_host(shardings)
    step = _step_function(
        objective_def, static, optimizer, checked, telemetry, accumulate, precision
    )
    step = _windowed(step)

    def fused(state_leaves: list, window: Any, batches: Any, objective_leaves: list, state_def):
        def body(carry: tuple[list, Any], batch: Any):
            return step(*carry, batch, objective_leaves, state_def), None

        (leaves, window), _ = jax.lax.scan(body, (state_leaves, window), batches)
        return leaves, window

    return jax.jit(fused, donate_argnums=(0, 1), static_argnums=4, **_kept(shardings))


# Trainers of one objective structure and one optimizer share their compiled steps (kept by
# `dew._compiled_calls`, keyed on every argument but the leaves: the objective's treedef and
# static rest, the optimizer, the shardings, the telemetry, the host checks, the
# accumulation).
_steps = CompiledCalls(_compile_step)
_fused_steps = CompiledCalls(_compile_fused)


class _ByWhereBatchesLie:
    """A compiled call in its two variants, picked by where the call's batch lies: held on
    the host (NumPy arrays, which the trainer checked there: `_batches.checked_block`), the
    variant without traced batch checks; on a device, the one with them. A traced check is
    a host callback: it costs a call about 0.2 ms on a CPU, and JAX's persistent
    compilation cache stores no executable that holds one, so without this every process
    compiled its training step anew."""

    __slots__ = ("device", "host")

    def __init__(self, host: Any, device: Any) -> None:
        self.host, self.device = host, device

    def __call__(self, leaves: list, window: Any, batch: Any, *rest: Any) -> Any:
        call = self.host if held_on_host(batch) else self.device
        return call(leaves, window, batch, *rest)


def by_where_batches_lie(call: Any) -> Any:
    """The jitted call a compiled call runs a batch held on the host with (itself when it
    has one variant: a placed fit's)."""
    return call.host if isinstance(call, _ByWhereBatchesLie) else call


def compiled_steps(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    shardings: tuple[Any, ...] | None = None,
    telemetry: Telemetry = None,
    accumulate: int = 1,
    precision: str = "float32",
):
    """The compiled single step and fused steps of one objective structure and optimizer;
    the state's EMA params are updated in them when the objective declares an `ema_decay`.
    Both take and return the training window after the state's leaves, the steps' one
    training output. With `accumulate > 1` each optimizer step sums the gradients of that
    many micro-batches of its batch in a `lax.scan` (`dew.steps.train_step`), and the
    window gets one entry per optimizer step, the whole batch's values. `precision` is
    the policy the steps compute under (`dew._precision`; decision 0078).

    With `shardings` (one `jax.sharding.Sharding` per state leaf: a placed fit under
    `jax.distributed`), the steps return the state's leaves in those shardings (so the
    donated buffers are reused and a sharded param stays sharded) and the training
    window replicated (every process reads the same loss). Under `jax.distributed` the
    steps hold no traced batch checks: the trainer checks every batch on the host first
    (`Placement.agree`)."""
    compiled = (objective_def, static, optimizer, shardings, telemetry)
    if shardings is not None:  # a placed fit: its batches are placed on its devices
        return (
            _steps(*compiled, False, accumulate, precision),
            _fused_steps(*compiled, False, accumulate, precision),
        )
    return (
        _ByWhereBatchesLie(
            _steps(*compiled, True, accumulate, precision),
            _steps(*compiled, False, accumulate, precision),
        ),
        _ByWhereBatchesLie(
            _fused_steps(*compiled, True, accumulate, precision),
            _fused_steps(*compiled, False, accumulate, precision),
        ),
    )


def output_names(
    objective_def: Any,
    static: Any,
    optimizer: optax.GradientTransformation,
    telemetry: Telemetry,
    leaves: list[Any],
    batch: Any,
    objective_leaves: list[Any],
    state_def: Any,
    accumulate: int = 1,
    precision: str = "float32",
) -> tuple[str, ...]:
    """The names of the training metrics one step returns (traced, never run: a batch
    `accumulate` does not divide raises its `ValueError` here, before any compilation)."""
    step = _step_function(objective_def, static, optimizer, False, telemetry, accumulate, precision)
    _, outputs = jax.eval_shape(
        functools.partial(step, state_def=state_def), leaves, batch, objective_leaves
    )
    return tuple(outputs)
