"""Classification metrics over ClassScores: their laws, scikit-learn's values on random
cases (weighted and not, with absent classes), a NumPy reference for the calibration error,
the AUROC grid's exactness and bound, empty and degenerate passes, and their errors."""

import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from hypothesis import strategies as st

from dew import metrics
from dew.artifacts import ClassScores, TokenScores
from dew.metrics._classification import F1, ConfusionMatrix, TopKAccuracy
from dew.testing import check_metric_laws, class_scores

# scikit-learn's metrics, imported when this file's tests run (the fixture below), not when
# pytest collects it: each xdist worker collects the whole suite.
sk: Any = None


@pytest.fixture(scope="module", autouse=True)
def _sklearn_imported():
    global sk
    from sklearn import metrics as sk


NO_ROW = "the pass has rows but no counted row"


# --- laws ---------------------------------------------------------------------------------

# Every metric in one set: one compilation per drawn shape for all of them.
MULTICLASS = metrics.MetricSet(
    (
        metrics.accuracy(),
        metrics.top_k_accuracy(2),
        metrics.cross_entropy(),
        metrics.precision(3),
        metrics.recall(3, None),
        metrics.f1(3),
        metrics.f1(3, "none"),
        metrics.expected_calibration_error(4),
    )
)
FEW_ROWS = st.sampled_from([2, 3])


@pytest.mark.slow  # about 11 s on 2 shared cores
def test_the_monoid_laws_hold_for_the_multiclass_metrics():
    check_metric_laws(MULTICLASS, class_scores(rows=FEW_ROWS, classes=3), max_examples=8, atol=1e-5)


def test_the_monoid_laws_hold_for_auroc():
    strategy = class_scores(rows=FEW_ROWS, classes=2)
    check_metric_laws(metrics.auroc(11), strategy, max_examples=8, atol=1e-6)


@pytest.mark.slow  # several seconds of compilation on 2 shared cores
def test_a_pass_reduces_in_one_compiled_scan_as_batch_by_batch():
    rng = np.random.default_rng(0)
    batches = [  # equal batches, to stack
        ClassScores(
            jnp.asarray(rng.normal(0.0, 2.0, (4, 3)), jnp.float32),
            jnp.asarray(rng.integers(0, 3, 4), jnp.int32),
            jnp.asarray(rng.random(4), jnp.float32),
        )
        for _ in range(3)
    ]
    scanned = MULTICLASS.reduce_stacked(metrics.stack_batches(batches))
    folded = MULTICLASS.reduce(batches)
    assert list(scanned) == list(folded) == list(MULTICLASS.names)
    for name in folded:
        np.testing.assert_allclose(scanned[name], folded[name], rtol=1e-6, atol=1e-7)


# --- against scikit-learn -----------------------------------------------------------------


def _random_batches(seed: int, *, classes: int, weighted: bool, absent: bool = False):
    """Three batches of 8 rows (one shape: one compilation); with `absent`, the last class
    is never a label."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(3):
        logits = rng.normal(0.0, 2.0, (8, classes)).astype(np.float32)
        labels = rng.integers(0, classes - 1 if absent else classes, 8).astype(np.int32)
        weights = None
        if weighted:
            weights = rng.random(8).astype(np.float32)
            weights[rng.random(8) < 0.25] = 0.0
            weights[0] = 1.0
        batches.append(
            ClassScores(
                jnp.asarray(logits),
                jnp.asarray(labels),
                None if weights is None else jnp.asarray(weights),
            )
        )
    return batches


def _pooled(batches):
    logits = np.concatenate([np.asarray(b.logits, np.float64) for b in batches])
    labels = np.concatenate([np.asarray(b.labels) for b in batches])
    if batches[0].weights is None:
        return logits, labels, None
    return logits, labels, np.concatenate([np.asarray(b.weights, np.float64) for b in batches])


def _softmax(logits):
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _ece_reference(logits, labels, weight, bins):
    """L1 ECE in float64 NumPy: bin b holds confidences in [b/bins, (b+1)/bins), 1 in the last."""
    probabilities = _softmax(logits)
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == labels).astype(np.float64)
    weight = np.ones(len(labels)) if weight is None else weight
    which = np.minimum(np.floor(confidence * bins).astype(int), bins - 1)
    error = 0.0
    for b in range(bins):
        inside = which == b
        error += abs(np.sum(weight[inside] * (correct[inside] - confidence[inside])))
    return error / np.sum(weight)


def _scikit_learn(logits, labels, weight, classes):
    """Every metric's value from scikit-learn (zero_division=0) or the ECE reference."""
    everything = list(range(classes))
    predicted = logits.argmax(axis=1)
    expected = {
        "accuracy": sk.accuracy_score(labels, predicted, sample_weight=weight),
        "cross_entropy": sk.log_loss(
            labels, _softmax(logits), labels=everything, sample_weight=weight
        ),
    }
    for k in (1, 2, 3):
        expected[f"top_{k}_accuracy"] = sk.top_k_accuracy_score(
            labels, logits, k=k, labels=everything, sample_weight=weight
        )
    references = {"precision": sk.precision_score, "recall": sk.recall_score, "f1": sk.f1_score}
    for name, reference in references.items():
        common = {"labels": everything, "sample_weight": weight, "zero_division": 0}
        expected[name] = reference(labels, predicted, average="macro", **common)
        for index, value in enumerate(reference(labels, predicted, average=None, **common)):
            expected[f"{name}_class_{index}"] = value
    for bins in (1, 7):
        expected[f"ece_{bins}"] = _ece_reference(logits, labels, weight, bins)
    return expected


def _against_scikit_learn(classes):
    return metrics.MetricSet(
        (
            metrics.accuracy(),
            metrics.cross_entropy(),
            *(metrics.top_k_accuracy(k) for k in (1, 2, 3)),
            *(
                factory(classes, average)
                for factory in (metrics.precision, metrics.recall, metrics.f1)
                for average in ("macro", None)
            ),
            *(metrics.expected_calibration_error(bins, name=f"ece_{bins}") for bins in (1, 7)),
        )
    )


@pytest.mark.parametrize(
    ("seed", "classes", "weighted", "absent"),
    [(0, 4, False, False), (1, 5, True, True)],
    ids=["unweighted", "weighted-with-an-absent-class"],
)
def test_every_metric_matches_scikit_learn_and_the_calibration_reference(
    seed, classes, weighted, absent
):
    batches = _random_batches(seed, classes=classes, weighted=weighted, absent=absent)
    pass_metrics = _against_scikit_learn(classes)
    scored = pass_metrics.reduce(batches)
    with warnings.catch_warnings():  # scikit-learn on k >= classes and the absent class
        warnings.simplefilter("ignore")
        expected = _scikit_learn(*_pooled(batches), classes)
    assert sorted(scored) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(float(scored[name]), value, rtol=1e-5, atol=1e-6, err_msg=name)
    if absent:  # the class no label holds: recall and F1 are 0, as zero_division=0 says
        assert float(scored[f"recall_class_{classes - 1}"]) == 0.0
        assert float(scored[f"f1_class_{classes - 1}"]) == 0.0


def test_the_confusion_matrix_counts_weighted_pairs_like_scikit_learn():
    batches = _random_batches(4, classes=4, weighted=True)
    logits, labels, weight = _pooled(batches)
    merge = jax.jit(lambda a, b: a.merge(b))
    matrix = ConfusionMatrix.zero(4)
    for batch in batches:
        matrix = merge(matrix, jax.jit(ConfusionMatrix.of)(batch))
    expected = sk.confusion_matrix(
        labels, logits.argmax(axis=1), labels=list(range(4)), sample_weight=weight
    )
    np.testing.assert_allclose(np.asarray(matrix.counts.value()), expected, rtol=1e-6)


def _binary(probabilities, labels, weights=None):
    """2-class logits whose softmax gives p(class 1) = `probabilities`."""
    logits = np.stack(
        [np.zeros_like(probabilities), np.log(probabilities / (1 - probabilities))], axis=1
    )
    return ClassScores(
        jnp.asarray(logits, jnp.float32),
        jnp.asarray(labels, jnp.int32),
        None if weights is None else jnp.asarray(weights, jnp.float32),
    )


@pytest.mark.parametrize("weighted", [False, True])
def test_auroc_is_scikit_learns_exactly_on_scores_at_the_grids_cell_centres(weighted):
    thresholds = 21
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 90)
    cell = np.clip(rng.integers(0, thresholds - 1, 90) + 3 * labels, 0, thresholds - 2)
    probabilities = (cell + 0.5) / (thresholds - 1)  # every score inside one grid cell
    weights = rng.random(90) + 0.1 if weighted else None
    batches = [
        _binary(
            probabilities[start : start + 30],
            labels[start : start + 30],
            None if weights is None else weights[start : start + 30],
        )
        for start in (0, 30, 60)
    ]
    got = float(metrics.reduce([metrics.auroc(thresholds)], batches)["auroc"])
    expected = sk.roc_auc_score(labels, probabilities, sample_weight=weights)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("thresholds", [5, 400])
def test_auroc_is_within_the_grids_bound_of_scikit_learn_on_raw_scores(thresholds):
    rng = np.random.default_rng(thresholds)
    rows = 300
    labels = rng.integers(0, 2, rows)
    probabilities = 1 / (1 + np.exp(-(rng.normal(0.0, 1.5, rows) + labels)))
    weights = rng.random(rows)
    scores = _binary(probabilities, labels, weights)
    got = float(metrics.reduce([metrics.auroc(thresholds)], [scores])["auroc"])
    expected = sk.roc_auc_score(labels, probabilities, sample_weight=weights)
    # The grid ties the positive-negative pairs that share a cell: half their weight bounds
    # the difference from the exact AUROC.
    cells = np.clip(np.floor(probabilities * (thresholds - 1)).astype(int), 0, thresholds - 2)
    positive = np.bincount(cells, weights * (labels == 1), thresholds)
    negative = np.bincount(cells, weights * (labels == 0), thresholds)
    bound = 0.5 * np.sum(positive * negative) / (positive.sum() * negative.sum())
    assert abs(got - expected) <= bound + 1e-6
    if thresholds == 400:  # and a fine grid's bound is small
        assert bound < 2e-3


# --- empty and degenerate passes ----------------------------------------------------------

EVERY = {
    "accuracy": metrics.accuracy(),
    "top_k_accuracy": metrics.top_k_accuracy(2),
    "cross_entropy": metrics.cross_entropy(),
    "precision": metrics.precision(2),
    "recall": metrics.recall(2),
    "f1": metrics.f1(2),
    "f1_class_1": F1(2, class_index=1, name="f1_class_1"),
    "expected_calibration_error": metrics.expected_calibration_error(),
    "auroc": metrics.auroc(),
}


@pytest.mark.slow  # several seconds of compilation on 2 shared cores
def test_an_empty_pass_is_nan_and_a_pass_of_zero_weights_raises():
    every = metrics.MetricSet(tuple(EVERY.values()))
    assert all(np.isnan(float(value)) for value in every.reduce([]).values())
    zero = ClassScores(jnp.ones((3, 2)), jnp.array([0, 1, 1]), jnp.zeros(3))
    for metric in EVERY.values():  # the compiled finalize fails; the eager one names it
        with pytest.raises(ValueError, match=re.escape(f"metric {metric.name!r}: {NO_ROW}")):
            metrics.reduce([metric], [zero])


def test_auroc_of_one_class_only_is_nan():
    scores = ClassScores(jnp.zeros((3, 2)), jnp.array([1, 1, 1]))
    assert np.isnan(float(metrics.reduce([metrics.auroc()], [scores])["auroc"]))


def test_a_perfect_classifier_scores_one_and_no_calibration_error():
    logits = jnp.array([[30.0, 0.0, 0.0], [0.0, 30.0, 0.0], [0.0, 0.0, 30.0]])
    scores = ClassScores(logits, jnp.array([0, 1, 2]))
    scored = metrics.reduce(
        [metrics.accuracy(), metrics.f1(3), metrics.expected_calibration_error()], [scores]
    )
    assert float(scored["accuracy"]) == 1.0 and float(scored["f1"]) == 1.0
    assert float(scored["expected_calibration_error"]) < 1e-6
    binary = ClassScores(jnp.array([[5.0, -5.0], [-5.0, 5.0]]), jnp.array([0, 1]))
    assert float(metrics.reduce([metrics.auroc()], [binary])["auroc"]) == 1.0


def test_ties_go_to_the_lower_class_index():
    scores = ClassScores(jnp.zeros((2, 3)), jnp.array([0, 2]))
    scored = metrics.reduce([metrics.accuracy(), metrics.top_k_accuracy(2)], [scores])
    assert float(scored["accuracy"]) == 0.5 and float(scored["top_2_accuracy"]) == 0.5


# --- bad input ----------------------------------------------------------------------------


def test_class_scores_check_their_shapes_and_labels(monkeypatch):
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)  # dew's own checks
    with pytest.raises(ValueError, match=re.escape("ClassScores.logits must have 2 axes")):
        ClassScores(jnp.zeros((3,)), jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match=re.escape("got logits (3, 2), labels (2,)")):
        ClassScores(jnp.zeros((3, 2)), jnp.zeros((2,), jnp.int32))
    with pytest.raises(ValueError, match=re.escape("labels (3,), weights (4,)")):
        ClassScores(jnp.zeros((3, 2)), jnp.zeros((3,), jnp.int32), jnp.ones(4))
    with pytest.raises(ValueError, match="at least 2 classes"):
        ClassScores(jnp.zeros((3, 1)), jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="integer class labels, got dtype float32"):
        ClassScores(jnp.zeros((3, 2)), jnp.zeros((3,)))
    message = "ClassScores.labels holds label -1 at row 2; valid labels are 0 to 1 (classes=2)."
    with pytest.raises(ValueError, match=re.escape(message)):
        ClassScores(jnp.zeros((3, 2)), jnp.array([0, 1, -1]))


def test_a_traced_bad_label_fails_the_compiled_call_with_the_metrics_check():
    metric = metrics.accuracy()

    @jax.jit
    def score(logits, labels):
        return metric.finalize(metric(ClassScores(logits, labels)))

    with pytest.raises(
        Exception, match=re.escape("metric 'accuracy': ClassScores.labels holds labels")
    ):
        jax.block_until_ready(score(jnp.zeros((2, 3)), jnp.array([0, 5])))
    assert float(score(jnp.zeros((2, 3)), jnp.array([0, 1]))) == 0.5


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: metrics.top_k_accuracy(0), "k must be an integer >= 1, got 0."),
        (lambda: TopKAccuracy(k=-2), "k must be an integer >= 1, got -2."),
        (lambda: metrics.expected_calibration_error(0), "bins must be an integer >= 1, got 0."),
        (lambda: metrics.auroc(1), "thresholds must be an integer >= 2, got 1."),
        (lambda: metrics.precision(1), "classes must be an integer >= 2, got 1."),
        (
            lambda: F1(classes=3, class_index=3),
            "class_index must be None or an integer between 0 and 2, got 3.",
        ),
        (
            lambda: metrics.recall(3, "micro"),
            "average must be 'macro', 'none' or None (one value per class), got 'micro'.",
        ),
    ],
)
def test_factory_arguments_are_checked(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


def test_scores_that_do_not_fit_the_metric_are_refused_by_name():
    three = ClassScores(jnp.zeros((2, 3)), jnp.array([0, 1]))
    with pytest.raises(
        ValueError, match=re.escape("metric 'top_4_accuracy': k=4 is more than the 3 classes")
    ):
        metrics.top_k_accuracy(4)(three)
    with pytest.raises(
        ValueError, match=re.escape("metric 'auroc' is binary: it needs scores of 2 classes")
    ):
        metrics.auroc()(three)
    with pytest.raises(
        ValueError, match=re.escape("metric 'f1' counts 4 classes, but the scores hold 3")
    ):
        metrics.f1(4)(three)
    with pytest.raises(TypeError, match="metric 'accuracy' reads ClassScores, got TokenScores"):
        metrics.accuracy()(TokenScores(jnp.zeros((1, 2)), jnp.ones((1, 2))))
