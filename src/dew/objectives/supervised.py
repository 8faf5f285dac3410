"""Supervised learning: a model trained by a loss of its predictions on (inputs, targets)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from dew._accumulate import wide_dtype
from dew.artifacts import RegressionScores
from dew.metrics import Metric, loss, point_crps, rmse
from dew.naming import Split
from dew.objectives.base import Batch, Objective, check_batch_keys, combine, trainable

__all__ = ["SupervisedObjective"]

Loss = Callable[..., Array]
"""`loss(model, inputs, targets, sample_weight, key, training)`: a scalar, or one value per row."""

Predictive = Callable[[PyTree, Any], tuple[Array, Array | None]]
"""`predictive(model, inputs) -> (mean, std)`: a Gaussian predictive distribution per row."""


class SupervisedObjective(Objective):
    """Train `model` by `loss(model, inputs, targets, sample_weight, key, training)`.

    A batch holds `"inputs"` and `"targets"` (arrays or pytrees with a leading row
    axis) and optionally `"sample_weight"`, one weight per row (`None`: every row
    weighs one). `loss` sees the model with the current params and `training=True`
    in `loss`, `False` in `evaluate`. It returns either

    - a scalar, the batch's loss; a pass then weighs each batch by its rows (every
      row carries its batch's loss, with weight one), or
    - one value per row, shape `(rows,)`; the batch's loss is then their
      sample-weighted mean, and a pass weighs each row by its sample weight.

    `evaluate` returns `RegressionScores`, which `metrics.loss()` reduces. Given a
    `predictive(model, inputs) -> (mean, std)`, the scores also carry the point
    predictions `mean`, the targets and the predictive standard deviation `std`
    (broadcast to `mean`'s shape; `None` for a point prediction), so `metrics.rmse()`
    and `metrics.point_crps()` reduce them too.

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> def squared_error(model, inputs, targets, sample_weight, key, training):
    ...     return jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets))
    >>> objective = SupervisedObjective(eqx.nn.Linear(1, 1, key=jax.random.key(0)), squared_error)
    >>> batch = {"inputs": jnp.ones((4, 1)), "targets": jnp.zeros((4, 1))}
    >>> scores = objective.evaluate(objective.init_params(), batch, jax.random.key(1))
    >>> scores.losses.shape, float(scores.weights.sum())
    ((4,), 4.0)

    ```
    """

    model: PyTree
    loss_function: Loss
    predictive: Predictive | None
    name: str = eqx.field(static=True)

    def __init__(
        self,
        model: PyTree,
        loss: Loss,
        *,
        predictive: Predictive | None = None,
        name: str = "supervised",
    ) -> None:
        if not callable(loss):
            raise TypeError(f"SupervisedObjective needs a callable loss, got {loss!r}.")
        if predictive is not None and not callable(predictive):
            raise TypeError(
                f"SupervisedObjective's predictive must be callable or None, got {predictive!r}."
            )
        self.model = model
        self.loss_function = loss
        self.predictive = predictive
        self.name = name

    def init_params(self) -> PyTree:
        return trainable(self.model)

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        return {"inputs": None, "targets": None}

    def check_batch(self, batch: Batch) -> None:
        self._fields(batch)

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        inputs, targets, sample_weight = self._fields(batch)
        model = combine(params, self.model)
        values = self.loss_function(model, inputs, targets, sample_weight, key, True)
        values, weights = _row_values(values, sample_weight, _rows(inputs))
        if weights is None:
            return values, {}
        return jnp.sum(values * weights) / jnp.sum(weights), {}

    def loss_weight(self, batch: Batch) -> Float[Array, ""]:
        """The sum of the batch's `sample_weight`, else its rows: the loss's denominator
        (`WeighsLoss`), what a micro-batch weighs in an accumulated step (a scalar loss
        is taken to weigh its rows as the `sample_weight` it is given says)."""
        inputs, _, sample_weight = self._fields(batch)
        if sample_weight is None:
            return jnp.asarray(_rows(inputs), jnp.float32)
        weights = jnp.asarray(sample_weight)  # in the loss's precision (float64 stays)
        return jnp.sum(weights.astype(wide_dtype(weights.dtype)))

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> RegressionScores:
        inputs, targets, sample_weight = self._fields(batch)
        model = combine(params, self.model)
        rows = _rows(inputs)
        values = self.loss_function(model, inputs, targets, sample_weight, key, False)
        values, weights = _row_values(values, sample_weight, rows)
        if weights is None:  # a batch loss: each row carries it, weighing one
            values = jnp.broadcast_to(values, (rows,))
            weights = jnp.ones((rows,), values.dtype)
        if self.predictive is None:
            return RegressionScores(values, weights)
        mean, std = self.predictive(model, inputs)
        if std is not None:
            std = jnp.broadcast_to(std, jnp.shape(mean))
        return RegressionScores(values, weights, mean, std, targets)

    def _fields(self, batch: Batch) -> tuple[Any, Any, Any]:
        check_batch_keys(self, batch, Split.TRAIN)
        return batch["inputs"], batch["targets"], batch.get("sample_weight")

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> None:
        """None: a supervised run previews its scoring artifact."""
        return None

    def default_metrics(self) -> tuple[Metric, ...]:
        """The loss, and with a `predictive` also the RMSE and the point CRPS."""
        if self.predictive is None:
            return (loss(),)
        return (loss(), rmse(), point_crps())


def _rows(inputs: Any) -> int:
    leaves = jax.tree.leaves(inputs)
    if not leaves or not jnp.shape(leaves[0]):
        raise ValueError("SupervisedObjective needs inputs with a leading row axis.")
    return int(jnp.shape(leaves[0])[0])


def _row_values(
    values: Any, sample_weight: Any, rows: int
) -> tuple[Float[Array, "*rows"], Float[Array, " rows"] | None]:
    """The loss's value(s), and, for one value per row, the rows' weights (`None` for a
    scalar loss, which a pass weighs by the batch's rows)."""
    values = jnp.asarray(values)
    if values.ndim == 0:
        return values, None
    if values.shape != (rows,):
        raise ValueError(
            f"SupervisedObjective's loss must return a scalar or one value per row, shape "
            f"({rows},), got shape {values.shape}."
        )
    if sample_weight is None:
        return values, jnp.ones((rows,), values.dtype)
    return values, jnp.reshape(jnp.asarray(sample_weight), (rows,)).astype(values.dtype)
