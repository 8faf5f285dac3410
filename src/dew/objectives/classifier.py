"""Classification: a model trained by the (weighted) cross entropy of its logits."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from dew._integers import check_integer
from dew.artifacts import ClassScores
from dew.metrics import Metric, accuracy, cross_entropy, expected_calibration_error, f1
from dew.naming import Split
from dew.objectives._images import checked_labels
from dew.objectives.base import Batch, Objective, check_batch_keys, combine, trainable

__all__ = ["INPUTS", "ClassifierObjective", "PooledClassifier"]

INPUTS = "inputs"
"""The batch key a `ClassifierObjective` reads its inputs from unless told otherwise (the
registry's `"classifier"` entry too): a classifier reads any inputs, not images alone, and
`SupervisedObjective` reads the same key."""


class ClassifierObjective(Objective):
    """Train `model` by the cross entropy of its logits against integer class labels.

    **Arguments:**

    - `model`: maps one example of `batch[inputs]` to its `(classes,)` logits; the
      objective maps it over the batch's rows (`jax.vmap`), as dew's backbones map one
      example.
    - `classes`: the number of classes (at least 2); labels must lie in `[0, classes)`.
    - `inputs`: the batch key of the inputs (default `"inputs"`, `INPUTS`; `"images"` for
      `shapes`).
    - `name`: the run's stage name (default `classifier`).

    A batch holds `batch[inputs]` (an array or pytree with a leading row axis),
    `batch["labels"]`, integer `(rows,)`, and optionally `batch["sample_weight"]`, one
    weight per row. The loss is the sample-weighted mean cross entropy; `evaluate` returns
    `ClassScores` (logits, labels, weights), which every classification metric reads.

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> objective = ClassifierObjective(eqx.nn.Linear(4, 3, key=jax.random.key(0)), classes=3)
    >>> batch = {"inputs": jnp.ones((5, 4)), "labels": jnp.array([0, 1, 2, 0, 1])}
    >>> scores = objective.evaluate(objective.init_params(), batch, jax.random.key(1))
    >>> scores.logits.shape, scores.classes
    ((5, 3), 3)

    ```
    """

    model: PyTree
    classes: int = eqx.field(static=True)
    inputs: str = eqx.field(static=True)
    name: str = eqx.field(static=True)

    def __init__(
        self, model: PyTree, classes: int, *, inputs: str = INPUTS, name: str = "classifier"
    ) -> None:
        if not callable(model):
            raise TypeError(f"ClassifierObjective needs a callable model, got {model!r}.")
        self.model = model
        self.classes = check_integer("classes", classes, minimum=2)
        if not isinstance(inputs, str) or not inputs:
            raise ValueError(f"ClassifierObjective's inputs must be a batch key, got {inputs!r}.")
        self.inputs = inputs
        self.name = name

    def init_params(self) -> PyTree:
        return trainable(self.model)

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        return {self.inputs: "its `inputs` field", "labels": None}

    def check_batch(self, batch: Batch) -> None:
        self._fields(batch)

    def _fields(self, batch: Batch) -> tuple[Any, Array, Array | None]:
        check_batch_keys(self, batch, Split.TRAIN)
        inputs = batch[self.inputs]
        leaves = jax.tree.leaves(inputs)
        if not leaves or not jnp.shape(leaves[0]):
            raise ValueError(
                f"ClassifierObjective needs batch[{self.inputs!r}] with a leading row axis."
            )
        rows = int(jnp.shape(leaves[0])[0])
        labels = checked_labels(
            "ClassifierObjective", batch["labels"], rows, self.classes, "classes"
        )
        weights = batch.get("sample_weight")
        if weights is not None:
            if tuple(jnp.shape(weights)) != (rows,):
                raise ValueError(
                    "ClassifierObjective needs one weight per row in batch['sample_weight'], "
                    f"shaped ({rows},), got shape {tuple(jnp.shape(weights))}."
                )
            weights = jnp.asarray(weights, jnp.float32)
        return inputs, labels, weights

    def _scores(self, params: PyTree, batch: Batch) -> ClassScores:
        inputs, labels, weights = self._fields(batch)
        model = combine(params, self.model)
        logits = jnp.asarray(jax.vmap(model)(inputs), jnp.float32)
        if logits.shape[1:] != (self.classes,):
            raise ValueError(
                f"ClassifierObjective's model must map each example to {self.classes} logits, "
                f"got logits of shape {logits.shape} for the batch."
            )
        return ClassScores(logits, labels, weights)

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        scores = self._scores(params, batch)
        log_probs = jax.nn.log_softmax(scores.logits, axis=-1)
        losses = -jnp.take_along_axis(log_probs, scores.labels[:, None], axis=1)[:, 0]
        if scores.weights is None:
            return jnp.mean(losses), {}
        return jnp.sum(losses * scores.weights) / jnp.sum(scores.weights), {}

    def loss_weight(self, batch: Batch) -> Float[Array, ""]:
        """The sum of the batch's `sample_weight`, else its rows: the loss's denominator
        (`WeighsLoss`), what a micro-batch weighs in an accumulated step."""
        weights = batch.get("sample_weight")
        if weights is None:
            return jnp.asarray(jnp.shape(jax.tree.leaves(batch[self.inputs])[0])[0], jnp.float32)
        return jnp.sum(jnp.asarray(weights, jnp.float32))

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> ClassScores:
        return self._scores(params, batch)

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> None:
        """None: a classifier previews its scoring artifact."""
        return None

    def default_metrics(self) -> tuple[Metric, ...]:
        """Accuracy, cross entropy, macro F1 and the expected calibration error (15 bins)."""
        return (accuracy(), cross_entropy(), f1(self.classes), expected_calibration_error())


class PooledClassifier(eqx.Module):
    """An encoder of one example into tokens `(tokens, features)` (a `ViT`), their mean,
    and a linear map to `classes` logits: the model `tiny_classifier` trains."""

    encoder: PyTree
    head: eqx.nn.Linear

    def __init__(self, encoder: PyTree, features: int, classes: int, *, key: PRNGKeyArray):
        self.encoder = encoder
        self.head = eqx.nn.Linear(features, classes, key=key)

    def __call__(self, example: Array) -> Float[Array, " classes"]:
        """The logits of one example."""
        return self.head(jnp.mean(self.encoder(example), axis=0))
