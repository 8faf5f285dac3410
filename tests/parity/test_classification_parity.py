"""dew's classification metrics against torchmetrics 1.9.0 on the same random logits: top-k
accuracy (micro), precision, recall and F1 (macro and per class), the L1 calibration error
and the binned binary AUROC, to float32 rounding. Every class holds a label, so torchmetrics'
macro mean (which leaves out classes neither true nor predicted) and dew's (every class,
decision 0024) average the same classes."""

import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from dew import metrics
from dew.artifacts import ClassScores

torch = pytest.importorskip("torch")
if "torchvision" not in sys.modules:  # PyPI's torchvision beside the CPU build of torch
    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
classification = pytest.importorskip("torchmetrics.classification")

pytestmark = pytest.mark.parity

CLASSES = 5


def _cases(seed, classes, rows=64, batches=3):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, (batches * rows, classes)).astype(np.float32)
    labels = np.concatenate(
        [np.arange(classes), rng.integers(0, classes, batches * rows - classes)]
    )
    labels = labels.astype(np.int64)
    dew_batches = [
        ClassScores(
            jnp.asarray(logits[i * rows : (i + 1) * rows]),
            jnp.asarray(labels[i * rows : (i + 1) * rows], jnp.int32),
        )
        for i in range(batches)
    ]
    return dew_batches, torch.from_numpy(logits), torch.from_numpy(labels)


def _torchmetrics(metric, logits, labels, rows=64):
    for start in range(0, len(labels), rows):
        metric.update(logits[start : start + rows], labels[start : start + rows])
    return metric.compute().numpy()


@pytest.mark.parametrize("seed", [0, 1])
def test_multiclass_metrics_match_torchmetrics(seed):
    batches, logits, labels = _cases(seed, CLASSES)
    pairs = [
        (
            metrics.top_k_accuracy(k),
            classification.MulticlassAccuracy(CLASSES, top_k=k, average="micro"),
        )
        for k in (1, 2, 3)
    ]
    pairs.append(
        (
            metrics.expected_calibration_error(10),
            classification.MulticlassCalibrationError(CLASSES, n_bins=10, norm="l1"),
        )
    )
    for factory, reference in (
        (metrics.precision, classification.MulticlassPrecision),
        (metrics.recall, classification.MulticlassRecall),
        (metrics.f1, classification.MulticlassF1Score),
    ):
        pairs.append((factory(CLASSES), reference(CLASSES, average="macro")))
        pairs.append((factory(CLASSES, None), reference(CLASSES, average="none")))
    for ours, theirs in pairs:
        scored = metrics.MetricSet((ours,)).reduce(batches)
        got = np.array([float(value) for value in scored.values()])
        expected = np.atleast_1d(_torchmetrics(theirs, logits, labels))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=str(list(scored)))


@pytest.mark.parametrize("thresholds", [11, 200])
def test_binary_auroc_matches_torchmetrics_binned_auroc(thresholds):
    batches, logits, labels = _cases(thresholds, 2)
    probabilities = torch.softmax(logits, dim=1)[:, 1]
    reference = classification.BinaryAUROC(thresholds=thresholds)
    expected = float(_torchmetrics(reference, probabilities, labels))
    got = float(metrics.reduce([metrics.auroc(thresholds)], batches)["auroc"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
