"""Metric monoids over typed artifacts, and the helpers that reduce a pass.

A `Metric[A]` reads one artifact type `A`: `init()` is the identity,
`metric(artifact)` one batch's sufficient statistics, `merge(acc, contribution)`
is associative with `init()` as its unit, and `finalize(acc)` gives the scalar.
Each built-in is built by its factory under its bare name (`metrics.perplexity()`), as
optax builds its transformations; the classes behind them are private (decision 0086).

```python
>>> import jax.numpy as jnp
>>> from dew import metrics
>>> from dew.artifacts import TokenScores
>>> scores = TokenScores(losses=jnp.full((2, 4), 0.5), weights=jnp.ones((2, 4)))
>>> metric = metrics.perplexity()
>>> state = metric.merge(metric.init(), metric(scores))
>>> round(float(metric.finalize(state)), 4)
1.6487

```
"""

from dew.metrics._base import MeanState as MeanState
from dew.metrics._base import Metric as Metric
from dew.metrics._base import raise_if as raise_if
from dew.metrics._clip import clip_score as clip_score
from dew.metrics._factories import accuracy as accuracy
from dew.metrics._factories import auroc as auroc
from dew.metrics._factories import class_accuracy as class_accuracy
from dew.metrics._factories import cross_entropy as cross_entropy
from dew.metrics._factories import expected_calibration_error as expected_calibration_error
from dew.metrics._factories import f1 as f1
from dew.metrics._factories import knn_probe as knn_probe
from dew.metrics._factories import linear_probe as linear_probe
from dew.metrics._factories import loss as loss
from dew.metrics._factories import mae as mae
from dew.metrics._factories import mean_loss as mean_loss
from dew.metrics._factories import mse as mse
from dew.metrics._factories import perplexity as perplexity
from dew.metrics._factories import point_crps as point_crps
from dew.metrics._factories import precision as precision
from dew.metrics._factories import psnr as psnr
from dew.metrics._factories import recall as recall
from dew.metrics._factories import rmse as rmse
from dew.metrics._factories import shape_scores as shape_scores
from dew.metrics._factories import ssim as ssim
from dew.metrics._factories import token_accuracy as token_accuracy
from dew.metrics._factories import top_k_accuracy as top_k_accuracy
from dew.metrics._factories import video_psnr as video_psnr
from dew.metrics._factories import video_ssim as video_ssim
from dew.metrics._features import DescribesFeatures as DescribesFeatures
from dew.metrics._features import FeatureDefinition as FeatureDefinition
from dew.metrics._fid import FrechetDistance as FrechetDistance
from dew.metrics._fid import fid as fid
from dew.metrics._fid import frechet_distance as frechet_distance
from dew.metrics._fid_statistics import FIDStatistics as FIDStatistics
from dew.metrics._fid_statistics import Moments as Moments
from dew.metrics._fid_statistics import load_fid_statistics as load_fid_statistics
from dew.metrics._fid_statistics import save_fid_statistics as save_fid_statistics
from dew.metrics._regression import gaussian_crps as gaussian_crps
from dew.metrics._samples import FOREGROUND_THRESHOLD as FOREGROUND_THRESHOLD
from dew.metrics._set import MetricSet as MetricSet
from dew.metrics._set import reduce as reduce
from dew.metrics._set import stack_batches as stack_batches
from dew.metrics._shape_classifier import ShapeClassifier as ShapeClassifier
from dew.metrics._shape_classifier import shape_classifier as shape_classifier
from dew.metrics._sums import Sum as Sum

__all__ = [
    "DescribesFeatures",
    "FIDStatistics",
    "FOREGROUND_THRESHOLD",
    "FeatureDefinition",
    "FrechetDistance",
    "MeanState",
    "Metric",
    "MetricSet",
    "Moments",
    "ShapeClassifier",
    "Sum",
    "accuracy",
    "auroc",
    "class_accuracy",
    "clip_score",
    "cross_entropy",
    "expected_calibration_error",
    "f1",
    "fid",
    "frechet_distance",
    "gaussian_crps",
    "knn_probe",
    "linear_probe",
    "load_fid_statistics",
    "loss",
    "mae",
    "mean_loss",
    "mse",
    "perplexity",
    "point_crps",
    "precision",
    "psnr",
    "raise_if",
    "recall",
    "reduce",
    "rmse",
    "save_fid_statistics",
    "shape_classifier",
    "shape_scores",
    "ssim",
    "stack_batches",
    "token_accuracy",
    "top_k_accuracy",
    "video_psnr",
    "video_ssim",
]
