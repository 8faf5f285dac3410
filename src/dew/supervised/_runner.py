"""`run_supervised`: epochs of supervised training over a loader, reporting events."""

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import PRNGKeyArray, PyTree

from dew._checks import check_integer
from dew._domains import SUPERVISED_STEP_DOMAIN
from dew._early_stopping import EarlyStopper
from dew._loop import LoopEngine
from dew._nonfinite import check_loss, check_params, raises_on_nonfinite
from dew.events import (
    EPOCH_END,
    VALIDATION_END,
    EventSink,
)
from dew.metrics._sums import Sum
from dew.naming import Split, check_name
from dew.objectives.base import trainable
from dew.steps import TrainState
from dew.tracking import Tracker

__all__ = [
    "Batch",
    "HeldOutValidation",
    "Optimizer",
    "create_optimizer",
    "initialize_training_state",
    "run_supervised",
]

Loss = Callable[..., jax.Array]
Loader = Callable[..., Iterable["Batch"]]


class Batch(eqx.Module):
    """One supervised batch (a pytree): `inputs`, `targets`, optional `sample_weight`."""

    inputs: Any
    targets: Any
    sample_weight: Any = None


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """An optax transformation bound to a model's trainable arrays."""

    transformation: optax.GradientTransformation


def create_optimizer(model: PyTree, transformation: optax.GradientTransformation) -> Optimizer:
    """Bind `transformation` to `model`'s trainable (floating) arrays."""
    if not jax.tree.leaves(trainable(model)):
        raise ValueError("create_optimizer: the model has no floating-point arrays to train.")
    return Optimizer(transformation)


def initialize_training_state(
    model: PyTree, optimizer: Optimizer, rng_key: PRNGKeyArray
) -> TrainState:
    """The state before the first epoch: copies of the model's trainable arrays."""
    params = jax.tree.map(jnp.copy, trainable(model))
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.transformation.init(params),
        key=rng_key,
    )


def _rows(batch: Batch) -> int:
    return int(np.shape(jax.tree.leaves(batch.inputs)[0])[0])


@dataclasses.dataclass(frozen=True)
class HeldOutValidation:
    """Validation on held-out batches: the row-weighted mean of `loss` over
    `loader(split="validation", epoch=epoch)`, with `training=False`."""

    model: PyTree
    loader: Loader
    loss: Loss

    def evaluate(self, params: PyTree, epoch: int, key: PRNGKeyArray) -> dict[str, float]:
        """The validation metrics of `params` at `epoch` (`{}` for an empty loader).

        Each batch is one compiled call that adds its row-weighted loss to a donated
        compensated sum on the device; the sum is fetched once, after the last batch.
        """
        leaves, params_def = jax.tree.flatten(params)
        add = self._compiled(params_def)
        carry = None
        for index, batch in enumerate(self.loader(split="validation", epoch=epoch)):
            if carry is None:
                carry = _zero_carry()
            carry = add(carry, leaves, batch, key, index)
        if carry is None:
            return {}
        hi, lo, rows = jax.device_get(carry)
        total = float(np.float64(hi) + np.float64(lo))
        return {"loss": total / int(rows)} if rows else {}

    def _compiled(self, params_def: Any) -> Callable[..., tuple[jax.Array, ...]]:
        """The compiled per-batch call for params of structure `params_def` (kept per
        validation object: a pass flattens nothing but its batches)."""
        cache = self.__dict__.setdefault("_calls", {})
        if params_def not in cache:
            static = eqx.filter(self.model, eqx.is_inexact_array, inverse=True)
            loss = self.loss

            def add(carry, leaves: list, batch: Batch, key, index):
                model = eqx.combine(jax.tree.unflatten(params_def, leaves), static)
                value = loss(
                    model,
                    batch.inputs,
                    batch.targets,
                    batch.sample_weight,
                    jax.random.fold_in(key, index),
                    False,
                )
                count = _rows(batch)
                total = Sum(carry[0], carry[1]).add(Sum.of(value * count))
                return total.hi, total.lo, carry[2] + count

            cache[params_def] = jax.jit(add, donate_argnums=0)
        return cache[params_def]


@jax.jit
def _zero_carry() -> tuple[jax.Array, jax.Array, jax.Array]:
    """A pass's empty (hi, lo, rows): fresh buffers, donated to its first call."""
    return jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)


def run_supervised(
    *,
    model: PyTree,
    optimizer: Optimizer,
    train_loader: Loader,
    loss: Loss,
    state: TrainState,
    epochs: int,
    validation: HeldOutValidation | None = None,
    early_stopper: EarlyStopper | None = None,
    event_sinks: Sequence[EventSink] = (),
    stage: str = "supervised",
    tracker: Tracker | None = None,
    progress: bool = False,
    on_nonfinite: str = "raise",
) -> TrainState:
    """Train `model` for `epochs` epochs and return the final state.

    `loss(model, inputs, targets, sample_weight, key, training)` returns a scalar.
    Each epoch emits `epoch_end` (split train, the row-weighted mean training loss),
    then `validation_end` when `validation` is given, then the early stopper's
    `best_model` / `early_stop` decision events (no metrics). Steps are epochs,
    counted from zero. `state.metric_history` is keyed by the tags a tracker receives.

    The loop is observed by the same engine as `Trainer.fit`: pass `tracker` to give
    it the `FitStarted` / `FitEnded` records (its metrics still arrive through a
    `TrackerEventSink` among `event_sinks`), and `progress=True` for a printed line
    per report and a bar over the epochs.

    `on_nonfinite="raise"` (the default) stops the run with a `ValueError` naming the
    step and the value at the end of the first epoch whose training loss is NaN or
    infinite (the epoch's loss accumulates on the device and is fetched once), and
    checks the params once before returning them; `"continue"` trains on.
    """
    check_name("stage", stage)
    check_integer("epochs", epochs, minimum=0)
    raising = raises_on_nonfinite(on_nonfinite)
    transformation = optimizer.transformation
    static = eqx.filter(model, eqx.is_inexact_array, inverse=True)

    @functools.partial(jax.jit, donate_argnums=(7, 8))
    def step(params, opt_state, inputs, targets, sample_weight, run_key, index, total, rows):
        key = jax.random.fold_in(jax.random.fold_in(run_key, SUPERVISED_STEP_DOMAIN), index)

        def objective(p):
            return loss(eqx.combine(p, static), inputs, targets, sample_weight, key, True)

        value, grads = jax.value_and_grad(objective)(params)
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = transformation.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        # The epoch's row-weighted loss accumulates on the device: no step waits for
        # the host, and the sum is fetched once at the end of the epoch.
        count = int(np.shape(jax.tree.leaves(inputs)[0])[0])
        return params, opt_state, total.add(Sum.of(value * count)), rows + count

    params, opt_state = state.params, state.opt_state
    steps = int(state.step)

    def current() -> TrainState:
        return TrainState(
            jnp.asarray(steps, jnp.int32), params, opt_state, state.key, state.ema_params
        )

    engine = LoopEngine(
        stage=stage,
        current=current,
        history=state.metric_history,
        sinks=event_sinks,
        tracker=tracker,
        early_stopper=early_stopper,
        progress=progress,
        total=epochs,
        unit="epoch",
    )
    with engine.reporting_fit(start=0, steps=epochs, completed=lambda: steps):
        for epoch in range(epochs):
            total, rows = Sum.zero(), jnp.zeros((), jnp.int32)
            for batch in train_loader(split="train", epoch=epoch):
                params, opt_state, total, rows = step(
                    params,
                    opt_state,
                    batch.inputs,
                    batch.targets,
                    batch.sample_weight,
                    state.key,
                    steps,
                    total,
                    rows,
                )
                steps += 1
            engine.advance()
            measured: dict[Split, dict[str, float]] = {}
            total, rows = jax.device_get((total.value(), rows))
            if raising and rows:  # the epoch's loss is where run_supervised looks
                check_loss(float(total) / int(rows), steps, note=f" (the end of epoch {epoch})")
            if rows:
                measured[Split.TRAIN] = {"loss": float(total) / int(rows)}
                engine.report(EPOCH_END, Split.TRAIN, epoch, measured[Split.TRAIN])
            if validation is not None:
                key = jax.random.fold_in(state.key, epoch)
                scores = validation.evaluate(params, epoch, key)
                if scores:
                    measured[Split.VALIDATION] = scores
                    engine.report(VALIDATION_END, Split.VALIDATION, epoch, scores)
            if early_stopper is not None and engine.update_early_stopping(
                early_stopper.source, epoch, measured.get(early_stopper.source, {})
            ):
                break
        if raising:
            check_params(params, steps)
    return engine.state()
