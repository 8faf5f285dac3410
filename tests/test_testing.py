"""dew.testing: the law checker catches broken metrics, and every strategy builds valid
artifacts of its type."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from dew import testing
from dew.artifacts import Artifact, Clips, Images, Representations, TokenRows, TokenScores
from dew.metrics import Metric, Sum
from dew.testing import assert_scores_close, check_metric_laws

# Small metrics, each broken in one way. Statistics are float32 pairs (value, count).


def _batch_mean_loss(artifact: TokenScores):
    weights = artifact.weights
    return jnp.sum(artifact.losses * weights) / jnp.sum(weights)


class _PairMetric(Metric[TokenScores]):
    artifact_type: ClassVar[type[Artifact]] = TokenScores

    def init(self):
        return jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)

    def statistics(self, artifact):
        return _batch_mean_loss(artifact), jnp.ones((), jnp.float32)

    def merge(self, accumulated, contribution):
        return accumulated[0] + contribution[0], accumulated[1] + contribution[1]

    def finalize(self, accumulated):
        total, count = accumulated
        return total / count


class AverageOfBatchAverages(_PairMetric):
    """Mean loss as the mean of the batch means: a monoid, but not batch-split invariant."""

    name: str = eqx.field(static=True, default="average_of_batch_averages")


class MidpointMerge(_PairMetric):
    """Merges two non-empty statistics to their midpoint: has a unit, but is not associative."""

    name: str = eqx.field(static=True, default="midpoint_merge")

    def merge(self, accumulated, contribution):
        value = 0.5 * (accumulated[0] + contribution[0])
        count = accumulated[1] + contribution[1]
        merged_value = jnp.where(
            accumulated[1] == 0,
            contribution[0],
            jnp.where(contribution[1] == 0, accumulated[0], value),
        )
        return merged_value, count

    def finalize(self, accumulated):
        return accumulated[0]


class HalvingMerge(_PairMetric):
    """merge(a, b) = (a + b) / 2 throughout: not even `init()` is a unit."""

    name: str = eqx.field(static=True, default="halving_merge")

    def merge(self, accumulated, contribution):
        return 0.5 * (accumulated[0] + contribution[0]), accumulated[1] + contribution[1]

    def finalize(self, accumulated):
        return accumulated[0]


class TotalWeightFromOne(Metric[TokenScores]):
    """The pass's total weight, but its init() is 1 instead of 0."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    name: str = eqx.field(static=True, default="total_weight_from_one")

    def init(self):
        return Sum(jnp.ones((), jnp.float32), jnp.zeros((), jnp.float32))

    def statistics(self, artifact):
        return Sum.of(artifact.weights)

    def merge(self, accumulated, contribution):
        return accumulated.add(contribution)

    def finalize(self, accumulated):
        return accumulated.value()


class TotalWeight(TotalWeightFromOne):
    """The same metric with its unit fixed."""

    name: str = eqx.field(static=True, default="total_weight")

    def init(self):
        return Sum.zero()


@pytest.fixture
def no_shrinking():
    """Report a law checker's first failing example as found: shrinking it (recompiling the
    metric for every smaller shape) takes minutes and proves nothing more here."""
    previous = settings.get_current_profile_name()
    settings.register_profile(
        "dew-no-shrinking",
        parent=settings.get_profile(previous),
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
    settings.load_profile("dew-no-shrinking")
    yield
    settings.load_profile(previous)


def _law_failures(metric, **options) -> str:
    """Run the law checker, which must fail, and return what it reported."""
    strategy = testing.token_scores(positions=8)
    with pytest.raises((AssertionError, ExceptionGroup)) as caught:
        check_metric_laws(metric, strategy, max_examples=25, **options)
    error = caught.value
    if isinstance(error, ExceptionGroup):
        assert all(isinstance(inner, AssertionError) for inner in error.exceptions), error
        return "\n".join(str(inner) for inner in error.exceptions)
    return str(error)


@pytest.mark.usefixtures("no_shrinking")
def test_law_checker_catches_averaging_batch_averages():
    report = _law_failures(AverageOfBatchAverages())
    assert "batch-split invariance" in report
    assert "associative" not in report
    assert "unit" not in report


def test_averaging_batch_averages_passes_when_split_invariance_is_not_claimed():
    check_metric_laws(
        AverageOfBatchAverages(),
        testing.token_scores(positions=8),
        split_invariant=False,
        max_examples=10,
    )


@pytest.mark.usefixtures("no_shrinking")
def test_law_checker_catches_a_non_associative_merge():
    report = _law_failures(MidpointMerge(), split_invariant=False)
    assert "merge is associative" in report
    assert "unit" not in report


@pytest.mark.usefixtures("no_shrinking")
def test_law_checker_catches_a_halving_merge():
    report = _law_failures(HalvingMerge(), split_invariant=False)
    # merge(init(), c) halves c and merge is not associative; which law the first failing
    # example breaks first depends on its values (a ratio can survive halving both sums).
    assert any(
        law in report
        for law in ("init() is a left unit", "merge is associative", "jit agrees with eager")
    ), report


@pytest.mark.usefixtures("no_shrinking")
def test_law_checker_catches_an_init_that_is_not_a_unit():
    report = _law_failures(TotalWeightFromOne(), split_invariant=False)
    assert "init() is a left unit" in report or "jit agrees with eager" in report


@pytest.mark.usefixtures("no_shrinking")
def test_law_checker_reports_a_non_unit_init_as_the_unit_law():
    # The compiled path is fine here; only init() is wrong, so the report should name the
    # unit law rather than a jit/eager disagreement.
    report = _law_failures(TotalWeightFromOne(), split_invariant=False)
    assert "init() is a left unit" in report, report


def test_the_same_sum_with_a_zero_init_passes():
    check_metric_laws(TotalWeight(), testing.token_scores(positions=8), max_examples=10)


# assert_scores_close.


def test_assert_scores_close_treats_nan_as_equal_to_nan():
    assert_scores_close(jnp.float32(jnp.nan), np.float32(np.nan))
    with pytest.raises(AssertionError):
        assert_scores_close(jnp.float32(jnp.nan), np.float32(1.0))


def test_assert_scores_close_matches_infinities_only_with_their_sign():
    assert_scores_close(np.float32(np.inf), np.float32(np.inf))
    with pytest.raises(AssertionError):
        assert_scores_close(np.float32(np.inf), np.float32(-np.inf))
    with pytest.raises(AssertionError):
        assert_scores_close(np.float32(3.0e38), np.float32(np.inf))


def test_assert_scores_close_uses_the_expected_dtype_tolerance():
    assert_scores_close(np.float32(1.0 + 1e-5), np.float32(1.0))
    with pytest.raises(AssertionError, match="my value"):
        assert_scores_close(np.float64(1.0 + 1e-5), np.float64(1.0), what="my value")
    with pytest.raises(AssertionError):
        assert_scores_close(np.float32(1.001), np.float32(1.0))
    assert_scores_close(np.float32(1.001), np.float32(1.0), rtol=1e-2)


# Strategies build valid artifacts.

FEW = settings(max_examples=15)


@FEW
@given(testing.token_scores())
def test_token_scores_strategy_builds_valid_token_scores(scores):
    assert isinstance(scores, TokenScores)
    rows, positions = scores.losses.shape
    assert 1 <= rows <= 5
    assert positions in (1, 3, 8)
    assert scores.losses.dtype == scores.weights.dtype == jnp.float32
    losses, weights = np.asarray(scores.losses), np.asarray(scores.weights)
    assert np.all((losses >= 0) & (losses <= 12))
    assert np.all((weights >= 0) & (weights <= 1))
    assert np.all(weights[:, 0] == 1)  # every row counts a target
    assert scores.correct is not None
    assert scores.correct.shape == scores.losses.shape
    assert scores.correct.dtype == jnp.bool_


@FEW
@given(testing.token_scores(rows=2, positions=st.just(4), with_correct=False))
def test_token_scores_strategy_honours_fixed_sizes_and_no_correct(scores):
    assert scores.losses.shape == (2, 4)
    assert scores.correct is None


@FEW
@given(testing.images())
def test_images_strategy_builds_paired_images_in_unit_range(images):
    assert isinstance(images, Images)
    rows, height, width, channels = images.generated.shape
    assert 1 <= rows <= 4
    assert height == width
    assert height in (11, 16)
    assert channels in (1, 3)
    assert images.reference is not None
    assert images.reference.shape == images.generated.shape
    for array in (images.generated, images.reference):
        assert array.dtype == jnp.float32
        values = np.asarray(array)
        assert np.all((values >= 0) & (values <= 1))


@FEW
@given(testing.images(rows=3, size=11, channels=1, paired=False))
def test_images_strategy_can_leave_out_the_reference(images):
    assert images.generated.shape == (3, 11, 11, 1)
    assert images.reference is None


@FEW
@given(testing.clips())
def test_clips_strategy_builds_paired_clips_in_unit_range(clips):
    assert isinstance(clips, Clips)
    rows, frames, height, width, channels = clips.generated.shape
    assert 1 <= rows <= 3
    assert frames in (1, 3)
    assert height == width == 11
    assert channels in (1, 3)
    assert clips.reference is not None
    assert clips.reference.shape == clips.generated.shape
    for array in (clips.generated, clips.reference):
        values = np.asarray(array)
        assert array.dtype == jnp.float32
        assert np.all((values >= 0) & (values <= 1))


@FEW
@given(testing.representations(num_classes=4))
def test_representations_strategy_builds_labelled_features(representations):
    assert isinstance(representations, Representations)
    rows, dim = representations.features.shape
    assert rows in (2, 5, 12)
    assert dim in (1, 4)
    assert representations.features.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(representations.features)))
    assert representations.labels is not None
    assert representations.labels.shape == (rows,)
    assert jnp.issubdtype(representations.labels.dtype, jnp.integer)
    labels = np.asarray(representations.labels)
    assert np.all((labels >= 0) & (labels < 4))


@FEW
@given(testing.token_rows(vocab_size=5))
def test_token_rows_strategy_builds_integer_ids_in_the_vocabulary(token_rows):
    assert isinstance(token_rows, TokenRows)
    rows, length = token_rows.tokens.shape
    assert 1 <= rows <= 4
    assert 1 <= length <= 12
    assert token_rows.tokens.dtype == jnp.int32
    tokens = np.asarray(token_rows.tokens)
    assert np.all((tokens >= 0) & (tokens < 5))
