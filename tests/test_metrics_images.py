"""Paired image and video metrics against scikit-image: SSIM, PSNR, MSE and MAE per image,
video PSNR and SSIM per frame, their weighting, non-finite values, errors, laws and the
jit and scan paths."""

import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from hypothesis import strategies as st
from skimage.metrics import mean_squared_error, peak_signal_noise_ratio, structural_similarity

from dew import metrics
from dew.artifacts import Clips, Images
from dew.metrics import MetricSet, stack_batches
from dew.metrics._images import PSNR, SSIM, VideoPSNR, VideoSSIM
from dew.testing import assert_scores_close, check_metric_laws, clips, images

# A few fixed shapes, so that JAX compiles each once: four rows per batch (and four frames
# per video batch), grayscale and RGB, from SSIM's 11x11 minimum to a non-square 32x40.
ROWS = 4
SHAPES = [(11, 11, 1), (19, 13, 1), (32, 40, 3)]
DATA_RANGES = [1.0, 255.0]
# float32 unit roundoff.
U32 = float(np.finfo(np.float32).eps) / 2
IMAGE_METRICS = [metrics.psnr(), metrics.ssim(), metrics.mse(), metrics.mae()]
VIDEO_METRICS = [metrics.video_psnr(), metrics.video_ssim()]


def _sk_ssim(generated: np.ndarray, reference: np.ndarray, data_range: float) -> np.ndarray:
    return np.array(
        [
            structural_similarity(
                r,
                g,
                gaussian_weights=True,
                use_sample_covariance=False,
                data_range=data_range,
                channel_axis=-1,
            )
            for g, r in zip(generated, reference, strict=True)
        ]
    )


def _sk_psnr(generated: np.ndarray, reference: np.ndarray, data_range: float) -> np.ndarray:
    with np.errstate(divide="ignore"):  # a perfect image: scikit-image's +inf
        return np.array(
            [
                peak_signal_noise_ratio(r, g, data_range=data_range)
                for g, r in zip(generated, reference, strict=True)
            ]
        )


def _sk_mse(generated: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return np.array([mean_squared_error(r, g) for g, r in zip(generated, reference, strict=True)])


def _np_mae(generated: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return np.abs(generated - reference).mean(axis=(1, 2, 3))


def _noisy_pairs(
    shape: tuple[int, ...], data_range: float, seed: int, noise: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    """float64 images in [0, data_range] and references that are them plus clipped noise."""
    rng = np.random.default_rng(seed)
    generated = rng.random(shape)
    reference = np.clip(generated + noise * rng.standard_normal(shape), 0.0, 1.0)
    return generated * data_range, reference * data_range


def _as_float32(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays rounded to float32, and the references computed on exactly those values."""
    return tuple(array.astype(np.float32) for array in arrays)


def _images(generated: np.ndarray, reference: np.ndarray | None = None) -> Images:
    return Images(jnp.asarray(generated), None if reference is None else jnp.asarray(reference))


def _value(metric, artifact) -> float:
    return float(metric.finalize(metric(artifact)))


def _per_image(metric, generated: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return np.asarray(metric.per_image(jnp.asarray(generated), jnp.asarray(reference)))


def _fold(metric, artifacts) -> float:
    state = metric.init()
    for artifact in artifacts:
        state = metric.merge(state, metric(artifact))
    return float(metric.finalize(state))


def _structured_pairs(data_range: float) -> tuple[np.ndarray, np.ndarray]:
    """Eight structured 32x40 RGB pairs: gradients, checkerboards, a ripple, identical images."""
    yy, xx = np.mgrid[0:32, 0:40].astype(np.float64)
    across, down = xx / 39.0, yy / 31.0
    checker = (xx // 4 + yy // 4) % 2

    def rgb(r, g, b):
        return np.stack([r, g, b], axis=-1)

    ramp = rgb(across, down, across * down)
    pairs = [
        (rgb(across, down, 1 - across), rgb(down, across, 1 - down)),
        (rgb(across, across, across), 0.9 * rgb(across, across, across)),
        (ramp, 1.0 - ramp),
        (rgb(checker, checker, 1 - checker), np.roll(rgb(checker, checker, 1 - checker), 1, 1)),
        (ramp, np.clip(ramp + 0.05 * np.sin(xx / 2.0)[..., None], 0.0, 1.0)),
        (rgb(checker, checker, checker), 0.25 + 0.5 * rgb(checker, checker, checker)),
        (rgb(across, down, checker), rgb(across, down, np.roll(checker, 2, 0))),
        (ramp, ramp.copy()),
    ]
    generated = np.stack([g for g, _ in pairs]) * data_range
    reference = np.stack([r for _, r in pairs]) * data_range
    return generated, reference


# --- SSIM -----------------------------------------------------------------------------------


@pytest.mark.parametrize("data_range", DATA_RANGES)
@pytest.mark.parametrize("shape", SHAPES)
def test_ssim_float64_matches_skimage_per_image_and_reports_their_mean(shape, data_range):
    generated, reference = _noisy_pairs((ROWS, *shape), data_range, seed=sum(shape))
    expected = _sk_ssim(generated, reference, data_range)
    metric = metrics.ssim(data_range=data_range)
    with jax.enable_x64(True):
        per_image = _per_image(metric, generated, reference)
        value = _value(metric, _images(generated, reference))
    assert per_image.dtype == np.float64
    # Both sides compute in float64, so they agree far inside the 1e-5 asked of dew.
    np.testing.assert_allclose(per_image, expected, rtol=0, atol=1e-9)
    # The reported value is the mean over images (accumulated in float32).
    assert value == pytest.approx(expected.mean(), abs=1e-6)
    assert np.ptp(expected) > 1e-3, "the images differ, so a mean is not a coincidence"


@pytest.mark.parametrize("data_range", DATA_RANGES)
@pytest.mark.parametrize("shape", SHAPES)
def test_ssim_float32_inputs_match_skimage_within_1e_5(shape, data_range):
    generated, reference = _as_float32(*_noisy_pairs((ROWS, *shape), data_range, seed=sum(shape)))
    expected = _sk_ssim(generated.astype(np.float64), reference.astype(np.float64), data_range)
    metric = metrics.ssim(data_range=data_range)
    per_image = _per_image(metric, generated, reference)
    assert per_image.dtype == np.float32
    np.testing.assert_allclose(per_image, expected, rtol=0, atol=1e-5)
    assert _value(metric, _images(generated, reference)) == pytest.approx(expected.mean(), abs=1e-5)


@pytest.mark.parametrize("data_range", DATA_RANGES)
def test_ssim_matches_skimage_on_gradients_checkerboards_and_identical_images(data_range):
    generated, reference = _structured_pairs(data_range)
    expected = _sk_ssim(generated, reference, data_range)
    assert expected[-1] == pytest.approx(1.0)
    assert expected.min() < 0.0 < expected.max(), "the pairs span negative to perfect SSIM"
    metric = metrics.ssim(data_range=data_range)
    halves = [slice(0, ROWS), slice(ROWS, 2 * ROWS)]
    with jax.enable_x64(True):
        for rows in halves:
            per_image = _per_image(metric, generated[rows], reference[rows])
            np.testing.assert_allclose(per_image, expected[rows], rtol=0, atol=1e-9)
    generated32, reference32 = _as_float32(generated, reference)
    expected32 = _sk_ssim(
        generated32.astype(np.float64), reference32.astype(np.float64), data_range
    )
    for rows in halves:
        per_image = _per_image(metric, generated32[rows], reference32[rows])
        np.testing.assert_allclose(per_image, expected32[rows], rtol=0, atol=1e-5)
    batches = [_images(generated32[rows], reference32[rows]) for rows in halves]
    assert _fold(metric, batches) == pytest.approx(expected32.mean(), abs=1e-5)


def test_ssim_float32_on_flat_regions_stays_within_its_rounding_bound():
    """float32 SSIM of images with flat regions, against the float64 reference.

    dew computes a window's variance as E[x^2] - E[x]^2. In a flat region both terms are
    about mean^2 <= data_range^2 and the difference is pure rounding: two 11-tap passes
    leave at most about 22 u data_range^2 in var_x + var_y - 2 cov, and the contrast term
    divides it by C2 = (K2 data_range)^2. So float32 SSIM can be off by up to
    22 u / K2^2 ~ 1.5e-3 here, more than the 1e-5 reached on textured images (scikit-image's
    own float32 path filters in float64 and stays within 1e-6 on these images). In float64
    dew matches to 1e-9.
    """
    _, xx = np.mgrid[0:32, 0:40]

    def flat(value):
        return np.full((32, 40, 3), value)

    def step(edge):
        return np.where(xx < edge, 0.5, 0.6)[..., None].repeat(3, axis=-1)

    generated = np.stack([flat(0.7), flat(0.3), flat(0.1), step(10)])
    reference = np.stack([flat(0.8), flat(0.7), flat(0.6), step(30)])
    expected = _sk_ssim(generated, reference, 1.0)
    metric = metrics.ssim(data_range=1.0)
    with jax.enable_x64(True):
        np.testing.assert_allclose(
            _per_image(metric, generated, reference), expected, rtol=0, atol=1e-9
        )
    generated32, reference32 = _as_float32(generated, reference)
    bound = 22 * U32 / 0.03**2  # K2 = 0.03 (Wang et al.)
    np.testing.assert_allclose(
        _per_image(metric, generated32, reference32), expected, rtol=0, atol=bound
    )


def test_ssim_of_identical_images_is_one():
    generated, _ = _noisy_pairs((ROWS, 32, 40, 3), 1.0, seed=3)
    generated[1] = np.linspace(0.0, 1.0, 40)[None, :, None]  # a gradient
    generated[2] = 0.25  # a flat image
    generated[3] = (np.arange(40) // 4 % 2)[None, :, None]  # stripes
    same = generated.astype(np.float32)
    np.testing.assert_allclose(_sk_ssim(generated, generated, 1.0), 1.0)
    metric = metrics.ssim()
    np.testing.assert_allclose(_per_image(metric, same, same), 1.0, rtol=0, atol=1e-6)
    assert _value(metric, _images(same, same)) == pytest.approx(1.0, abs=1e-6)


# --- PSNR, MSE, MAE -------------------------------------------------------------------------


@pytest.mark.parametrize("data_range", DATA_RANGES)
@pytest.mark.parametrize("shape", SHAPES)
def test_psnr_mse_mae_float64_match_references_per_image_and_report_their_mean(shape, data_range):
    generated, reference = _noisy_pairs((ROWS, *shape), data_range, seed=7 + sum(shape))
    generated[1] = reference[1] + 0.3 * (generated[1] - reference[1])
    psnr_expected = _sk_psnr(generated, reference, data_range)
    mse_expected = _sk_mse(generated, reference)
    mae_expected = _np_mae(generated, reference)
    psnr, mse, mae = metrics.psnr(data_range), metrics.mse(), metrics.mae()
    with jax.enable_x64(True):
        artifact = _images(generated, reference)
        np.testing.assert_allclose(
            _per_image(psnr, generated, reference), psnr_expected, rtol=0, atol=1e-9
        )
        np.testing.assert_allclose(_per_image(mse, generated, reference), mse_expected, rtol=1e-12)
        np.testing.assert_allclose(_per_image(mae, generated, reference), mae_expected, rtol=1e-12)
        values = {m.name: _value(m, artifact) for m in (psnr, mse, mae)}
    assert np.ptp(psnr_expected) > 1.0, "the images have different errors"
    assert values["psnr"] == pytest.approx(psnr_expected.mean(), abs=1e-5)
    assert values["mse"] == pytest.approx(mse_expected.mean(), rel=1e-6)
    assert values["mae"] == pytest.approx(mae_expected.mean(), rel=1e-6)


@pytest.mark.parametrize("data_range", DATA_RANGES)
@pytest.mark.parametrize("shape", SHAPES)
def test_psnr_mse_mae_float32_inputs_match_references(shape, data_range):
    generated, reference = _as_float32(
        *_noisy_pairs((ROWS, *shape), data_range, seed=7 + sum(shape))
    )
    g64, r64 = generated.astype(np.float64), reference.astype(np.float64)
    psnr, mse, mae = metrics.psnr(data_range), metrics.mse(), metrics.mae()
    artifact = _images(generated, reference)
    psnr_expected = _sk_psnr(g64, r64, data_range)
    np.testing.assert_allclose(
        _per_image(psnr, generated, reference), psnr_expected, rtol=0, atol=1e-5
    )
    np.testing.assert_allclose(_per_image(mse, generated, reference), _sk_mse(g64, r64), rtol=1e-5)
    np.testing.assert_allclose(_per_image(mae, generated, reference), _np_mae(g64, r64), rtol=1e-5)
    assert _value(psnr, artifact) == pytest.approx(psnr_expected.mean(), abs=1e-5)
    assert _value(mse, artifact) == pytest.approx(_sk_mse(g64, r64).mean(), rel=1e-5)
    assert _value(mae, artifact) == pytest.approx(_np_mae(g64, r64).mean(), rel=1e-5)


def test_psnr_is_the_mean_of_per_image_psnrs_not_the_psnr_of_the_pooled_mse():
    rng = np.random.default_rng(11)
    reference = rng.random((2, 16, 16, 3))
    generated = reference + np.array([0.01, 0.2])[:, None, None, None] * rng.standard_normal(
        reference.shape
    )
    generated32, reference32 = _as_float32(generated, reference)
    g64, r64 = generated32.astype(np.float64), reference32.astype(np.float64)
    per_image = _sk_psnr(g64, r64, 1.0)
    pooled = 10.0 * np.log10(1.0 / _sk_mse(g64, r64).mean())
    assert per_image.mean() - pooled > 10.0, "the two definitions differ by far more than noise"
    value = _value(metrics.psnr(), _images(generated32, reference32))
    assert value == pytest.approx(per_image.mean(), abs=1e-5)


@pytest.mark.parametrize(
    ("metric", "reference_fn"),
    [
        (metrics.psnr(), lambda g, r: _sk_psnr(g, r, 1.0)),
        (metrics.mse(), _sk_mse),
        (metrics.mae(), _np_mae),
    ],
    ids=["psnr", "mse", "mae"],
)
def test_image_metrics_weight_each_image_once_across_batches_of_different_sizes(
    metric, reference_fn
):
    # SSIM's weighting across batches of different sizes is held by its batch-split law.
    rng = np.random.default_rng(12)
    reference = rng.random((4, 11, 11, 1)).astype(np.float32)
    noise = np.array([0.4, 0.01, 0.01, 0.01], np.float32)[:, None, None, None]
    generated = np.clip(reference + noise * rng.standard_normal(reference.shape), 0.0, 1.0)
    generated = generated.astype(np.float32)
    per_image = reference_fn(generated.astype(np.float64), reference.astype(np.float64))
    one, three = _images(generated[:1], reference[:1]), _images(generated[1:], reference[1:])
    value = _fold(metric, [one, three])
    assert value == pytest.approx(per_image.mean(), rel=1e-5, abs=1e-6)
    mean_of_batches = (per_image[0] + per_image[1:].mean()) / 2
    assert abs(value - mean_of_batches) > 100 * (1e-5 * abs(value) + 1e-6)


# --- Non-finite values ----------------------------------------------------------------------


def _perfect_and_imperfect_batches():
    rng = np.random.default_rng(21)
    reference = rng.random((3, ROWS, 11, 11, 3)).astype(np.float32)
    generated = np.clip(reference + 0.1 * rng.standard_normal(reference.shape), 0.0, 1.0)
    generated = generated.astype(np.float32)
    generated[1, 2] = reference[1, 2]  # batch 1 holds one perfect reconstruction
    return [_images(g, r) for g, r in zip(generated, reference, strict=True)]


def test_perfect_reconstruction_has_infinite_psnr_like_skimage():
    perfect = np.random.default_rng(4).random((ROWS, 11, 11, 3)).astype(np.float32)
    assert np.all(np.isposinf(_sk_psnr(perfect, perfect, 1.0)))
    psnr = metrics.psnr()
    assert np.all(np.isposinf(_per_image(psnr, perfect, perfect)))
    assert _value(psnr, _images(perfect, perfect)) == math.inf
    assert _value(metrics.mse(), _images(perfect, perfect)) == 0.0


def test_infinite_psnr_stays_infinite_through_merge_and_finalize():
    first, with_perfect, last = _perfect_and_imperfect_batches()
    psnr = metrics.psnr()
    assert math.isfinite(_value(psnr, first)) and math.isfinite(_value(psnr, last))
    assert _value(psnr, with_perfect) == math.inf
    for order in (
        [first, with_perfect, last],
        [with_perfect, first, last],
        [first, last, with_perfect],
    ):
        assert _fold(psnr, order) == math.inf
    compiled_merge = eqx.filter_jit(psnr.merge)
    state = compiled_merge(psnr(first), psnr(with_perfect))
    assert float(psnr.finalize(compiled_merge(state, psnr(last)))) == math.inf


def test_infinite_psnr_stays_infinite_through_reduce_and_reduce_stacked():
    batches = _perfect_and_imperfect_batches()
    pass_metrics = MetricSet([metrics.psnr(), metrics.mse()])
    eager_mse = _fold(metrics.mse(), batches)
    assert _fold(metrics.psnr(), batches) == math.inf
    for scores in (
        pass_metrics.reduce(batches),
        pass_metrics.reduce_stacked(stack_batches(batches)),
    ):
        assert float(scores["psnr"]) == math.inf
        assert_scores_close(scores["mse"], np.float32(eager_mse), what="mse")


def test_nan_pixels_give_nan_values_not_errors():
    generated, reference = _as_float32(*_noisy_pairs((ROWS, 11, 11, 1), 1.0, seed=5))
    finite = _images(generated, reference)
    generated[0, 3, 4, 0] = np.nan
    artifact = _images(generated, reference)
    for metric in IMAGE_METRICS:
        assert math.isfinite(_value(metric, finite)), metric.name
        assert math.isnan(_value(metric, artifact)), metric.name
        assert math.isnan(_fold(metric, [finite, artifact, finite])), metric.name


# --- Errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", IMAGE_METRICS, ids=lambda metric: type(metric).__name__)
def test_image_metric_without_reference_raises_naming_the_metric(metric):
    generated = np.zeros((2, 11, 11, 1), np.float32)
    with pytest.raises(ValueError, match=f"'{metric.name}'.*reference"):
        metric(_images(generated))


@pytest.mark.parametrize("metric", VIDEO_METRICS, ids=lambda metric: type(metric).__name__)
def test_video_metric_without_reference_raises_naming_the_metric(metric):
    with pytest.raises(ValueError, match=f"'{metric.name}'.*reference"):
        metric(Clips(jnp.zeros((2, 2, 11, 11, 1))))


@pytest.mark.parametrize("metric", IMAGE_METRICS, ids=lambda metric: type(metric).__name__)
def test_image_metric_with_other_reference_row_count_raises_naming_both_counts(metric):
    artifact = _images(np.zeros((3, 11, 11, 1), np.float32), np.zeros((5, 11, 11, 1), np.float32))
    with pytest.raises(ValueError, match=f"'{metric.name}'") as caught:
        metric(artifact)
    assert re.search(r"\b3\b", str(caught.value)) and re.search(r"\b5\b", str(caught.value))


@pytest.mark.parametrize("metric", VIDEO_METRICS, ids=lambda metric: type(metric).__name__)
def test_video_metric_with_other_reference_row_count_raises_naming_both_counts(metric):
    artifact = Clips(jnp.zeros((3, 2, 11, 11, 1)), jnp.zeros((5, 2, 11, 11, 1)))
    with pytest.raises(ValueError, match=f"'{metric.name}'") as caught:
        metric(artifact)
    assert re.search(r"\b3\b", str(caught.value)) and re.search(r"\b5\b", str(caught.value))


@pytest.mark.parametrize("metric", IMAGE_METRICS, ids=lambda metric: type(metric).__name__)
@pytest.mark.parametrize("reference_shape", [(2, 16, 12, 1), (2, 12, 16, 1)])
def test_image_metric_with_other_reference_height_or_width_raises(metric, reference_shape):
    artifact = _images(np.zeros((2, 16, 16, 1), np.float32), np.zeros(reference_shape, np.float32))
    with pytest.raises(ValueError, match=re.escape(str(reference_shape))):
        metric(artifact)


def test_references_with_other_channels_or_frames_are_refused_on_construction():
    with rejects(ValueError, "channels", parameter="reference"):
        Images(jnp.zeros((2, 11, 11, 3)), jnp.zeros((2, 11, 11, 1)))
    with rejects(ValueError, "frames", parameter="reference"):
        Clips(jnp.zeros((2, 3, 11, 11, 1)), jnp.zeros((2, 2, 11, 11, 1)))
    with rejects(ValueError, "frames", parameter="reference"):
        Clips(jnp.zeros((2, 3, 11, 11, 1)), jnp.zeros((2, 3, 11, 12, 1)))


@pytest.mark.parametrize("size", [(10, 10), (11, 10), (10, 40)])
def test_ssim_of_images_smaller_than_its_window_raises(size):
    small = np.zeros((2, *size, 1), np.float32)
    with pytest.raises(ValueError, match="window"):
        metrics.ssim()(_images(small, small))
    with pytest.raises(ValueError, match="window"):
        metrics.video_ssim()(Clips(jnp.asarray(small[:, None]), jnp.asarray(small[:, None])))
    # PSNR has no window: the same small images are fine.
    assert _value(metrics.psnr(), _images(small, small + np.float32(0.5))) == pytest.approx(
        20 * math.log10(2), abs=1e-5
    )


DATA_RANGE_METRICS = [PSNR, SSIM, VideoPSNR, VideoSSIM]
DATA_RANGE_FACTORIES = [metrics.psnr, metrics.ssim, metrics.video_psnr, metrics.video_ssim]


@pytest.mark.parametrize("data_range", [0.0, -1.0, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "build", DATA_RANGE_METRICS + DATA_RANGE_FACTORIES, ids=lambda build: build.__name__
)
def test_data_range_that_is_not_a_positive_finite_number_raises_on_construction(build, data_range):
    with pytest.raises(ValueError, match="data_range"):
        build(data_range=data_range)


@pytest.mark.parametrize("build", DATA_RANGE_METRICS, ids=lambda build: build.__name__)
def test_data_range_of_the_wrong_type_is_rejected(build):
    with rejects(ValueError, "data_range", parameter="data_range"):
        build(data_range="1.0")


@pytest.mark.parametrize("metric", IMAGE_METRICS, ids=lambda metric: type(metric).__name__)
def test_image_metric_reading_clips_raises_type_error_naming_images_and_clips(metric):
    artifact = Clips(jnp.zeros((1, 2, 11, 11, 1)), jnp.zeros((1, 2, 11, 11, 1)))
    with pytest.raises(TypeError, match=r"Images.*Clips"):
        metric(artifact)


@pytest.mark.parametrize("metric", VIDEO_METRICS, ids=lambda metric: type(metric).__name__)
def test_video_metric_reading_images_raises_type_error_naming_clips_and_images(metric):
    artifact = Images(jnp.zeros((1, 11, 11, 1)), jnp.zeros((1, 11, 11, 1)))
    with pytest.raises(TypeError, match=r"Clips.*Images"):
        metric(artifact)


# --- Videos ---------------------------------------------------------------------------------


def test_metric_names_are_bare():
    names = [m.name for m in (*IMAGE_METRICS, *VIDEO_METRICS)]
    assert names == ["psnr", "ssim", "mse", "mae", "psnr", "ssim"]


def _noisy_clips(shape: tuple[int, ...], noises, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 clips and references, with a noise level per clip."""
    rng = np.random.default_rng(seed)
    reference = rng.random(shape)
    noise = np.asarray(noises, np.float64).reshape(-1, *([1] * (len(shape) - 1)))
    generated = np.clip(reference + noise * rng.standard_normal(shape), 0.0, 1.0)
    return _as_float32(generated, reference)


def _per_frame(reference_fn, generated: np.ndarray, reference: np.ndarray, *args) -> np.ndarray:
    frames = generated.shape[2:]
    return reference_fn(
        generated.reshape(-1, *frames).astype(np.float64),
        reference.reshape(-1, *frames).astype(np.float64),
        *args,
    )


@pytest.mark.parametrize("data_range", DATA_RANGES)
def test_video_psnr_and_ssim_are_the_mean_over_all_frames_of_skimage_values(data_range):
    generated, reference = _noisy_clips((2, 2, 32, 40, 3), [0.05, 0.2], seed=31)
    generated, reference = generated * np.float32(data_range), reference * np.float32(data_range)
    clip_artifact = Clips(jnp.asarray(generated), jnp.asarray(reference))
    psnr_frames = _per_frame(_sk_psnr, generated, reference, data_range)
    ssim_frames = _per_frame(_sk_ssim, generated, reference, data_range)
    assert psnr_frames.shape == ssim_frames.shape == (4,)
    assert _value(metrics.video_psnr(data_range), clip_artifact) == pytest.approx(
        psnr_frames.mean(), abs=1e-5
    )
    assert _value(metrics.video_ssim(data_range), clip_artifact) == pytest.approx(
        ssim_frames.mean(), abs=1e-5
    )


@pytest.mark.parametrize(
    ("metric", "reference_fn"),
    [(metrics.video_psnr(), _sk_psnr), (metrics.video_ssim(), _sk_ssim)],
    ids=["psnr", "ssim"],
)
def test_video_metrics_pool_frames_across_clips_of_different_lengths(metric, reference_fn):
    # One batch holds a single poor clip of four frames, the other four good one-frame clips.
    long = _noisy_clips((1, 4, 11, 11, 1), [0.4], seed=41)
    short = _noisy_clips((4, 1, 11, 11, 1), [0.01] * 4, seed=42)
    long_frames = _per_frame(reference_fn, *long, 1.0)
    short_frames = _per_frame(reference_fn, *short, 1.0)
    per_frame_mean = np.concatenate([long_frames, short_frames]).mean()
    per_clip_mean = np.mean([long_frames.mean(), *short_frames])
    assert abs(per_frame_mean - per_clip_mean) > 0.05
    batches = [Clips(jnp.asarray(g), jnp.asarray(r)) for g, r in (long, short)]
    assert _fold(metric, batches) == pytest.approx(per_frame_mean, abs=1e-5)
    reduced = float(MetricSet([metric]).reduce(batches)[metric.name])
    assert reduced == pytest.approx(per_frame_mean, abs=1e-5)


def test_perfect_clip_has_infinite_video_psnr_through_merge():
    perfect = np.random.default_rng(51).random((1, 4, 11, 11, 1)).astype(np.float32)
    imperfect = _noisy_clips((1, 4, 11, 11, 1), [0.1], seed=52)
    psnr = metrics.video_psnr()
    batches = [Clips(jnp.asarray(imperfect[0]), jnp.asarray(imperfect[1]))]
    assert math.isfinite(_fold(psnr, batches))
    batches.append(Clips(jnp.asarray(perfect), jnp.asarray(perfect)))
    assert _fold(psnr, batches) == math.inf
    assert _value(metrics.video_ssim(), batches[-1]) == pytest.approx(1.0, abs=1e-6)


# --- Laws, jit and scan ---------------------------------------------------------------------


def _slow_ssim(metrics_list):
    """The SSIM metrics, whose law checks compile several windowed programs, marked slow."""
    return [
        pytest.param(m, marks=pytest.mark.slow) if "ssim" in m.name else m for m in metrics_list
    ]


@pytest.mark.parametrize(
    "metric", _slow_ssim(IMAGE_METRICS), ids=lambda metric: type(metric).__name__
)
def test_image_metrics_obey_the_metric_laws(metric):
    strategy = images(size=11, channels=1)
    check_metric_laws(metric, strategy, max_examples=10)


@pytest.mark.parametrize(
    "metric", _slow_ssim(VIDEO_METRICS), ids=lambda metric: type(metric).__name__
)
def test_video_metrics_obey_the_metric_laws(metric):
    strategy = clips(rows=st.integers(1, 2), frames=st.sampled_from([1, 2]), channels=1)
    check_metric_laws(metric, strategy, max_examples=10)


def _image_batches() -> list[Images]:
    rng = np.random.default_rng(61)
    reference = rng.random((3, ROWS, 11, 11, 1)).astype(np.float32)
    noise = np.array([0.01, 0.1, 0.3], np.float32)[:, None, None, None, None]
    generated = np.clip(reference + noise * rng.standard_normal(reference.shape), 0.0, 1.0)
    return [_images(g, r) for g, r in zip(generated.astype(np.float32), reference, strict=True)]


@pytest.mark.parametrize("metric", IMAGE_METRICS, ids=lambda metric: type(metric).__name__)
def test_image_metric_compiled_call_equals_the_eager_call(metric):
    batch = _image_batches()[1]
    compiled = eqx.filter_jit(metric.__call__)(batch)
    assert_scores_close(metric.finalize(compiled), metric.finalize(metric(batch)), what="jit")


def test_image_metrics_reduce_stacked_in_a_scan_equals_the_eager_fold():
    batches = _image_batches()
    pass_metrics = MetricSet(IMAGE_METRICS)
    scanned = pass_metrics.reduce_stacked(stack_batches(batches))
    for metric in IMAGE_METRICS:
        eager = _fold(metric, batches)
        assert_scores_close(scanned[metric.name], np.float32(eager), what=metric.name)


def test_video_metrics_compiled_call_and_reduce_stacked_equal_the_eager_path():
    clip_pairs = [_noisy_clips((2, 2, 11, 11, 1), [0.05, 0.3], seed=s) for s in (71, 72)]
    batches = [Clips(jnp.asarray(g), jnp.asarray(r)) for g, r in clip_pairs]
    scanned = MetricSet(VIDEO_METRICS).reduce_stacked(stack_batches(batches))
    for metric in VIDEO_METRICS:
        eager = _fold(metric, batches)
        compiled = metric.finalize(eqx.filter_jit(metric.__call__)(batches[0]))
        assert_scores_close(compiled, metric.finalize(metric(batches[0])), what="jit")
        assert_scores_close(scanned[metric.name], np.float32(eager), what=metric.name)


@pytest.mark.parametrize(
    "metric", IMAGE_METRICS + VIDEO_METRICS, ids=lambda metric: type(metric).__name__
)
def test_a_non_empty_pass_finalizes_eagerly_under_debug_nans(metric):
    # Users debugging NaNs turn debug_nans on: the NaN of an empty pass must never be
    # built for a pass that is not empty, eagerly or compiled.
    rng = np.random.default_rng(5)
    shape = (ROWS, 4, 11, 11, 1) if metric in VIDEO_METRICS else (ROWS, 11, 11, 1)
    generated, reference = (jnp.asarray(rng.uniform(size=shape), jnp.float32) for _ in "ab")
    kind = Clips if metric in VIDEO_METRICS else Images
    with jax.debug_nans(True):
        state = metric.merge(metric.init(), metric(kind(generated, reference)))
        eager = float(metric.finalize(state))
        compiled = float(jax.jit(metric.finalize)(state))
    assert math.isfinite(eager) and compiled == pytest.approx(eager, rel=1e-6)
    assert math.isnan(float(metric.finalize(metric.init())))  # debug_nans off: NaN is data
