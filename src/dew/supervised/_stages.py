"""Two-stage heteroscedastic regression: `MeanStage`, then `GammaVarianceStage`.

The mean stage fits `mean(x)` by squared error. The variance stage freezes the
mean model and fits `v(x)` by the Gamma likelihood of the squared residuals
`r² = (y - mean(x))²`: when `y ~ N(mean(x), v(x))`, `r²` is exactly Gamma with
shape 1/2 and mean `v(x)`, whose negative log-likelihood is, up to a constant,
`0.5 * log v + r² / (2 v)`. Each stage is a thin wrapper over `run_supervised`
with its own loss and its own stage name, so its tags (`mean/train/loss`,
`variance/validation/point_crps`, ...) never collide with another stage's.
"""

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from dew import metrics
from dew._domains import stage_key
from dew._integers import check_integer
from dew._pass import run_pass
from dew.events import EventSink
from dew.metrics import MetricSet, gaussian_crps
from dew.naming import check_name
from dew.objectives.base import combine
from dew.objectives.supervised import SupervisedObjective
from dew.steps import TrainState
from dew.supervised._runner import (
    Batch,
    HeldOutValidation,
    as_mapping,
    create_optimizer,
    initialize_training_state,
    run_supervised,
)

__all__ = [
    "GammaVarianceStage",
    "GaussianValidation",
    "MeanStage",
    "gamma_variance_nll",
    "gaussian_crps",
    "positive_variance",
    "run_stages",
]

Loader = Callable[..., Iterable[Batch]]

VARIANCE_FLOOR = 1e-6
"""Added to `softplus` in `positive_variance`, and the least residual standard
deviation the mean stage uses for its `point_crps`."""


def positive_variance(raw: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
    """The variance a variance model's raw output stands for: `softplus(raw) + 1e-6`.

    `softplus` keeps it positive and smooth; the `1e-6` floor keeps `log v` and
    `r² / v` finite when the model drives `softplus` towards zero.

    ```python
    >>> import jax.numpy as jnp
    >>> float(positive_variance(jnp.array(0.0)))  # log 2 + 1e-6
    0.693148...

    ```
    """
    return jax.nn.softplus(raw) + VARIANCE_FLOOR


def gamma_variance_nll(
    variance: Float[Array, "*shape"], squared_residuals: Float[Array, "*shape"]
) -> Float[Array, "*shape"]:
    """Elementwise negative log-likelihood of `squared_residuals` under a Gamma
    with shape 1/2 and mean `variance` (scale `2 * variance`), without the terms
    that do not depend on `variance`: `0.5 * log v + r² / (2 v)`.

    ```python
    >>> import jax.numpy as jnp
    >>> float(gamma_variance_nll(jnp.array(1.0), jnp.array(2.0)))
    1.0

    ```
    """
    return 0.5 * jnp.log(variance) + squared_residuals / (2.0 * variance)


def _predict(model: PyTree, inputs: Any) -> jax.Array:
    return jax.vmap(model)(inputs)


def _per_row(values: jax.Array) -> jax.Array:
    """The mean of each row over its trailing axes."""
    return jnp.mean(jnp.reshape(values, (values.shape[0], -1)), axis=1)


def _squared_error(model, inputs, targets, sample_weight, key, training):
    """Each row's mean squared error (the objective weighs the rows)."""
    return _per_row(jnp.square(targets - _predict(model, inputs).astype(targets.dtype)))


class _GammaVarianceLoss(eqx.Module):
    """The variance stage's loss, per row; the mean model is a field, so it is never trained."""

    mean_model: PyTree

    def __call__(self, model, inputs, targets, sample_weight, key, training):
        mean = jax.lax.stop_gradient(_predict(self.mean_model, inputs).astype(targets.dtype))
        squared = jnp.square(targets - mean)
        variance = positive_variance(_predict(model, inputs).astype(targets.dtype))
        return _per_row(gamma_variance_nll(variance, squared))


class _ConstantSpread(eqx.Module):
    """The mean stage's predictive distribution: `N(model(x), std²)`, one `std` for all."""

    std: jax.Array

    def __call__(self, model: PyTree, inputs: Any) -> tuple[jax.Array, jax.Array]:
        return _predict(model, inputs), self.std


class _GammaSpread(eqx.Module):
    """The variance stage's predictive distribution: `N(mean_model(x), v(x))`, where the
    model being trained predicts `v`."""

    mean_model: PyTree

    def __call__(self, model: PyTree, inputs: Any) -> tuple[jax.Array, jax.Array]:
        variance = positive_variance(_predict(model, inputs))
        return _predict(self.mean_model, inputs), jnp.sqrt(variance)


_GAUSSIAN_METRICS = MetricSet([metrics.loss(), metrics.rmse(), metrics.point_crps()])
_RMSE = MetricSet([metrics.rmse()])


@dataclasses.dataclass(frozen=True, eq=False)
class GaussianValidation(HeldOutValidation):
    """Validation of a Gaussian predictive distribution `N(mean(x), sigma²)`:
    `loss` (the stage's loss), `rmse` of the mean against the targets and
    `point_crps`, each a sample-weighted mean over `loader(split="validation")`.

    With `mean_model` None, `model` is the mean model being trained and `sigma`
    is the residual standard deviation of the training set
    (`train_loader(split="train", epoch=epoch)`) under the current mean,
    floored at 1e-6. Otherwise `model` is the variance model being trained,
    `mean_model` is frozen and `sigma = sqrt(v(x))`. `loss` returns each row's
    loss. Each pass is a `run_pass` of the `loss`, `rmse` and `point_crps` metrics.
    """

    mean_model: PyTree = None
    train_loader: Loader | None = None

    def evaluate(self, params: PyTree, epoch: int, key: PRNGKeyArray) -> dict[str, float]:
        """The validation metrics of `params` at `epoch` (`{}` for an empty loader)."""
        objective = self.objective
        if self.mean_model is None:
            if self.train_loader is None:
                raise ValueError("GaussianValidation: a mean model needs a train_loader.")
            std = self._residual_std(params, epoch, key)
            objective = eqx.tree_at(lambda o: o.predictive.std, objective, std)
        batches = map(as_mapping, self.loader(split="validation", epoch=epoch))
        return run_pass(objective, params, batches, _GAUSSIAN_METRICS, key).scores

    @functools.cached_property
    def objective(self) -> SupervisedObjective:
        if self.mean_model is None:
            predictive = _ConstantSpread(jnp.ones((), jnp.float32))
        else:
            predictive = _GammaSpread(self.mean_model)
        return SupervisedObjective(self.model, self.loss, predictive=predictive)

    def _residual_std(self, params: PyTree, epoch: int, key: PRNGKeyArray) -> jax.Array:
        """The root weighted mean squared residual of the mean model over the training
        batches of `epoch`, floored at `VARIANCE_FLOOR` (1.0 for an empty loader)."""
        loader = self.train_loader
        if loader is None:  # the objective refuses a mean model without one first
            raise ValueError("GaussianValidation: a mean model needs a train_loader.")
        batches = map(as_mapping, loader(split="train", epoch=epoch))
        scores = run_pass(self.objective, params, batches, _RMSE, key).scores
        std = max(scores["rmse"], VARIANCE_FLOOR) if scores else 1.0
        return jnp.asarray(std, jnp.float32)


def _check_epochs(epochs: int) -> None:
    check_integer("epochs", epochs, minimum=1)


def _train(
    stage: str,
    model: PyTree,
    transformation: optax.GradientTransformation,
    epochs: int,
    loss: Callable[..., jax.Array],
    validation: HeldOutValidation | None,
    train_loader: Loader,
    event_sinks: Sequence[EventSink],
    key: PRNGKeyArray,
) -> TrainState:
    optimizer = create_optimizer(model, transformation)
    return run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=train_loader,
        loss=loss,
        state=initialize_training_state(model, optimizer, key),
        epochs=epochs,
        validation=validation,
        event_sinks=event_sinks,
        stage=stage,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class MeanStage:
    """Fits `model` (applied to one input row) to the targets by squared error.

    Reports `loss` on the training split and, given a validation loader,
    `loss`, `rmse` and `point_crps` on the validation split (see
    `GaussianValidation`; the predictive std is the training set's residual std).
    """

    model: PyTree
    optimizer_transformation: optax.GradientTransformation
    epochs: int
    stage: str = "mean"

    def __post_init__(self) -> None:
        check_name("stage", self.stage)
        _check_epochs(self.epochs)

    def trained_model(self, state: TrainState) -> PyTree:
        """`model` with the trained arrays of `state`."""
        return combine(state.params, self.model)

    def run(
        self,
        train_loader: Loader,
        validation_loader: Loader | None,
        event_sinks: Sequence[EventSink],
        key: PRNGKeyArray,
    ) -> TrainState:
        """Train for `epochs` epochs, counted from zero, and return the final state."""
        validation = None
        if validation_loader is not None:
            validation = GaussianValidation(
                model=self.model,
                loader=validation_loader,
                loss=_squared_error,
                train_loader=train_loader,
            )
        return _train(
            self.stage,
            self.model,
            self.optimizer_transformation,
            self.epochs,
            _squared_error,
            validation,
            train_loader,
            event_sinks,
            key,
        )


@dataclasses.dataclass(frozen=True, eq=False)
class GammaVarianceStage:
    """Fits a variance model with `mean_model` frozen, by the Gamma (shape 1/2)
    likelihood of the squared residuals (`gamma_variance_nll`).

    `model` maps one input row to a raw output shaped like one target row; the
    variance is `positive_variance(raw) = softplus(raw) + 1e-6`. `mean_model` is
    a model, or a `MeanStage` that `run_stages` has run earlier, whose trained
    model is then used. Reports `loss` on the training split and, given a
    validation loader, `loss`, `rmse` (of the frozen mean) and `point_crps` of
    `N(mean(x), v(x))` on the validation split.
    """

    model: PyTree
    optimizer_transformation: optax.GradientTransformation
    epochs: int
    mean_model: PyTree
    stage: str = "variance"

    def __post_init__(self) -> None:
        check_name("stage", self.stage)
        _check_epochs(self.epochs)

    def variance(self, state: TrainState, inputs: Any) -> jax.Array:
        """The variance `v(x)` the trained variance model predicts for a batch of `inputs`."""
        return positive_variance(_predict(combine(state.params, self.model), inputs))

    def run(
        self,
        train_loader: Loader,
        validation_loader: Loader | None,
        event_sinks: Sequence[EventSink],
        key: PRNGKeyArray,
        mean_model: PyTree = None,
    ) -> TrainState:
        """Train for `epochs` epochs, counted from zero, and return the final state.

        `mean_model`, when given, replaces the stage's own `mean_model` (so
        `run_stages` can pass the trained model of an earlier `MeanStage`).
        """
        mean = self.mean_model if mean_model is None else mean_model
        if isinstance(mean, MeanStage):
            raise ValueError(
                f"stage {self.stage!r}: its mean model is the MeanStage {mean.stage!r}; "
                "run both through run_stages, the MeanStage first, or pass a model."
            )
        loss = _GammaVarianceLoss(mean)
        validation = None
        if validation_loader is not None:
            validation = GaussianValidation(
                model=self.model, loader=validation_loader, loss=loss, mean_model=mean
            )
        return _train(
            self.stage,
            self.model,
            self.optimizer_transformation,
            self.epochs,
            loss,
            validation,
            train_loader,
            event_sinks,
            key,
        )


def run_stages(
    stages: Sequence[MeanStage | GammaVarianceStage],
    train_loader: Loader,
    validation_loader: Loader | None,
    event_sinks: Sequence[EventSink],
    key: PRNGKeyArray,
) -> dict[str, TrainState]:
    """Run `stages` in order, each counting its epochs from zero under its own
    stage name, and return the final state of each, by stage name.

    Stage `i` trains with the key `dew._domains.stage_key(key, i)`. A `GammaVarianceStage`
    whose `mean_model` is a `MeanStage` listed before it uses that stage's
    trained model.
    """
    if not stages:
        raise ValueError("run_stages: no stages to run.")
    names = [stage.stage for stage in stages]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"run_stages: duplicate stage names {duplicates}.")
    states: dict[str, TrainState] = {}
    trained: list[tuple[MeanStage, TrainState]] = []
    for index, stage in enumerate(stages):
        state_key = stage_key(key, index)
        if isinstance(stage, GammaVarianceStage) and isinstance(stage.mean_model, MeanStage):
            found = [state for done, state in trained if done is stage.mean_model]
            if not found:
                raise ValueError(
                    f"run_stages: stage {stage.stage!r} needs the MeanStage "
                    f"{stage.mean_model.stage!r} to run before it."
                )
            mean = stage.mean_model.trained_model(found[0])
            state = stage.run(train_loader, validation_loader, event_sinks, state_key, mean)
        else:
            state = stage.run(train_loader, validation_loader, event_sinks, state_key)
        if isinstance(stage, MeanStage):
            trained.append((stage, state))
        states[stage.stage] = state
    return states
