"""Metrics over supervised regression scores: the loss, RMSE and the Gaussian point CRPS.

Each is a weighted mean over rows, so a pass sums `weight * value` and the weights
over every batch and divides once: the value of a pass never depends on how its rows
were batched.
"""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jax.scipy.stats import norm
from jaxtyping import Array, Float

from dew.artifacts import Artifact, RegressionScores
from dew.metrics._base import Metric, raise_if
from dew.metrics._sums import Sum

__all__ = ["RMSE", "PointCRPS", "RowLoss", "RowMeanState", "gaussian_crps"]


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


class RowMeanState(eqx.Module):
    """Sums of weighted per-row values, of row weights, and of the rows seen."""

    total: Sum
    weight: Sum
    rows: Sum

    def merge(self, other: RowMeanState) -> RowMeanState:
        """The sums of both states, term by term."""
        return RowMeanState(
            self.total.add(other.total), self.weight.add(other.weight), self.rows.add(other.rows)
        )


def _per_row(values: Float[Array, " rows *value"]) -> Float[Array, " rows"]:
    """The mean of each row over its trailing axes."""
    values = jnp.asarray(values, jnp.float32)
    return jnp.mean(jnp.reshape(values, (values.shape[0], -1)), axis=1)


def _row_mean_state(values: Float[Array, " rows"], weights: Float[Array, " rows"]) -> RowMeanState:
    weights = jnp.asarray(weights, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    weighted = jnp.where(weights != 0, values * weights, jnp.zeros_like(values))
    return RowMeanState(Sum.of(weighted), Sum.of(weights), Sum.of(jnp.ones_like(weights)))


def _weighted_mean(state: RowMeanState, name: str) -> Float[Array, ""]:
    weight = state.weight.value()
    empty = state.rows.value() == 0
    safe = jnp.where(weight == 0, jnp.ones_like(weight), weight)
    # A Python NaN, not a NaN array: eagerly, jax.debug_nans checks every array an op
    # builds, so only the empty pass may ever produce one.
    mean = jnp.where(empty, jnp.nan, state.total.value() / safe)
    return raise_if(
        jnp.logical_and(~empty, weight == 0),
        f"metric {name!r}: the pass has rows but no counted row (every row weight is zero), "
        "so there is nothing to average.",
        mean,
    )


class _RowMetric(Metric[RegressionScores]):
    artifact_type: ClassVar[type[Artifact]] = RegressionScores
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    def init(self) -> RowMeanState:
        return RowMeanState(Sum.zero(), Sum.zero(), Sum.zero())

    def merge(self, accumulated: RowMeanState, contribution: RowMeanState) -> RowMeanState:
        return accumulated.merge(contribution)

    def _require(self, artifact: RegressionScores, *fields: str) -> None:
        missing = [field for field in fields if getattr(artifact, field) is None]
        if missing:
            raise ValueError(
                f"metric {self.name!r} needs RegressionScores.{' and .'.join(fields)}, but these "
                f"scores carry no {' or '.join(missing)}; give the objective a predictive "
                "distribution (SupervisedObjective(..., predictive=...))."
            )


class RowLoss(_RowMetric):
    """The weighted mean of the rows' losses, `sum(weight * loss) / sum(weight)`.

    An empty pass finalizes to NaN; a pass whose row weights are all zero raises
    `ValueError`.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew.artifacts import RegressionScores
    >>> metric = RowLoss()
    >>> scores = RegressionScores(losses=jnp.array([1.0, 3.0]), weights=jnp.array([1.0, 3.0]))
    >>> float(metric.finalize(metric.merge(metric.init(), metric(scores))))
    2.5

    ```
    """

    name: str = eqx.field(static=True, default="loss")
    direction: ClassVar[str | None] = "minimize"

    def statistics(self, artifact: RegressionScores) -> RowMeanState:
        return _row_mean_state(artifact.losses, artifact.weights)

    def finalize(self, accumulated: RowMeanState) -> Float[Array, ""]:
        return _weighted_mean(accumulated, self.name)


class RMSE(_RowMetric):
    """Root mean squared error of the point predictions: the square root of the
    weighted mean over rows of each row's mean squared error `mean((mean - targets)²)`.

    Needs `RegressionScores.mean` and `.targets`; the empty-pass and zero-weight rules
    of `RowLoss` apply.
    """

    name: str = eqx.field(static=True, default="rmse")
    direction: ClassVar[str | None] = "minimize"

    def statistics(self, artifact: RegressionScores) -> RowMeanState:
        self._require(artifact, "mean", "targets")
        errors = jnp.square(
            jnp.asarray(artifact.targets, jnp.float32) - jnp.asarray(artifact.mean, jnp.float32)
        )
        return _row_mean_state(_per_row(errors), artifact.weights)

    def finalize(self, accumulated: RowMeanState) -> Float[Array, ""]:
        return jnp.sqrt(_weighted_mean(accumulated, self.name))


class PointCRPS(_RowMetric):
    """The continuous ranked probability score of the Gaussian predictive distribution
    `N(mean, std²)` at the targets (`gaussian_crps`), as a weighted mean over rows of
    each row's mean CRPS. Lower is better; for a point prediction (`std -> 0`) it
    tends to the absolute error.

    Needs `RegressionScores.mean`, `.std` and `.targets`; the empty-pass and
    zero-weight rules of `RowLoss` apply.
    """

    name: str = eqx.field(static=True, default="point_crps")
    direction: ClassVar[str | None] = "minimize"

    def statistics(self, artifact: RegressionScores) -> RowMeanState:
        self._require(artifact, "mean", "std", "targets")
        crps = gaussian_crps(
            jnp.asarray(artifact.mean, jnp.float32),
            jnp.asarray(artifact.std, jnp.float32),
            jnp.asarray(artifact.targets, jnp.float32),
        )
        return _row_mean_state(_per_row(crps), artifact.weights)

    def finalize(self, accumulated: RowMeanState) -> Float[Array, ""]:
        return _weighted_mean(accumulated, self.name)
