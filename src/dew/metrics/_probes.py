"""Representation probes: fit on the first half of each batch, test on the second.

Their values depend on how the batches are split, by design: they report the
mean of the batch accuracies, not a probe over the full dataset, and their names
say so (`batch_linear_probe_accuracy`, `batch_knn_probe_accuracy`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from dew._checks import check_ids
from dew._integers import check_integer
from dew.artifacts import Artifact, Representations
from dew.metrics._base import MeanState, Metric

__all__ = ["KNNProbe", "LinearProbe", "knn_probe_accuracy", "linear_probe_accuracy"]


def _halves(features: Array, labels: Array) -> tuple[Array, Array, Array, Array]:
    half = features.shape[0] // 2
    return features[:half], labels[:half], features[half:], labels[half:]


def linear_probe_accuracy(
    features: Float[Array, "rows dim"],
    labels: Int[Array, " rows"],
    num_classes: int,
    l2: float,
) -> Float[Array, ""]:
    """Accuracy on the second half of a ridge-regression classifier fitted on the first.

    The classifier regresses one-hot labels on the features plus a bias column,
    with penalty `l2` on the weights (not the bias), and predicts the argmax.
    """
    train_x, train_y, test_x, test_y = _halves(jnp.asarray(features, jnp.float32), labels)
    mean = jnp.mean(train_x, axis=0, keepdims=True)
    train_x, test_x = train_x - mean, test_x - mean
    targets = jax.nn.one_hot(train_y, num_classes, dtype=jnp.float32)
    gram = train_x.T @ train_x + l2 * jnp.eye(train_x.shape[1], dtype=jnp.float32)
    bias = jnp.mean(targets, axis=0, keepdims=True)
    weights = jnp.linalg.solve(gram, train_x.T @ (targets - bias))
    predictions = jnp.argmax(test_x @ weights + bias, axis=-1)
    return jnp.mean((predictions == test_y).astype(jnp.float32))


def knn_probe_accuracy(
    features: Float[Array, "rows dim"],
    labels: Int[Array, " rows"],
    num_classes: int,
    k: int,
) -> Float[Array, ""]:
    """Accuracy on the second half of a k-nearest-neighbour vote over the first half.

    Neighbours by Euclidean distance; the vote counts each neighbour once and a
    tie goes to the smallest class index.
    """
    train_x, train_y, test_x, test_y = _halves(jnp.asarray(features, jnp.float32), labels)
    k = min(k, train_x.shape[0])
    distances = (
        jnp.sum(test_x * test_x, axis=1)[:, None]
        - 2.0 * test_x @ train_x.T
        + jnp.sum(train_x * train_x, axis=1)[None, :]
    )
    _, nearest = jax.lax.top_k(-distances, k)
    votes = jnp.sum(jax.nn.one_hot(train_y[nearest], num_classes, dtype=jnp.float32), axis=1)
    predictions = jnp.argmax(votes, axis=-1)
    return jnp.mean((predictions == test_y).astype(jnp.float32))


class _Probe(Metric[Representations]):
    artifact_type: ClassVar[type[Artifact]] = Representations

    def init(self) -> MeanState:
        return MeanState.zero()

    def merge(self, accumulated: MeanState, contribution: MeanState) -> MeanState:
        return accumulated.merge(contribution)

    def finalize(self, accumulated: MeanState) -> Float[Array, ""]:
        return accumulated.mean()

    def _checked(self, artifact: Representations) -> tuple[Array, Array]:
        if artifact.labels is None:
            raise ValueError(f"metric {self.name!r} needs Representations.labels.")
        if artifact.features.shape[0] < 2:
            raise ValueError(
                f"metric {self.name!r} fits on the first half of a batch and tests on the "
                f"second, so it needs at least 2 rows, got {artifact.features.shape[0]}."
            )
        labels = check_ids(
            artifact.labels,
            self.num_classes,  # pyright: ignore[reportAttributeAccessIssue]  (every probe has it)
            subject=f"metric {self.name!r}: Representations.labels",
            noun="label",
            size_name="num_classes",
            axes=("row",),
        )
        return artifact.features, labels


class LinearProbe(_Probe):
    """Mean over batches of a ridge linear probe's accuracy (first half fits, second tests)."""

    num_classes: int = eqx.field(static=True)
    l2: float = eqx.field(static=True, default=1e-3)
    name: str = eqx.field(static=True, default="batch_linear_probe_accuracy")
    direction: ClassVar[str | None] = "maximize"

    def __check_init__(self) -> None:
        check_integer("num_classes", self.num_classes, minimum=1)
        if not (isinstance(self.l2, int | float) and math.isfinite(self.l2) and self.l2 > 0):
            raise ValueError(f"l2 must be a finite number > 0, got {self.l2!r}.")

    def statistics(self, artifact: Representations) -> MeanState:
        features, labels = self._checked(artifact)
        accuracy = linear_probe_accuracy(features, labels, self.num_classes, self.l2)
        return MeanState.of(accuracy[None])


class KNNProbe(_Probe):
    """Mean over batches of a k-nearest-neighbour probe's accuracy (first half votes)."""

    num_classes: int = eqx.field(static=True)
    k: int = eqx.field(static=True, default=5)
    name: str = eqx.field(static=True, default="batch_knn_probe_accuracy")
    direction: ClassVar[str | None] = "maximize"

    def __check_init__(self) -> None:
        check_integer("num_classes", self.num_classes, minimum=1)
        check_integer("k", self.k, minimum=1)

    def statistics(self, artifact: Representations) -> MeanState:
        features, labels = self._checked(artifact)
        accuracy = knn_probe_accuracy(features, labels, self.num_classes, self.k)
        return MeanState.of(accuracy[None])
