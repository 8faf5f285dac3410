"""Metrics over class scores: accuracy, top-k accuracy, cross entropy, the confusion-matrix
metrics (precision, recall, F1), the expected calibration error and the binary AUROC.

Every one is a weighted count: a row counts `weight` times (once without weights), a pass
sums the counts of its batches and finalizes once, so its value never depends on how the
rows were batched. Counts are compensated float32 sums (`dew.metrics.Sum`, and its
elementwise form for the confusion matrix and the histograms). An empty pass finalizes to
NaN; a pass with rows whose weights are all zero raises `ValueError`. The conventions
(absent classes, the binary layout, the per-class names, the AUROC grid) are decision 0024.
"""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from dew._checks import check_ids
from dew._integers import check_integer
from dew.artifacts import Artifact, ClassScores
from dew.metrics._base import Metric, raise_if
from dew.metrics._regression import RowMeanState
from dew.metrics._sums import Sum, two_sum

__all__ = [
    "AUROC",
    "F1",
    "Accuracy",
    "ConfusionMatrix",
    "CrossEntropy",
    "ExpectedCalibrationError",
    "Precision",
    "Recall",
    "TopKAccuracy",
    "WeightedCounts",
]


def _labels(scores: ClassScores, name: str) -> Int[Array, " rows"]:
    """The labels as int32; traced ones checked to lie in `[0, classes)` (concrete ones
    were checked when the scores were built)."""
    labels = scores.labels
    if isinstance(labels, jax.core.Tracer):
        labels = check_ids(
            labels,
            scores.classes,
            subject=f"metric {name!r}: ClassScores.labels",
            noun="label",
            size_name="classes",
            axes=("row",),
        )
    return jnp.asarray(labels, jnp.int32)


def _weights(scores: ClassScores) -> Float[Array, " rows"]:
    if scores.weights is None:
        return jnp.ones((scores.num_rows,), jnp.float32)
    return jnp.asarray(scores.weights, jnp.float32)


def _no_counted_row(name: str) -> str:
    return (
        f"metric {name!r}: the pass has rows but no counted row (every row weight is zero), "
        "so there is nothing to score."
    )


def _finish(value: Array, rows: Sum, weight: Array, name: str) -> Float[Array, ""]:
    """`value`, NaN for an empty pass; raises where rows were seen but none counted."""
    empty = rows.value() == 0
    # A Python NaN, not a NaN array: eagerly, jax.debug_nans checks every array an op
    # builds, so only the empty pass may ever produce one.
    value = jnp.where(empty, jnp.nan, value)
    return raise_if(jnp.logical_and(~empty, weight == 0), _no_counted_row(name), value)


def _ratio(numerator: Array, denominator: Array) -> Array:
    """`numerator / denominator`, 0 where the denominator is 0 (`zero_division=0`)."""
    zero = denominator == 0
    return jnp.where(zero, 0.0, numerator / jnp.where(zero, 1.0, denominator))


# --- per-row means: accuracy, top-k accuracy, cross entropy ------------------------------


class _RowMean(Metric[ClassScores]):
    artifact_type: ClassVar[type[Artifact]] = ClassScores
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    def init(self) -> RowMeanState:
        return RowMeanState(Sum.zero(), Sum.zero(), Sum.zero())

    def merge(self, accumulated: RowMeanState, contribution: RowMeanState) -> RowMeanState:
        return accumulated.merge(contribution)

    def _state(self, values: Float[Array, " rows"], scores: ClassScores) -> RowMeanState:
        weights = _weights(scores)
        weighted = jnp.where(weights != 0, values * weights, jnp.zeros_like(values))
        return RowMeanState(Sum.of(weighted), Sum.of(weights), Sum.of(jnp.ones_like(weights)))

    def finalize(self, accumulated: RowMeanState) -> Float[Array, ""]:
        weight = accumulated.weight.value()
        return _finish(
            _ratio(accumulated.total.value(), weight), accumulated.rows, weight, self.name
        )


def _in_top_k(logits: Float[Array, "rows classes"], labels: Array, k: int) -> Array:
    """Whether each row's label is among its `k` highest logits, ties going to the lower
    class index (as `argmax` breaks them), so `k = 1` is the argmax's hit."""
    logits = jnp.asarray(logits, jnp.float32)
    own = jnp.take_along_axis(logits, labels[:, None], axis=1)
    index = jnp.arange(logits.shape[1])[None, :]
    ahead = (logits > own) | ((logits == own) & (index < labels[:, None]))
    return jnp.sum(ahead, axis=1) < k


class Accuracy(_RowMean):
    """The weighted fraction of rows whose argmax class (the lowest index among ties) is
    the label.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew.artifacts import ClassScores
    >>> metric = Accuracy()
    >>> scores = ClassScores(jnp.array([[2.0, 0.0], [2.0, 0.0]]), jnp.array([0, 1]),
    ...                      weights=jnp.array([3.0, 1.0]))
    >>> float(metric.finalize(metric.merge(metric.init(), metric(scores))))
    0.75

    ```
    """

    name: str = eqx.field(static=True, default="accuracy")
    direction: ClassVar[str | None] = "maximize"

    def statistics(self, artifact: ClassScores) -> RowMeanState:
        hits = _in_top_k(artifact.logits, _labels(artifact, self.name), 1)
        return self._state(hits.astype(jnp.float32), artifact)


class TopKAccuracy(_RowMean):
    """The weighted fraction of rows whose label is among the `k` highest logits (ties go
    to the lower class index). Scores of fewer than `k` classes raise `ValueError`."""

    k: int = eqx.field(static=True)
    name: str = eqx.field(static=True, default="top_k_accuracy")
    direction: ClassVar[str | None] = "maximize"

    def __check_init__(self) -> None:
        check_integer("k", self.k, minimum=1)

    def statistics(self, artifact: ClassScores) -> RowMeanState:
        if self.k > artifact.classes:
            raise ValueError(
                f"metric {self.name!r}: k={self.k} is more than the {artifact.classes} classes "
                f"the scores hold; k must be between 1 and {artifact.classes}."
            )
        hits = _in_top_k(artifact.logits, _labels(artifact, self.name), self.k)
        return self._state(hits.astype(jnp.float32), artifact)


class CrossEntropy(_RowMean):
    """The weighted mean of `-log softmax(logits)[label]`, in nats (`log_softmax` and
    `take_along_axis`, no one-hot)."""

    name: str = eqx.field(static=True, default="cross_entropy")
    direction: ClassVar[str | None] = "minimize"

    def statistics(self, artifact: ClassScores) -> RowMeanState:
        log_probs = jax.nn.log_softmax(jnp.asarray(artifact.logits, jnp.float32), axis=-1)
        labels = _labels(artifact, self.name)
        losses = -jnp.take_along_axis(log_probs, labels[:, None], axis=1)[:, 0]
        return self._state(losses, artifact)


# --- weighted counts: the confusion matrix and the histograms ----------------------------


class WeightedCounts(eqx.Module):
    """An array of compensated float32 counts `hi + lo` (elementwise TwoSum, as `Sum`),
    with the number of rows counted into it."""

    hi: Float[Array, "*shape"]
    lo: Float[Array, "*shape"]
    rows: Sum

    @staticmethod
    def zero(shape: tuple[int, ...]) -> WeightedCounts:
        """Nothing counted."""
        zeros = jnp.zeros(shape, jnp.float32)
        return WeightedCounts(zeros, zeros, Sum.zero())

    @staticmethod
    def of(
        shape: tuple[int, ...], index: Int[Array, " rows"], weights: Float[Array, " rows"]
    ) -> WeightedCounts:
        """Each row's weight added at its flat `index` of an array of `shape`."""
        flat = jnp.zeros((math.prod(shape),), jnp.float32)
        counts = flat.at[index].add(weights).reshape(shape)
        return WeightedCounts(counts, jnp.zeros_like(counts), Sum.of(jnp.ones_like(weights)))

    def merge(self, other: WeightedCounts) -> WeightedCounts:
        """Add two counts."""
        hi, error = two_sum(self.hi, other.hi)
        hi, lo = two_sum(hi, error + self.lo + other.lo)
        return WeightedCounts(hi, lo, self.rows.add(other.rows))

    def value(self) -> Float[Array, "*shape"]:
        """The counts rounded to float32."""
        return self.hi + self.lo


class ConfusionMatrix(eqx.Module):
    """Weighted counts of (true class, predicted class) pairs: the sufficient statistics of
    precision, recall and F1. `counts.value()[t, p]` is the weight of the rows labelled
    `t` whose argmax (the lowest index among ties) is `p`.

    The per-class ratios define absent classes as scikit-learn's `zero_division=0`: a
    ratio whose denominator is zero (a class never predicted, for precision; never
    true, for recall; neither, for F1) is 0.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew.artifacts import ClassScores
    >>> scores = ClassScores(jnp.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), jnp.array([0, 1]))
    >>> matrix = ConfusionMatrix.of(scores)
    >>> matrix.counts.value().tolist()
    [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    >>> matrix.precision().tolist(), matrix.recall().tolist()
    ([0.5, 0.0, 0.0], [1.0, 0.0, 0.0])

    ```
    """

    counts: WeightedCounts

    @staticmethod
    def zero(classes: int) -> ConfusionMatrix:
        """Nothing counted, over `classes` classes."""
        return ConfusionMatrix(WeightedCounts.zero((classes, classes)))

    @staticmethod
    def of(scores: ClassScores, *, name: str = "confusion_matrix") -> ConfusionMatrix:
        """The confusion matrix of one batch (`name` goes in a traced label check's message)."""
        labels = _labels(scores, name)
        predicted = jnp.argmax(jnp.asarray(scores.logits, jnp.float32), axis=1)
        classes = scores.classes
        index = labels * classes + predicted.astype(jnp.int32)
        return ConfusionMatrix(WeightedCounts.of((classes, classes), index, _weights(scores)))

    def merge(self, other: ConfusionMatrix) -> ConfusionMatrix:
        """Add two confusion matrices."""
        return ConfusionMatrix(self.counts.merge(other.counts))

    def _outcomes(self) -> tuple[Array, Array, Array]:
        counts = self.counts.value()
        hits = jnp.diagonal(counts)
        return hits, jnp.sum(counts, axis=0) - hits, jnp.sum(counts, axis=1) - hits

    def precision(self) -> Float[Array, " classes"]:
        """Each class's `tp / (tp + fp)`, 0 for a class never predicted."""
        hits, false_positives, _ = self._outcomes()
        return _ratio(hits, hits + false_positives)

    def recall(self) -> Float[Array, " classes"]:
        """Each class's `tp / (tp + fn)`, 0 for a class never true."""
        hits, _, false_negatives = self._outcomes()
        return _ratio(hits, hits + false_negatives)

    def f1(self) -> Float[Array, " classes"]:
        """Each class's `2 tp / (2 tp + fp + fn)`, the harmonic mean of precision and recall,
        0 for a class neither true nor predicted."""
        hits, false_positives, false_negatives = self._outcomes()
        return _ratio(2.0 * hits, 2.0 * hits + false_positives + false_negatives)


class _ConfusionMetric(Metric[ClassScores]):
    artifact_type: ClassVar[type[Artifact]] = ClassScores
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing
    classes: eqx.AbstractVar[int]
    class_index: eqx.AbstractVar[int | None]

    def __check_init__(self) -> None:
        check_integer("classes", self.classes, minimum=2)
        check_integer(
            "class_index", self.class_index, minimum=0, maximum=self.classes - 1, optional=True
        )

    def init(self) -> ConfusionMatrix:
        return ConfusionMatrix.zero(self.classes)

    def statistics(self, artifact: ClassScores) -> ConfusionMatrix:
        if artifact.classes != self.classes:
            raise ValueError(
                f"metric {self.name!r} counts {self.classes} classes, but the scores hold "
                f"{artifact.classes} (logits of shape {tuple(artifact.logits.shape)})."
            )
        return ConfusionMatrix.of(artifact, name=self.name)

    def merge(self, accumulated: ConfusionMatrix, contribution: ConfusionMatrix) -> ConfusionMatrix:
        return accumulated.merge(contribution)

    def _reduced(self, per_class: Array, accumulated: ConfusionMatrix) -> Float[Array, ""]:
        value = jnp.mean(per_class) if self.class_index is None else per_class[self.class_index]
        counts = accumulated.counts
        return _finish(value, counts.rows, jnp.sum(counts.value()), self.name)


class Precision(_ConfusionMetric):
    """Precision from the pass's `ConfusionMatrix`: the unweighted mean over all `classes`
    (macro), or with `class_index` that class's alone. A class never predicted scores 0."""

    classes: int = eqx.field(static=True)
    class_index: int | None = eqx.field(static=True, default=None)
    name: str = eqx.field(static=True, default="precision")
    direction: ClassVar[str | None] = "maximize"

    def finalize(self, accumulated: ConfusionMatrix) -> Float[Array, ""]:
        return self._reduced(accumulated.precision(), accumulated)


class Recall(_ConfusionMetric):
    """Recall from the pass's `ConfusionMatrix`, macro or of one class (`class_index`). A
    class never true scores 0."""

    classes: int = eqx.field(static=True)
    class_index: int | None = eqx.field(static=True, default=None)
    name: str = eqx.field(static=True, default="recall")
    direction: ClassVar[str | None] = "maximize"

    def finalize(self, accumulated: ConfusionMatrix) -> Float[Array, ""]:
        return self._reduced(accumulated.recall(), accumulated)


class F1(_ConfusionMetric):
    """F1 from the pass's `ConfusionMatrix`, macro (the mean of the per-class F1s, not the
    F1 of macro precision and recall) or of one class. A class neither true nor predicted
    scores 0."""

    classes: int = eqx.field(static=True)
    class_index: int | None = eqx.field(static=True, default=None)
    name: str = eqx.field(static=True, default="f1")
    direction: ClassVar[str | None] = "maximize"

    def finalize(self, accumulated: ConfusionMatrix) -> Float[Array, ""]:
        return self._reduced(accumulated.f1(), accumulated)


def _grid(points: int) -> Float[Array, " points"]:
    """`points` equally spaced values from 0 to 1, as `torch.linspace(0, 1, points)`."""
    return jnp.linspace(0.0, 1.0, points, dtype=jnp.float32)


class ExpectedCalibrationError(Metric[ClassScores]):
    """The L1 expected calibration error over `bins` equal-width bins of the confidence,
    the max softmax probability: `sum_b |sum_{i in b} w_i (correct_i - confidence_i)| /
    sum_i w_i`, where `correct` is whether the argmax is the label. Bin `b` holds the
    confidences in `[b / bins, (b + 1) / bins)`, the last one also 1. The state is the
    weighted count, confidence and correct sums of each bin, `bins` wide whatever the pass.
    """

    bins: int = eqx.field(static=True, default=15)
    name: str = eqx.field(static=True, default="expected_calibration_error")
    direction: ClassVar[str | None] = "minimize"
    artifact_type: ClassVar[type[Artifact]] = ClassScores
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    def __check_init__(self) -> None:
        check_integer("bins", self.bins, minimum=1)

    def init(self) -> WeightedCounts:
        return WeightedCounts.zero((3, self.bins))

    def statistics(self, artifact: ClassScores) -> WeightedCounts:
        probabilities = jax.nn.softmax(jnp.asarray(artifact.logits, jnp.float32), axis=-1)
        confidence = jnp.max(probabilities, axis=1)
        correct = _in_top_k(artifact.logits, _labels(artifact, self.name), 1)
        edges = _grid(self.bins + 1)
        which = jnp.clip(jnp.searchsorted(edges, confidence, side="right") - 1, 0, self.bins - 1)
        weights = _weights(artifact)
        which = which.astype(jnp.int32)
        parts = [
            WeightedCounts.of((self.bins,), which, values)
            for values in (weights, weights * confidence, jnp.where(correct, weights, 0.0))
        ]
        stacked = jnp.stack([part.hi for part in parts])
        return WeightedCounts(stacked, jnp.zeros_like(stacked), parts[0].rows)

    def merge(self, accumulated: WeightedCounts, contribution: WeightedCounts) -> WeightedCounts:
        return accumulated.merge(contribution)

    def finalize(self, accumulated: WeightedCounts) -> Float[Array, ""]:
        count, confidence, correct = accumulated.value()
        total = jnp.sum(count)
        error = _ratio(jnp.sum(jnp.abs(correct - confidence)), total)
        return _finish(error, accumulated.rows, total, self.name)


class AUROC(Metric[ClassScores]):
    """The binary area under the ROC curve over a fixed grid of `thresholds` equally spaced
    from 0 to 1 (at least 2), as torchmetrics' `BinaryAUROC(thresholds=N)`.

    The scores are 2-class `ClassScores`; a row's score is `softmax(logits)[1]`, p(class
    1), and class 1 is the positive class. The state is a weighted histogram of the scores
    by class over the grid's cells, `(2, thresholds)` whatever the pass: at threshold `t`
    the true and false positive rates count the scores `>= t`. The curve runs through those
    points and (0, 0), and the area is the trapezoid rule's; it is exact where the scores
    take grid values, and within half the weight of positive-negative pairs sharing a cell
    of the exact AUROC otherwise. A pass without a counted positive or negative row
    finalizes to NaN.
    """

    thresholds: int = eqx.field(static=True, default=200)
    name: str = eqx.field(static=True, default="auroc")
    direction: ClassVar[str | None] = "maximize"
    artifact_type: ClassVar[type[Artifact]] = ClassScores
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    def __check_init__(self) -> None:
        check_integer("thresholds", self.thresholds, minimum=2)

    def init(self) -> WeightedCounts:
        return WeightedCounts.zero((2, self.thresholds))

    def statistics(self, artifact: ClassScores) -> WeightedCounts:
        if artifact.classes != 2:
            raise ValueError(
                f"metric {self.name!r} is binary: it needs scores of 2 classes (class 1 the "
                f"positive one), got {artifact.classes} (logits of shape "
                f"{tuple(artifact.logits.shape)})."
            )
        labels = _labels(artifact, self.name)
        score = jax.nn.softmax(jnp.asarray(artifact.logits, jnp.float32), axis=-1)[:, 1]
        cell = jnp.searchsorted(_grid(self.thresholds), score, side="right") - 1
        cell = jnp.clip(cell, 0, self.thresholds - 1).astype(jnp.int32)
        return WeightedCounts.of(
            (2, self.thresholds), labels * self.thresholds + cell, _weights(artifact)
        )

    def merge(self, accumulated: WeightedCounts, contribution: WeightedCounts) -> WeightedCounts:
        return accumulated.merge(contribution)

    def finalize(self, accumulated: WeightedCounts) -> Float[Array, ""]:
        histogram = accumulated.value()
        # Weighted counts of scores >= each threshold, with (0, 0) past the last one.
        at_least = jnp.cumsum(histogram[:, ::-1], axis=1)[:, ::-1]
        at_least = jnp.concatenate([at_least, jnp.zeros((2, 1), jnp.float32)], axis=1)
        negatives, positives = at_least[0, 0], at_least[1, 0]
        fpr = _ratio(at_least[0], negatives)
        tpr = _ratio(at_least[1], positives)
        area = jnp.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2.0)
        one_sided = jnp.logical_or(negatives == 0, positives == 0)
        total = negatives + positives
        area = jnp.where(jnp.logical_and(one_sided, total > 0), jnp.nan, area)
        return _finish(area, accumulated.rows, total, self.name)
