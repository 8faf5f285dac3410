"""The factories that build dew's metrics: one function per built-in, under its bare name.

As optax builds a `GradientTransformation` with `optax.adam(...)`, a built-in metric is built
by its factory (`dew.metrics.perplexity()`); the classes stay in their private modules
(decision 0086).
"""

import os
from collections.abc import Callable

from jaxtyping import Array

from dew._integers import check_integer
from dew.metrics._base import Metric
from dew.metrics._classification import (
    AUROC,
    F1,
    Accuracy,
    CrossEntropy,
    ExpectedCalibrationError,
    Precision,
    Recall,
    TopKAccuracy,
)
from dew.metrics._images import MAE, MSE, PSNR, SSIM, VideoPSNR, VideoSSIM
from dew.metrics._probes import KNNProbe, LinearProbe
from dew.metrics._regression import RMSE, PointCRPS, RowLoss
from dew.metrics._samples import (
    FOREGROUND_THRESHOLD,
    ClassAccuracy,
    ForegroundColourSpread,
    ForegroundFraction,
    ForegroundParts,
)
from dew.metrics._set import MetricSet
from dew.metrics._shape_classifier import shape_classifier
from dew.metrics._tokens import MeanLoss, Perplexity, TokenAccuracy

__all__ = [
    "accuracy",
    "auroc",
    "class_accuracy",
    "cross_entropy",
    "expected_calibration_error",
    "f1",
    "knn_probe",
    "linear_probe",
    "loss",
    "mae",
    "mean_loss",
    "mse",
    "perplexity",
    "point_crps",
    "precision",
    "psnr",
    "recall",
    "rmse",
    "shape_scores",
    "ssim",
    "token_accuracy",
    "top_k_accuracy",
    "video_psnr",
    "video_ssim",
]


def perplexity(*, name: str = "perplexity") -> Perplexity:
    """Token-weighted perplexity over `TokenScores` (name `perplexity`)."""
    return Perplexity(name=name)


def mean_loss(*, name: str = "mean_loss") -> MeanLoss:
    """Token-weighted mean loss over `TokenScores` (name `mean_loss`)."""
    return MeanLoss(name=name)


def token_accuracy(*, name: str = "token_accuracy") -> TokenAccuracy:
    """Token-weighted argmax accuracy over `TokenScores` (name `token_accuracy`)."""
    return TokenAccuracy(name=name)


def loss(*, name: str = "loss") -> RowLoss:
    """The weighted mean of the rows' losses over `RegressionScores` (name `loss`)."""
    return RowLoss(name=name)


def rmse(*, name: str = "rmse") -> RMSE:
    """Root mean squared error of the point predictions over `RegressionScores` (name `rmse`)."""
    return RMSE(name=name)


def point_crps(*, name: str = "point_crps") -> PointCRPS:
    """CRPS of the Gaussian predictive distribution over `RegressionScores` (name `point_crps`)."""
    return PointCRPS(name=name)


def mse(*, name: str = "mse") -> MSE:
    """Per-image mean squared error against references over `Images` (name `mse`)."""
    return MSE(name=name)


def mae(*, name: str = "mae") -> MAE:
    """Per-image mean absolute error against references over `Images` (name `mae`)."""
    return MAE(name=name)


def psnr(data_range: float = 1.0, *, name: str = "psnr") -> PSNR:
    """Per-image PSNR in dB against references over `Images` (name `psnr`)."""
    return PSNR(data_range=data_range, name=name)


def ssim(data_range: float = 1.0, *, name: str = "ssim") -> SSIM:
    """Per-image Gaussian-window SSIM against references over `Images` (name `ssim`)."""
    return SSIM(data_range=data_range, name=name)


def video_psnr(data_range: float = 1.0, *, name: str = "psnr") -> VideoPSNR:
    """Per-frame PSNR in dB against reference clips over `Clips` (name `psnr`)."""
    return VideoPSNR(data_range=data_range, name=name)


def video_ssim(data_range: float = 1.0, *, name: str = "ssim") -> VideoSSIM:
    """Per-frame SSIM against reference clips over `Clips` (name `ssim`)."""
    return VideoSSIM(data_range=data_range, name=name)


def linear_probe(
    num_classes: int, l2: float = 1e-3, *, name: str = "batch_linear_probe_accuracy"
) -> LinearProbe:
    """Batch linear-probe accuracy over `Representations` (name `batch_linear_probe_accuracy`)."""
    return LinearProbe(num_classes=num_classes, l2=l2, name=name)


def knn_probe(num_classes: int, k: int = 5, *, name: str = "batch_knn_probe_accuracy") -> KNNProbe:
    """Batch k-NN-probe accuracy over `Representations` (name `batch_knn_probe_accuracy`)."""
    return KNNProbe(num_classes=num_classes, k=k, name=name)


def accuracy(*, name: str = "accuracy") -> Accuracy:
    """Weighted argmax accuracy over `ClassScores` (name `accuracy`)."""
    return Accuracy(name=name)


def top_k_accuracy(k: int, *, name: str | None = None) -> TopKAccuracy:
    """Weighted top-`k` accuracy over `ClassScores` (name `top_<k>_accuracy`, `k >= 1`)."""
    check_integer("k", k, minimum=1)
    return TopKAccuracy(k=k, name=f"top_{k}_accuracy" if name is None else name)


def cross_entropy(*, name: str = "cross_entropy") -> CrossEntropy:
    """Weighted mean cross entropy of the labels under `softmax(logits)`, in nats, over
    `ClassScores` (name `cross_entropy`)."""
    return CrossEntropy(name=name)


def precision(classes: int, average: str | None = "macro", *, name: str = "precision") -> Metric:
    """Precision over `ClassScores` of `classes` classes: `average="macro"` the mean over
    every class (name `precision`), `average=None` (or `"none"`) a `MetricSet` of one value
    per class (names `precision_class_0`, `precision_class_1`, ...). A class never predicted
    scores 0 (decision 0024)."""
    return _per_class(Precision, classes, average, name)


def recall(classes: int, average: str | None = "macro", *, name: str = "recall") -> Metric:
    """Recall over `ClassScores`, macro (name `recall`) or per class (`recall_class_<i>`),
    as `precision`; a class never true scores 0."""
    return _per_class(Recall, classes, average, name)


def f1(classes: int, average: str | None = "macro", *, name: str = "f1") -> Metric:
    """F1 over `ClassScores`, macro (name `f1`, the mean of the per-class F1s) or per class
    (`f1_class_<i>`), as `precision`; a class neither true nor predicted scores 0."""
    return _per_class(F1, classes, average, name)


def expected_calibration_error(
    bins: int = 15, *, name: str = "expected_calibration_error"
) -> ExpectedCalibrationError:
    """L1 expected calibration error of the max softmax probability over `bins` equal-width
    bins, over `ClassScores` (name `expected_calibration_error`, `bins >= 1`)."""
    return ExpectedCalibrationError(bins=bins, name=name)


def auroc(thresholds: int = 200, *, name: str = "auroc") -> AUROC:
    """Binary AUROC of p(class 1) = `softmax(logits)[:, 1]` over 2-class `ClassScores`, on a
    grid of `thresholds` equally spaced thresholds in [0, 1] (name `auroc`, `thresholds >= 2`)."""
    return AUROC(thresholds=thresholds, name=name)


def _per_class(kind: type, classes: int, average: str | None, name: str) -> Metric:
    check_integer("classes", classes, minimum=2)
    if not (average is None or (isinstance(average, str) and average in ("macro", "none"))):
        raise ValueError(
            f"average must be 'macro', 'none' or None (one value per class), got {average!r}."
        )
    if average == "macro":
        return kind(classes=classes, name=name)
    return MetricSet(
        tuple(
            kind(classes=classes, class_index=index, name=f"{name}_class_{index}")
            for index in range(classes)
        )
    )


def class_accuracy(
    classifier: Callable[[Array], Array], *, clips: bool = False, name: str = "class_accuracy"
) -> ClassAccuracy:
    """The share of generated images `classifier` (images in `[0, 1]` to logits) assigns
    the class they were conditioned on, over `Images` with `labels` (with `clips`: every
    frame of `Clips`, each conditioned on its clip's label; name `class_accuracy`)."""
    return ClassAccuracy(classifier=classifier, clips=clips, name=name)


def shape_scores(
    *,
    image_size: int = 16,
    clips: bool = False,
    threshold: float = FOREGROUND_THRESHOLD,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[Metric, ...]:
    """How convincing generated samples of dew's shapes (`shapes`, or with `clips`
    `moving_shapes`) are, needing no downloaded weights: seven device metrics over `Images`
    (`Clips`) with conditioning `labels` and real `reference` rows.

    - `class_accuracy`: the share of generated images `shape_classifier(image_size)` (a
      small CNN trained once on drawn shapes and cached) assigns the kind they were
      conditioned on; 1/3 is chance, and the classifier scores about 0.99 on held-out
      real shapes.
    - `foreground_fraction`, `foreground_colour_spread`, `foreground_parts`: the mean over
      the generated images of the share of their pixels in the foreground (the brightest
      channel above `threshold`), the spread of the foreground's colour (0: one flat
      colour) and the number of its 4-connected pieces (1: one solid shape);
      `real_foreground_fraction`, `real_foreground_colour_spread`, `real_foreground_parts`:
      the same of the real rows (one shape, one colour: spread 0, one piece).

    A clip's frames each count as one image. `cache_dir`: where the classifier's weights are
    kept (`shape_classifier`). The first call trains the classifier (about 10 seconds of CPU
    at 16x16); later calls read it.
    """
    kinds = (ForegroundFraction, ForegroundColourSpread, ForegroundParts)
    foreground = [
        kind(population=population, threshold=threshold, clips=clips, name=f"{prefix}{name}")
        for population, prefix in (("generated", ""), ("reference", "real_"))
        for kind, name in zip(
            kinds,
            ("foreground_fraction", "foreground_colour_spread", "foreground_parts"),
            strict=True,
        )
    ]
    classifier = shape_classifier(image_size, cache_dir=cache_dir)
    return (class_accuracy(classifier, clips=clips), *foreground)
