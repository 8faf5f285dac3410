"""Batch linear and k-NN probes against independent NumPy float64 references: the split at
rows // 2, ridge regression with an unpenalised intercept, Euclidean k-NN with ties to the
smallest class, the mean of batch accuracies, errors, laws and split dependence."""

import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dew import metrics
from dew.artifacts import Representations
from dew.metrics import MetricSet, stack_batches
from dew.metrics._probes import KNNProbe, LinearProbe
from dew.testing import assert_scores_close, check_metric_laws, representations

NUM_CLASSES = 3
# A prediction is compared only where float32 rounding cannot flip it: the reference's
# winning margin (ridge scores, or the gap between the k-th and (k+1)-th squared distance)
# must exceed this.
MARGIN = 1e-3


def _halves(features: np.ndarray, labels: np.ndarray):
    half = len(features) // 2
    return features[:half], labels[:half], features[half:], labels[half:]


def linear_reference(
    features: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    l2: float,
    *,
    penalise_intercept: bool = False,
) -> tuple[float, float]:
    """Ridge regression of one-hot labels on [features, 1], fitted on the first rows // 2
    rows by least squares on the augmented system [X 1; sqrt(l2) I 0] beta = [Y; 0] (the
    intercept unpenalised unless asked), predicting the argmax on the other rows.

    Returns the accuracy and the smallest margin between the top two scores."""
    train_x, train_y, test_x, test_y = _halves(features.astype(np.float64), labels)
    design = np.hstack([train_x, np.ones((len(train_x), 1))])
    penalty = np.full(design.shape[1], math.sqrt(l2))
    if not penalise_intercept:
        penalty[-1] = 0.0
    system = np.vstack([design, np.diag(penalty)])
    targets = np.vstack([np.eye(num_classes)[train_y], np.zeros((design.shape[1], num_classes))])
    beta = np.linalg.lstsq(system, targets, rcond=None)[0]
    scores = np.hstack([test_x, np.ones((len(test_x), 1))]) @ beta
    top_two = np.sort(scores, axis=1)[:, -2:]
    margin = float(np.min(top_two[:, 1] - top_two[:, 0])) if num_classes > 1 else math.inf
    return float(np.mean(np.argmax(scores, axis=1) == test_y)), margin


def knn_reference(
    features: np.ndarray, labels: np.ndarray, num_classes: int, k: int
) -> tuple[float, float]:
    """k nearest of the first rows // 2 rows by Euclidean distance (k capped at their
    number), one vote each, ties to the smallest class, scored on the other rows.

    Returns the accuracy and the smallest gap between the k-th and (k+1)-th squared
    distance (inf when every training row votes), which must be clear of rounding."""
    train_x, train_y, test_x, test_y = _halves(features.astype(np.float64), labels)
    k = min(k, len(train_x))
    distances = np.sum((test_x[:, None, :] - train_x[None, :, :]) ** 2, axis=-1)
    order = np.argsort(distances, axis=1, kind="stable")
    predictions = []
    for nearest in order:
        votes = np.bincount(train_y[nearest[:k]], minlength=num_classes)
        predictions.append(int(np.flatnonzero(votes == votes.max())[0]))
    ordered = np.take_along_axis(distances, order, axis=1)
    gap = float(np.min(ordered[:, k] - ordered[:, k - 1])) if k < len(train_x) else math.inf
    return float(np.mean(np.asarray(predictions) == test_y)), gap


def _data(
    seed: int, rows: int, dim: int, separation: float, offset: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """float32 features clustered by label around centres `separation` apart, plus `offset`."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=rows).astype(np.int32)
    centres = rng.standard_normal((NUM_CLASSES, dim)) * separation
    features = centres[labels] + rng.standard_normal((rows, dim)) + offset
    return features.astype(np.float32), labels


def _artifact(features: np.ndarray, labels: np.ndarray | None) -> Representations:
    return Representations(
        jnp.asarray(features), None if labels is None else jnp.asarray(labels, jnp.int32)
    )


# Compiled, because a small compiled probe builds several times faster than its eager
# operations do; the eager path is held to the compiled one below.
_statistics = eqx.filter_jit(lambda metric, artifact: metric(artifact))


def _value(metric, features: np.ndarray, labels: np.ndarray) -> float:
    return float(metric.finalize(_statistics(metric, _artifact(features, labels))))


def _fold(metric, batches) -> float:
    state = metric.init()
    for features, labels in batches:
        state = metric.merge(state, _statistics(metric, _artifact(features, labels)))
    return float(metric.finalize(state))


def _eager_fold(metric, artifacts) -> float:
    state = metric.init()
    for artifact in artifacts:
        state = metric.merge(state, metric(artifact))
    return float(metric.finalize(state))


# A few fixed shapes, so that JAX compiles each once; 13 rows split 6 / 7.
probe_data = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "rows": st.sampled_from([8, 13]),
        "dim": st.sampled_from([2, 5]),
        "separation": st.sampled_from([0.3, 1.0, 4.0]),  # overlapping to well separated
        "offset": st.sampled_from([0.0, 20.0]),
    }
)


# --- Linear probe ---------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=15)
@given(spec=probe_data, l2=st.sampled_from([1e-3, 30.0]))
def test_linear_probe_accuracy_equals_the_numpy_ridge_reference(spec, l2):
    features, labels = _data(**spec)
    expected, margin = linear_reference(features, labels, NUM_CLASSES, l2)
    assume(margin > MARGIN)
    value = _value(metrics.linear_probe(NUM_CLASSES, l2), features, labels)
    assert value == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("separation", [0.3, 4.0], ids=["overlapping", "separated"])
def test_linear_probe_matches_the_reference_on_fixed_overlapping_and_separated_data(separation):
    accuracies = []
    for seed in (1, 2, 3, 4):
        features, labels = _data(seed, rows=24, dim=2, separation=separation)
        expected, margin = linear_reference(features, labels, NUM_CLASSES, 1e-3)
        assert margin > MARGIN
        value = _value(metrics.linear_probe(NUM_CLASSES), features, labels)
        assert value == pytest.approx(expected, abs=1e-6)
        accuracies.append(expected)
    if separation < 1.0:
        assert 0.0 < max(accuracies) < 0.7, "mistakes are compared too"
    else:
        assert min(accuracies) >= 0.75 and np.mean(accuracies) > 0.85


def test_linear_probe_leaves_the_intercept_unpenalised_and_applies_l2():
    features, labels = _data(9, rows=16, dim=3, separation=1.0, offset=5.0)
    unpenalised, margin = linear_reference(features, labels, NUM_CLASSES, 10.0)
    penalised, _ = linear_reference(features, labels, NUM_CLASSES, 10.0, penalise_intercept=True)
    weak, weak_margin = linear_reference(features, labels, NUM_CLASSES, 1e-3)
    assert margin > MARGIN and weak_margin > MARGIN
    # The data tells the three fits apart, so matching one of them is not a coincidence.
    assert len({unpenalised, penalised, weak}) == 3
    assert _value(metrics.linear_probe(NUM_CLASSES, 10.0), features, labels) == pytest.approx(
        unpenalised, abs=1e-6
    )
    assert _value(metrics.linear_probe(NUM_CLASSES, 1e-3), features, labels) == pytest.approx(
        weak, abs=1e-6
    )


# --- k-NN probe -----------------------------------------------------------------------------


@settings(max_examples=15)
@given(spec=probe_data, k=st.sampled_from([1, 2, 5]))
def test_knn_probe_accuracy_equals_the_numpy_reference(spec, k):
    features, labels = _data(**spec)
    expected, gap = knn_reference(features, labels, NUM_CLASSES, k)
    scale = 1.0 + float(np.max(np.sum(features.astype(np.float64) ** 2, axis=1)))
    assume(gap > MARGIN * scale)  # no distance tie at the k-th neighbour, even in float32
    value = _value(metrics.knn_probe(NUM_CLASSES, k), features, labels)
    assert value == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("separation", [0.3, 4.0], ids=["overlapping", "separated"])
def test_knn_probe_matches_the_reference_on_fixed_overlapping_and_separated_data(separation):
    accuracies = []
    for seed in (1, 2, 3, 4):
        features, labels = _data(seed, rows=24, dim=2, separation=separation)
        expected, gap = knn_reference(features, labels, NUM_CLASSES, 3)
        assert gap > MARGIN
        value = _value(metrics.knn_probe(NUM_CLASSES, 3), features, labels)
        assert value == pytest.approx(expected, abs=1e-6)
        accuracies.append(expected)
    if separation < 1.0:
        assert 0.0 < max(accuracies) < 0.7, "mistakes are compared too"
    else:
        assert min(accuracies) >= 0.75 and np.mean(accuracies) > 0.85


def test_knn_vote_tie_goes_to_the_smallest_class_not_the_nearest_neighbour():
    # Training rows (first half): class 2 at 0.0, class 0 at 1.0, class 1 far away. Each
    # test row, all of class 0, has two nearest neighbours: class 2 (nearer) and class 0.
    features = np.array([[0.0], [1.0], [50.0], [0.1], [0.2], [0.3]], np.float32)
    labels = np.array([2, 0, 1, 0, 0, 0], np.int32)
    expected, gap = knn_reference(features, labels, NUM_CLASSES, 2)
    assert gap > MARGIN
    assert expected == 1.0  # the 1-1 vote goes to class 0, the smaller class
    assert _value(metrics.knn_probe(NUM_CLASSES, 2), features, labels) == 1.0
    # The nearest neighbour alone (k=1) says class 2: the tie was not broken by distance.
    assert knn_reference(features, labels, NUM_CLASSES, 1)[0] == 0.0
    assert _value(metrics.knn_probe(NUM_CLASSES, 1), features, labels) == 0.0


def test_knn_probe_with_k_above_the_training_half_votes_with_every_training_row():
    # Four rows: two train (classes 1, 1), two test; k=5 is capped at 2.
    features = np.array([[0.0], [10.0], [0.1], [9.9]], np.float32)
    labels = np.array([1, 1, 0, 1], np.int32)
    assert knn_reference(features, labels, NUM_CLASSES, 5)[0] == 0.5
    assert _value(metrics.knn_probe(NUM_CLASSES, 5), features, labels) == 0.5


def test_probes_fit_on_the_first_rows_floor_half_of_an_odd_batch():
    # Five rows: rows 0-1 train, rows 2-4 test. Were row 2 in the training half, the
    # accuracy would be 1/2 instead of 2/3.
    features = np.array([[0.0], [10.0], [0.1], [9.9], [0.2]], np.float32)
    labels = np.array([0, 1, 1, 1, 0], np.int32)
    assert knn_reference(features, labels, NUM_CLASSES, 1)[0] == pytest.approx(2 / 3)
    assert _value(metrics.knn_probe(NUM_CLASSES, 1), features, labels) == pytest.approx(2 / 3)
    expected, margin = linear_reference(features, labels, NUM_CLASSES, 1e-3)
    assert margin > MARGIN
    assert _value(metrics.linear_probe(NUM_CLASSES), features, labels) == pytest.approx(
        expected, abs=1e-6
    )


# --- Reduction over a pass ------------------------------------------------------------------


def _two_batches_of_different_accuracy():
    # Batch one: 4 rows, both test rows right (accuracy 1). Batch two: 12 rows, test rows
    # all labelled 0 against neighbours of classes 0, 1, 2 (accuracy 1/3).
    first = (
        np.array([[0.0], [10.0], [0.1], [9.9]], np.float32),
        np.array([0, 1, 0, 1], np.int32),
    )
    train = np.arange(6, dtype=np.float32)[:, None] * 10.0
    second = (
        np.concatenate([train, train + 0.5]),
        np.array([0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 0, 0], np.int32),
    )
    return first, second


def test_knn_probe_reports_the_mean_of_batch_accuracies_not_the_pooled_accuracy():
    first, second = _two_batches_of_different_accuracy()
    metric = metrics.knn_probe(NUM_CLASSES, 1)
    accuracies = [knn_reference(*batch, NUM_CLASSES, 1)[0] for batch in (first, second)]
    assert accuracies == pytest.approx([1.0, 1 / 3])
    pooled = (2 * accuracies[0] + 6 * accuracies[1]) / 8
    assert np.mean(accuracies) - pooled > 0.1
    assert _fold(metric, [first, second]) == pytest.approx(np.mean(accuracies), abs=1e-6)


def test_linear_probe_reports_the_mean_of_batch_accuracies_not_the_pooled_accuracy():
    first = _data(3, rows=8, dim=2, separation=4.0)
    second = _data(4, rows=24, dim=2, separation=0.3)
    references = [linear_reference(*batch, NUM_CLASSES, 1e-3) for batch in (first, second)]
    assert all(margin > MARGIN for _, margin in references)
    accuracies = [accuracy for accuracy, _ in references]
    pooled = (4 * accuracies[0] + 12 * accuracies[1]) / 16
    assert abs(np.mean(accuracies) - pooled) > 0.05
    metric = metrics.linear_probe(NUM_CLASSES)
    assert _fold(metric, [first, second]) == pytest.approx(np.mean(accuracies), abs=1e-6)


def test_probe_names_are_bare_and_say_batch():
    assert metrics.linear_probe(NUM_CLASSES).name == "batch_linear_probe_accuracy"
    assert metrics.knn_probe(NUM_CLASSES).name == "batch_knn_probe_accuracy"


# --- Errors ---------------------------------------------------------------------------------

PROBES = [metrics.linear_probe(NUM_CLASSES), metrics.knn_probe(NUM_CLASSES)]


@pytest.mark.parametrize("metric", PROBES, ids=lambda metric: type(metric).__name__)
def test_probe_without_labels_raises_naming_the_metric(metric):
    features, _ = _data(0, rows=8, dim=2, separation=1.0)
    with pytest.raises(ValueError, match=f"'{metric.name}'.*labels"):
        metric(_artifact(features, None))


@pytest.mark.parametrize("rows", [0, 1])
@pytest.mark.parametrize("metric", PROBES, ids=lambda metric: type(metric).__name__)
def test_probe_of_fewer_than_two_rows_raises(metric, rows):
    features = np.zeros((rows, 2), np.float32)
    labels = np.zeros((rows,), np.int32)
    with pytest.raises(ValueError, match=f"'{metric.name}'.*at least 2 rows, got {rows}"):
        metric(_artifact(features, labels))


@pytest.mark.parametrize("num_classes", [0, -1])
@pytest.mark.parametrize("build", [metrics.linear_probe, metrics.knn_probe])
def test_probe_with_num_classes_below_one_raises(build, num_classes):
    with pytest.raises(ValueError, match="num_classes"):
        build(num_classes)


@pytest.mark.parametrize("num_classes", [2.5, True, "3", None])
@pytest.mark.parametrize("build", [LinearProbe, KNNProbe])
def test_probe_with_num_classes_of_the_wrong_type_is_rejected(build, num_classes):
    with rejects(ValueError, "num_classes", parameter="num_classes"):
        build(num_classes=num_classes)


@pytest.mark.parametrize("k", [0, -3])
def test_knn_probe_with_k_below_one_raises(k):
    with pytest.raises(ValueError, match="k must"):
        metrics.knn_probe(NUM_CLASSES, k)


@pytest.mark.parametrize("k", [2.0, True])
def test_knn_probe_with_k_of_the_wrong_type_is_rejected(k):
    with rejects(ValueError, "k must", parameter="k"):
        KNNProbe(num_classes=NUM_CLASSES, k=k)


@pytest.mark.parametrize("l2", [0.0, -1.0, math.nan, math.inf])
def test_linear_probe_with_l2_that_is_not_a_positive_finite_number_raises(l2):
    with pytest.raises(ValueError, match="l2"):
        metrics.linear_probe(NUM_CLASSES, l2)


# --- Laws, split dependence, jit and scan ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("metric", PROBES, ids=lambda metric: type(metric).__name__)
def test_probes_obey_identity_and_associativity(metric):
    strategy = representations(rows=st.sampled_from([2, 12]), dim=4)
    check_metric_laws(metric, strategy, split_invariant=False, max_examples=10)


def test_probes_are_not_batch_split_invariant():
    features, labels = _data(5, rows=16, dim=2, separation=1.0)
    halves = [(features[:8], labels[:8]), (features[8:], labels[8:])]
    for metric, reference in (
        (metrics.knn_probe(NUM_CLASSES, 1), lambda x, y: knn_reference(x, y, NUM_CLASSES, 1)),
        (metrics.linear_probe(NUM_CLASSES), lambda x, y: linear_reference(x, y, NUM_CLASSES, 1e-3)),
    ):
        whole, whole_margin = reference(features, labels)
        parts = [reference(*half) for half in halves]
        assert whole_margin > MARGIN and all(margin > MARGIN for _, margin in parts)
        split = float(np.mean([accuracy for accuracy, _ in parts]))
        assert abs(whole - split) > 0.1, metric.name
        assert _value(metric, features, labels) == pytest.approx(whole, abs=1e-6)
        assert _fold(metric, halves) == pytest.approx(split, abs=1e-6)


@pytest.mark.slow
def test_probes_compiled_call_and_reduce_stacked_equal_the_eager_path():
    artifacts = [_artifact(*_data(seed, rows=12, dim=4, separation=1.0)) for seed in (6, 7, 8)]
    scanned = MetricSet(PROBES).reduce_stacked(stack_batches(artifacts))
    for metric in PROBES:
        eager = _eager_fold(metric, artifacts)
        compiled = metric.finalize(eqx.filter_jit(metric.__call__)(artifacts[0]))
        assert_scores_close(compiled, metric.finalize(metric(artifacts[0])), what="jit")
        assert_scores_close(scanned[metric.name], np.float32(eager), what=metric.name)


@pytest.mark.parametrize("factory", [metrics.linear_probe, metrics.knn_probe])
def test_labels_outside_the_classes_raise(factory):
    features = jnp.asarray(np.random.default_rng(0).standard_normal((6, 2)).astype(np.float32))
    labels = jnp.asarray(np.array([0, 1, 2, 3, 0, 1], np.int32))
    message = r"labels holds label 3 at row 3; valid labels are 0 to 2 \(num_classes=3\)"
    with pytest.raises(ValueError, match=message):
        factory(3)(Representations(features, labels))
