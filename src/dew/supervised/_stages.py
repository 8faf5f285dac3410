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
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.scipy.stats import norm
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from dew._checks import check_integer
from dew.events import EventSink
from dew.naming import check_name
from dew.objectives.base import combine
from dew.steps import TrainState
from dew.supervised._runner import (
    Batch,
    HeldOutValidation,
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


def gaussian_crps(
    mean: Float[Array, "*shape"], std: Float[Array, "*shape"], targets: Float[Array, "*shape"]
) -> Float[Array, "*shape"]:
    """Elementwise CRPS of the Gaussian `N(mean, std²)` at `targets`, in closed form:
    `std * (z * (2 Φ(z) - 1) + 2 φ(z) - 1 / sqrt(pi))` with `z = (targets - mean) / std`.

    ```python
    >>> import jax.numpy as jnp
    >>> round(float(gaussian_crps(jnp.array(0.0), jnp.array(1.0), jnp.array(0.0))), 6)
    0.233695

    ```
    """
    z = (targets - mean) / std
    return std * (z * (2.0 * norm.cdf(z) - 1.0) + 2.0 * norm.pdf(z) - 1.0 / math.sqrt(math.pi))


def _predict(model: PyTree, inputs: Any) -> jax.Array:
    return jax.vmap(model)(inputs)


def _per_row(values: jax.Array) -> jax.Array:
    """The mean of each row over its trailing axes."""
    return jnp.mean(jnp.reshape(values, (values.shape[0], -1)), axis=1)


def _row_weights(sample_weight: Any, rows: jax.Array) -> jax.Array:
    if sample_weight is None:
        return jnp.ones_like(rows)
    return jnp.reshape(jnp.asarray(sample_weight), rows.shape).astype(rows.dtype)


def _weighted_mean(rows: jax.Array, sample_weight: Any) -> jax.Array:
    if sample_weight is None:
        return jnp.mean(rows)
    weights = _row_weights(sample_weight, rows)
    return jnp.sum(rows * weights) / jnp.sum(weights)


def _squared_error(model, inputs, targets, sample_weight, key, training):
    errors = jnp.square(targets - _predict(model, inputs).astype(targets.dtype))
    return _weighted_mean(_per_row(errors), sample_weight)


class _GammaVarianceLoss(eqx.Module):
    """The variance stage's loss; the mean model is a field, so it is never trained."""

    mean_model: PyTree

    def __call__(self, model, inputs, targets, sample_weight, key, training):
        mean = jax.lax.stop_gradient(_predict(self.mean_model, inputs).astype(targets.dtype))
        squared = jnp.square(targets - mean)
        variance = positive_variance(_predict(model, inputs).astype(targets.dtype))
        return _weighted_mean(_per_row(gamma_variance_nll(variance, squared)), sample_weight)


@eqx.filter_jit
def _batch_sums(
    mean_model: PyTree, variance_model: PyTree, std: Any, batch: Batch
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Weighted sums over one batch: (weight, squared error, CRPS, loss).

    With `variance_model` None the predictive std is the scalar `std` and the
    loss is the squared error; otherwise the std is `sqrt(v(x))` and the loss
    is the Gamma variance NLL.
    """
    targets = batch.targets
    mean = _predict(mean_model, batch.inputs).astype(targets.dtype)
    squared = jnp.square(targets - mean)
    if variance_model is None:
        sigma = jnp.broadcast_to(jnp.asarray(std, targets.dtype), targets.shape)
        loss = squared
    else:
        variance = positive_variance(_predict(variance_model, batch.inputs).astype(targets.dtype))
        sigma = jnp.sqrt(variance)
        loss = gamma_variance_nll(variance, squared)
    squared_rows = _per_row(squared)
    weights = _row_weights(batch.sample_weight, squared_rows)
    crps_rows = _per_row(gaussian_crps(mean, sigma, targets))
    return (
        jnp.sum(weights),
        jnp.sum(weights * squared_rows),
        jnp.sum(weights * crps_rows),
        jnp.sum(weights * _per_row(loss)),
    )


def _residual_std(mean_model: PyTree, loader: Loader, epoch: int) -> float:
    """The root weighted mean squared residual of `mean_model` over the training
    batches of `epoch`, floored at `VARIANCE_FLOOR` (1.0 for an empty loader)."""
    weight = squared = 0.0
    for batch in loader(split="train", epoch=epoch):
        w, s, _, _ = _batch_sums(mean_model, None, jnp.ones(()), batch)
        weight, squared = weight + float(w), squared + float(s)
    if not weight:
        return 1.0
    return max(math.sqrt(squared / weight), VARIANCE_FLOOR)


@dataclasses.dataclass(frozen=True, eq=False)
class GaussianValidation(HeldOutValidation):
    """Validation of a Gaussian predictive distribution `N(mean(x), sigma²)`:
    `loss` (the stage's loss), `rmse` of the mean against the targets and
    `point_crps`, each a sample-weighted mean over `loader(split="validation")`.

    With `mean_model` None, `model` is the mean model being trained and `sigma`
    is the residual standard deviation of the training set
    (`train_loader(split="train", epoch=epoch)`) under the current mean,
    floored at 1e-6. Otherwise `model` is the variance model being trained,
    `mean_model` is frozen and `sigma = sqrt(v(x))`. `loss` is kept only for
    `HeldOutValidation`'s interface; the loss reported is computed here.
    """

    mean_model: PyTree = None
    train_loader: Loader | None = None

    def evaluate(self, params: PyTree, epoch: int, key: PRNGKeyArray) -> dict[str, float]:
        """The validation metrics of `params` at `epoch` (`{}` for an empty loader)."""
        model = combine(params, self.model)
        if self.mean_model is None:
            if self.train_loader is None:
                raise ValueError("GaussianValidation: a mean model needs a train_loader.")
            mean_model, variance_model = model, None
            std = _residual_std(model, self.train_loader, epoch)
        else:
            mean_model, variance_model, std = self.mean_model, model, 1.0
        weight = squared = crps = loss = 0.0
        for batch in self.loader(split="validation", epoch=epoch):
            sums = _batch_sums(mean_model, variance_model, jnp.asarray(std), batch)
            w, s, c, total = (float(value) for value in sums)
            weight, squared, crps, loss = weight + w, squared + s, crps + c, loss + total
        if not weight:
            return {}
        return {
            "loss": loss / weight,
            "rmse": math.sqrt(squared / weight),
            "point_crps": crps / weight,
        }


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

    Stage `i` trains with `jax.random.fold_in(key, i)`. A `GammaVarianceStage`
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
        stage_key = jax.random.fold_in(key, index)
        if isinstance(stage, GammaVarianceStage) and isinstance(stage.mean_model, MeanStage):
            found = [state for done, state in trained if done is stage.mean_model]
            if not found:
                raise ValueError(
                    f"run_stages: stage {stage.stage!r} needs the MeanStage "
                    f"{stage.mean_model.stage!r} to run before it."
                )
            mean = stage.mean_model.trained_model(found[0])
            state = stage.run(train_loader, validation_loader, event_sinks, stage_key, mean)
        else:
            state = stage.run(train_loader, validation_loader, event_sinks, stage_key)
        if isinstance(stage, MeanStage):
            trained.append((stage, state))
        states[stage.stage] = state
    return states
