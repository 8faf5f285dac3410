"""`run_supervised`: epochs of supervised training over a loader, reporting events."""

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import PRNGKeyArray, PyTree

from dew.events import (
    BEST_MODEL,
    EARLY_STOP,
    EPOCH_END,
    VALIDATION_END,
    Decision,
    EventSink,
    TrainingEvent,
)
from dew.naming import Split, check_name, metric_tag
from dew.objectives.base import combine, trainable
from dew.steps import EMPTY_HISTORY, TrainState
from dew.supervised._early_stopping import EarlyStopper

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
TRAIN_DOMAIN = 0x5D1


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
        """The validation metrics of `params` at `epoch` (`{}` for an empty loader)."""
        model = combine(params, self.model)
        total = rows = 0.0
        for index, batch in enumerate(self.loader(split="validation", epoch=epoch)):
            batch_key = jax.random.fold_in(key, index)
            value = _evaluate_loss(self.loss, model, batch, batch_key)
            count = _rows(batch)
            total, rows = total + float(value) * count, rows + count
        return {"loss": total / rows} if rows else {}


@eqx.filter_jit
def _evaluate_loss(loss: Loss, model: PyTree, batch: Batch, key: PRNGKeyArray) -> jax.Array:
    return loss(model, batch.inputs, batch.targets, batch.sample_weight, key, False)


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
) -> TrainState:
    """Train `model` for `epochs` epochs and return the final state.

    `loss(model, inputs, targets, sample_weight, key, training)` returns a scalar.
    Each epoch emits `epoch_end` (split train, the row-weighted mean training loss),
    then `validation_end` when `validation` is given, then the early stopper's
    `best_model` / `early_stop` decision events (no metrics). Steps are epochs,
    counted from zero. `state.metric_history` is keyed by the tags a tracker receives.
    """
    check_name("stage", stage)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}.")
    transformation = optimizer.transformation
    static = eqx.filter(model, eqx.is_inexact_array, inverse=True)

    @jax.jit
    def step(params, opt_state, inputs, targets, sample_weight, key):
        def objective(p):
            return loss(eqx.combine(p, static), inputs, targets, sample_weight, key, True)

        value, grads = jax.value_and_grad(objective)(params)
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = transformation.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, opt_state, value

    history = state.metric_history
    stopping = early_stopper.init() if early_stopper is not None else None
    params, opt_state = state.params, state.opt_state

    def current() -> TrainState:
        return TrainState(state.step, params, opt_state, state.key, state.ema_params, history)

    def emit(name: str, split: Split, epoch: int, values=None, decision=None) -> None:
        event = TrainingEvent(name, stage, split, epoch, current(), values or {}, decision)
        for sink in event_sinks:
            sink.on_event(event)

    def record(split: Split, epoch: int, values: dict[str, float]) -> None:
        nonlocal history
        tags = {metric_tag(stage, split, name): value for name, value in values.items()}
        history = history.with_values(tags, epoch)

    steps = int(state.step)
    for epoch in range(epochs):
        total = rows = 0.0
        for batch in train_loader(split="train", epoch=epoch):
            key = jax.random.fold_in(jax.random.fold_in(state.key, TRAIN_DOMAIN), steps)
            params, opt_state, value = step(
                params, opt_state, batch.inputs, batch.targets, batch.sample_weight, key
            )
            steps += 1
            count = _rows(batch)
            total, rows = total + float(value) * count, rows + count
        state = TrainState(
            jnp.asarray(steps, jnp.int32),
            params,
            opt_state,
            state.key,
            state.ema_params,
            EMPTY_HISTORY,
        )
        measured: dict[Split, dict[str, float]] = {}
        if rows:
            measured[Split.TRAIN] = {"loss": total / rows}
            record(Split.TRAIN, epoch, measured[Split.TRAIN])
            emit(EPOCH_END, Split.TRAIN, epoch, measured[Split.TRAIN])
        if validation is not None:
            key = jax.random.fold_in(state.key, epoch)
            scores = validation.evaluate(params, epoch, key)
            if scores:
                measured[Split.VALIDATION] = scores
                record(Split.VALIDATION, epoch, scores)
                emit(VALIDATION_END, Split.VALIDATION, epoch, scores)
        if early_stopper is not None:
            values = measured.get(early_stopper.source, {})
            metric = early_stopper.monitored_metric_name()
            if metric in values:
                stopping = early_stopper.update(stopping, values[metric], step=epoch)
                decision = Decision(metric, float(values[metric]))
                if stopping.improved:
                    emit(BEST_MODEL, early_stopper.source, epoch, decision=decision)
                if stopping.stop:
                    emit(EARLY_STOP, early_stopper.source, epoch, decision=decision)
                    break
    return current()
