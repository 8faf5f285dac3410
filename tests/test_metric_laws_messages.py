"""`check_metric_laws`' failure messages: the law that broke, the shrunk example and the two
finalized values, before NumPy's text.

Each broken metric reads artifacts drawn from a few fixed ones of one shape (the metric
compiles once, and shrinking only picks among them), whose every loss in row `r` is a
known number, so each test recomputes the values the message must show.
"""

import re
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from dew.artifacts import Artifact, TokenScores
from dew.metrics import Metric
from dew.testing import check_metric_laws

NUMPY_TEXT = "Not equal to tolerance"


def _scores(*row_losses: float) -> TokenScores:
    """Two positions per row, each with the row's loss, all counted."""
    losses = jnp.asarray([[loss, loss] for loss in row_losses], jnp.float32)
    return TokenScores(losses, jnp.ones_like(losses))


CANDIDATES = [_scores(1.0, 1.0), _scores(2.0, 4.0), _scores(8.0, 16.0)]


class _MeanOfRows(Metric[TokenScores]):
    """(total loss, count) statistics: a correct mean loss, broken in one way per subclass."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores

    def init(self):
        return jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)

    def statistics(self, artifact):
        return jnp.sum(artifact.losses * artifact.weights), jnp.sum(artifact.weights)

    def merge(self, accumulated, contribution):
        return accumulated[0] + contribution[0], accumulated[1] + contribution[1]

    def finalize(self, accumulated):
        return accumulated[0] / accumulated[1]


class MidpointMerge(_MeanOfRows):
    """Each statistic as its mean; merging two non-empty ones takes their midpoint."""

    name: str = eqx.field(static=True, default="midpoint_merge")

    def statistics(self, artifact):
        total, count = super().statistics(artifact)
        return total / count, count

    def merge(self, accumulated, contribution):
        midpoint = 0.5 * (accumulated[0] + contribution[0])
        value = jnp.where(
            accumulated[1] == 0,
            contribution[0],
            jnp.where(contribution[1] == 0, accumulated[0], midpoint),
        )
        return value, accumulated[1] + contribution[1]

    def finalize(self, accumulated):
        return accumulated[0]


class TotalFromOne(_MeanOfRows):
    """The total loss, counted from an init() of one."""

    name: str = eqx.field(static=True, default="total_from_one")

    def init(self):
        return jnp.ones((), jnp.float32), jnp.zeros((), jnp.float32)

    def finalize(self, accumulated):
        return accumulated[0]


class MeanOfBatchMeans(_MeanOfRows):
    """Each batch counts once, whatever its rows: a monoid whose value depends on batching."""

    name: str = eqx.field(static=True, default="mean_of_batch_means")

    def statistics(self, artifact):
        total, count = super().statistics(artifact)
        return total / count, jnp.ones((), jnp.float32)


class OffWhenCompiled(_MeanOfRows):
    """Adds one to the total when traced: the compiled path disagrees with the eager one."""

    name: str = eqx.field(static=True, default="off_when_compiled")

    def statistics(self, artifact):
        total, count = super().statistics(artifact)
        if isinstance(total, jax.core.Tracer):
            total = total + 1.0
        return total, count


def _failure(metric, strategy, **options) -> str:
    with pytest.raises(AssertionError) as caught:
        check_metric_laws(metric, strategy, max_examples=10, **options)
    return str(caught.value)


def _shown_losses(message: str, label: str) -> list[float]:
    """The row losses of the artifact the message shows as `label`."""
    found = re.search(rf"^  {label} = TokenScores\(losses=(\[\[.*?\]\]), weights=", message, re.M)
    assert found, message
    return [row[0] for row in eval(found.group(1))]  # a nested list of numbers


def _shown_value(message: str, name: str) -> float:
    found = re.search(rf"^  {re.escape(name)} += (\S+)$", message, re.M)
    assert found, message
    return float(found.group(1))


def _before_numpy(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, (part, message)
        assert message.index(part) < message.index(NUMPY_TEXT), (part, message)


def test_a_non_associative_merge_names_associativity_and_its_three_artifacts():
    message = _failure(MidpointMerge(), st.sampled_from(CANDIDATES), split_invariant=False)
    _before_numpy(message, "associativity law broke", "a = TokenScores(", "b = ", "c = ")
    a, b, c = (np.mean(_shown_losses(message, label)) for label in "abc")
    left = _shown_value(message, "finalize(merge(merge(a, b), c))")
    right = _shown_value(message, "finalize(merge(a, merge(b, c)))")
    np.testing.assert_allclose([left, right], [(a + b) / 4 + c / 2, a / 2 + (b + c) / 4])
    assert left != right


def test_a_wrong_identity_names_the_identity_law_and_its_artifact():
    message = _failure(TotalFromOne(), st.sampled_from(CANDIDATES), split_invariant=False)
    _before_numpy(message, "identity law broke (init() is a left unit)", "a = TokenScores(")
    total = 2 * sum(_shown_losses(message, "a"))
    assert _shown_value(message, "finalize(merge(init(), a))") == total + 1
    assert _shown_value(message, "finalize(a)") == total


def test_a_split_variant_statistic_names_batch_split_invariance_and_the_cut():
    ragged = _scores(1.0, 2.0, 9.0)
    message = _failure(MeanOfBatchMeans(), st.just(ragged))
    _before_numpy(message, "batch-split invariance law broke", "a = TokenScores(", "cut at rows")
    cuts = eval(re.search(r"^  cut at rows = (\[.*\])$", message, re.M).group(1))
    parts = np.split(np.asarray([1.0, 2.0, 9.0]), cuts)
    means = [part.mean() for part in parts if part.size]
    assert len(means) > 1
    np.testing.assert_allclose(
        _shown_value(message, "finalize(merge of the parts)"), np.mean(means)
    )
    assert _shown_value(message, "finalize(a)") == 4.0


def test_a_compiled_path_that_differs_names_compiled_vs_eager():
    message = _failure(OffWhenCompiled(), st.sampled_from(CANDIDATES))
    _before_numpy(message, "compiled-vs-eager law broke", "a = TokenScores(")
    losses = _shown_losses(message, "a")
    total, count = 2 * sum(losses), 2 * len(losses)
    np.testing.assert_allclose(_shown_value(message, "finalize(metric(a)), eager"), total / count)
    np.testing.assert_allclose(
        _shown_value(message, "finalize(metric(a)), compiled"), (total + 1) / count
    )


def test_a_correct_metric_still_passes():
    check_metric_laws(_CorrectMean(), st.sampled_from(CANDIDATES), max_examples=10)


class _CorrectMean(_MeanOfRows):
    name: str = eqx.field(static=True, default="correct_mean")
