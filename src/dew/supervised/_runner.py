"""`run_supervised`: epochs of supervised training over a loader, reporting events.

It runs on the Trainer's machinery: the model and loss become a `SupervisedObjective`,
each batch is one step of `dew.steps.train_step` in a compiled call that is cached
across runs (keyed by the objective's structure and the optax transformation) and
merges the batch's loss into the `loss` metric's statistics on the device, validation
is a `dew._pass.run_pass` over the `loss` metric (one fetch per pass), and the run is
observed by the `LoopEngine` that `Trainer.fit` uses.
"""

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import PRNGKeyArray, PyTree

from dew._compiled_calls import CompiledCalls, partitioned
from dew._domains import supervised_step_key, supervised_validation_key
from dew._early_stopping import EarlyStopper
from dew._finite_params import check_params
from dew._integers import check_integer
from dew._loop import LoopEngine, with_history
from dew._nonfinite import check_loss, raises_on_nonfinite
from dew._pass import run_pass
from dew.artifacts import RegressionScores
from dew.events import EPOCH_END, VALIDATION_END, EventSink
from dew.metrics import MetricSet
from dew.metrics._regression import RowLoss, RowMeanState
from dew.naming import Split, check_name
from dew.objectives.base import trainable
from dew.objectives.supervised import SupervisedObjective
from dew.steps import EMPTY_HISTORY, TrainState, train_step
from dew.tracking import ScalarTracker
from dew.tracking._protocol import takes_artifacts

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

_LOSS = RowLoss()
_LOSS_ONLY = MetricSet([_LOSS])


class Batch(eqx.Module):
    """One supervised batch (a pytree): `inputs`, `targets`, optional `sample_weight`."""

    inputs: Any
    targets: Any
    sample_weight: Any = None


def as_mapping(batch: "Batch | Mapping[str, Any]") -> Mapping[str, Any]:
    """A loader's batch as the mapping a `SupervisedObjective` reads."""
    if isinstance(batch, Batch):
        return {
            "inputs": batch.inputs,
            "targets": batch.targets,
            "sample_weight": batch.sample_weight,
        }
    if isinstance(batch, Mapping):
        return batch
    raise TypeError(
        "a supervised loader must yield Batch(inputs, targets, sample_weight), got "
        f"{type(batch).__name__}."
    )


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


@dataclasses.dataclass(frozen=True)
class HeldOutValidation:
    """Validation on held-out batches: the row-weighted mean of `loss` over
    `loader(split="validation", epoch=epoch)`, with `training=False`."""

    model: PyTree
    loader: Loader
    loss: Loss

    def evaluate(self, params: PyTree, epoch: int, key: PRNGKeyArray) -> dict[str, float]:
        """The validation metrics of `params` at `epoch` (`{}` for an empty loader).

        One `run_pass` of the `SupervisedObjective(model, loss)` with the `loss` metric:
        each batch is one compiled call that merges its loss into the statistics on the
        device, fetched once after the last batch.
        """
        batches = map(as_mapping, self.loader(split="validation", epoch=epoch))
        return run_pass(self.objective, params, batches, _LOSS_ONLY, key).scores

    @functools.cached_property
    def objective(self) -> SupervisedObjective:
        """The objective the validation scores (one object, so its passes share their
        compiled calls without re-partitioning the model)."""
        return SupervisedObjective(self.model, self.loss)


def _compile_step(objective_def: Any, static: Any, transformation: optax.GradientTransformation):
    """One training step of `train_step` that also merges the batch's loss, weighted by
    its rows, into the `loss` metric's statistics; the state travels as a flat list of
    leaves, and it and the statistics are donated."""

    def step(state_leaves: list, batch: Any, objective_leaves: list, state_def: Any, total: Any):
        objective = eqx.combine(jax.tree.unflatten(objective_def, objective_leaves), static)
        state = jax.tree.unflatten(state_def, state_leaves)
        key = supervised_step_key(state.key, state.step)
        next_state, outputs = train_step(objective, transformation, state, batch, key)
        rows = jax.tree.leaves(batch["inputs"])[0].shape[0]
        # The batch as one score weighted by its rows: the epoch's loss is the
        # row-weighted mean of the batch losses, and no step waits for the host.
        loss = jnp.reshape(jnp.asarray(outputs["loss"], jnp.float32), (1,))
        scores = RegressionScores(loss, jnp.full((1,), rows, jnp.float32))
        return jax.tree.leaves(next_state), _LOSS.merge(total, _LOSS(scores))

    return jax.jit(step, donate_argnums=(0, 4), static_argnums=3)


# Runs of one model structure, loss and optimizer share a compiled step (`dew._compiled_calls`).
_steps = CompiledCalls(_compile_step)


def _step_for(objective: SupervisedObjective, transformation: optax.GradientTransformation):
    """The compiled step of `objective`'s structure, and the objective's array leaves."""
    leaves, objective_def, static = partitioned(objective)
    return _steps(objective_def, static, transformation), leaves


@jax.jit
def _copies(leaves: list) -> list:
    """Fresh buffers holding `leaves`, in one compiled call."""
    return [jnp.copy(leaf) for leaf in leaves]


@jax.jit
def _epoch_start() -> Any:
    """An epoch's empty loss statistics: fresh buffers, donated to its first step."""
    return _LOSS.init()


def _epoch_loss(total: RowMeanState) -> float | None:
    """The epoch's row-weighted mean loss, finalized on the host in float64 from one
    fetch of its statistics (`None` for an epoch without rows)."""
    total = jax.device_get(total)
    rows = float(total.weight.hi) + float(total.weight.lo)
    return (float(total.total.hi) + float(total.total.lo)) / rows if rows else None


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
    tracker: ScalarTracker | None = None,
    progress: bool = False,
    on_nonfinite: str = "raise",
) -> TrainState:
    """Train `model` for `epochs` epochs and return the final state.

    `loss(model, inputs, targets, sample_weight, key, training)` returns a scalar (or
    one value per row, whose sample-weighted mean is the batch's loss: see
    `dew.objectives.supervised.SupervisedObjective`, which `run_supervised` trains).
    Each epoch emits `epoch_end` (split train, the row-weighted mean training loss),
    then `validation_end` when `validation` is given, then the early stopper's
    `best_model` / `early_stop` decision events (no metrics). Steps are epochs,
    counted from zero. `state.metric_history` is keyed by the tags a tracker receives.

    The loop is observed by the same engine as `Trainer.fit`: pass `tracker` to give
    it the `FitStarted` / `FitEnded` records (its metrics still arrive through a
    `TrackerEventSink` among `event_sinks`; a tracker that takes scalars only,
    `dew.tracking.ScalarTracker`, gets no records), and `progress=True` for a printed
    line per report and a bar over the epochs.

    `on_nonfinite="raise"` (the default) stops the run with a `ValueError` naming the
    step and the value at the end of the first epoch whose training loss is NaN or
    infinite (the epoch's loss accumulates on the device and is fetched once), and
    checks the params once before returning them; `"continue"` trains on.
    """
    check_name("stage", stage)
    check_integer("epochs", epochs, minimum=0)
    raising = raises_on_nonfinite(on_nonfinite)
    step, objective_leaves = _step_for(SupervisedObjective(model, loss), optimizer.transformation)
    # The compiled step sees the empty history only, so a growing history never changes
    # its static structure; it donates the state, so it gets copies of the caller's arrays.
    history = state.metric_history
    leaves, state_def = jax.tree.flatten(with_history(state, EMPTY_HISTORY))
    leaves = _copies(leaves)
    steps = int(state.step)

    def current() -> TrainState:
        return jax.tree.unflatten(state_def, leaves)

    engine = LoopEngine(
        stage=stage,
        current=current,
        history=history,
        sinks=event_sinks,
        tracker=tracker if tracker is not None and takes_artifacts(tracker) else None,
        early_stopper=early_stopper,
        progress=progress,
        total=epochs,
        unit="epoch",
    )
    with engine.reporting_fit(start=0, steps=epochs, completed=lambda: steps):
        for epoch in range(epochs):
            total = _epoch_start()
            for batch in train_loader(split="train", epoch=epoch):
                leaves, total = step(leaves, as_mapping(batch), objective_leaves, state_def, total)
                steps += 1
            engine.advance()
            measured: dict[Split, dict[str, float]] = {}
            value = _epoch_loss(total)
            if raising and value is not None:  # the epoch's loss is where run_supervised looks
                check_loss(value, steps, note=f" (the end of epoch {epoch})")
            if value is not None:
                measured[Split.TRAIN] = {"loss": value}
                engine.report(EPOCH_END, Split.TRAIN, epoch, measured[Split.TRAIN])
            if validation is not None:
                key = supervised_validation_key(state.key, epoch)
                scores = validation.evaluate(current().params, epoch, key)
                if scores:
                    measured[Split.VALIDATION] = scores
                    engine.report(VALIDATION_END, Split.VALIDATION, epoch, scores)
            if early_stopper is not None and engine.update_early_stopping(
                (source := Split(early_stopper.source)), epoch, measured.get(source, {})
            ):
                break
        if raising:
            check_params(current().params, steps)
    return engine.state()
