"""Sample-quality metrics: `class_accuracy` and the foreground statistics of generated and
real rows (`dew.metrics.shape_scores`), against NumPy and SciPy, and their monoid laws."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

from dew import metrics
from dew.artifacts import Clips, Images
from dew.metrics import MetricSet, ShapeClassifier
from dew.metrics._samples import (
    ForegroundColourSpread,
    ForegroundFraction,
    ForegroundParts,
    foreground_parts,
)
from dew.testing import check_metric_laws, clips, images

UNTRAINED = ShapeClassifier.fresh(11, (4, 4), key=jax.random.key(0))


def _foreground_metrics(**kwargs):
    return [
        ForegroundFraction(**kwargs),
        ForegroundColourSpread(**kwargs),
        ForegroundParts(**kwargs),
        ForegroundFraction(population="reference", name="real_foreground_fraction", **kwargs),
        ForegroundColourSpread(population="reference", name="real_colour_spread", **kwargs),
        ForegroundParts(population="reference", name="real_foreground_parts", **kwargs),
    ]


def _numpy_statistics(images: np.ndarray, threshold: float) -> dict[str, float]:
    """The foreground statistics computed image by image with NumPy and SciPy."""
    images = np.asarray(images, np.float64)
    fractions, spreads, parts = [], [], []
    for image in images:
        mask = image.max(axis=-1) > threshold
        fractions.append(mask.mean())
        if mask.any():
            spreads.append(np.sqrt(image[mask].var(axis=0).mean()))
        parts.append(ndimage.label(mask)[1])  # SciPy's default structure: 4-connected
    return {
        "fraction": float(np.mean(fractions)),
        "spread": float(np.mean(spreads)) if spreads else float("nan"),
        "parts": float(np.mean(parts)),
    }


@st.composite
def masks(draw):
    # Few shapes: each one compiles the labelling loop once.
    rows, height, width = draw(st.sampled_from([(1, 1, 1), (3, 4, 7), (2, 12, 12)]))
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return rng.random((rows, height, width)) < density


@settings(max_examples=30)
@given(mask=masks())
def test_foreground_parts_counts_scipy_4_connected_components(mask):
    expected = [ndimage.label(image)[1] for image in mask]
    assert foreground_parts(jnp.asarray(mask)).tolist() == expected


def test_foreground_parts_tells_edges_from_corners():
    # Two pixels sharing a corner are two pieces; a snake through the image is one.
    diagonal = np.eye(4, dtype=bool)[None]
    snake = np.zeros((1, 5, 5), bool)
    snake[0, 0, :], snake[0, :, 4], snake[0, 4, :], snake[0, 2, :] = True, True, True, True
    snake[0, 2, 4], snake[0, 3, 0] = True, True
    assert foreground_parts(jnp.asarray(diagonal)).tolist() == [4]
    assert foreground_parts(jnp.asarray(snake)).tolist() == [ndimage.label(snake[0])[1]] == [1]


@settings(max_examples=12)
@given(
    artifact=images(rows=st.just(4), size=st.sampled_from([11, 16]), channels=st.just(3)),
    threshold=st.sampled_from([0.0, 0.15, 0.5, 0.95]),
    background=st.sampled_from([0.0, 0.5, 0.9]),
)
def test_foreground_statistics_equal_numpy_and_scipy(artifact, threshold, background):
    # Zero a share of the pixels, as a black background, so masks have holes and pieces.
    generated = np.asarray(artifact.generated)
    kept = np.random.default_rng(0).random(generated.shape[:3]) >= background
    generated = generated * kept[..., None]
    reference = np.asarray(artifact.reference)
    scored = MetricSet(_foreground_metrics(threshold=threshold)).reduce(
        [Images(jnp.asarray(generated), jnp.asarray(reference))]
    )
    ours = _numpy_statistics(generated, threshold)
    real = _numpy_statistics(reference, threshold)
    np.testing.assert_allclose(
        [scored[name] for name in ("foreground_fraction", "foreground_parts")],
        [ours["fraction"], ours["parts"]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        [scored["real_foreground_fraction"], scored["real_foreground_parts"]],
        [real["fraction"], real["parts"]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        [scored["foreground_colour_spread"], scored["real_colour_spread"]],
        [ours["spread"], real["spread"]],
        rtol=1e-4,
        atol=1e-6,
    )


def test_a_flat_coloured_shape_has_no_colour_spread_and_one_piece():
    image = np.zeros((1, 12, 12, 3), np.float32)
    image[0, 3:7, 2:9] = [0.3, 0.8, 0.5]
    scored = MetricSet(_foreground_metrics()).reduce(
        [Images(jnp.asarray(image), jnp.asarray(image))]
    )
    assert scored["foreground_colour_spread"] == pytest.approx(0.0, abs=1e-7)
    assert scored["foreground_parts"] == scored["real_foreground_parts"] == 1.0
    assert scored["foreground_fraction"] == pytest.approx(28 / 144)


def test_an_image_without_foreground_leaves_the_colour_spread_out():
    # The mean runs over images with a foreground: an empty one has no colour to spread.
    image = np.zeros((2, 12, 12, 3), np.float32)
    image[1, :2, :2] = [[[0.2, 0.4, 0.9], [0.4, 0.4, 0.9]], [[0.2, 0.4, 0.9], [0.4, 0.4, 0.9]]]
    spread = ForegroundColourSpread()
    value = float(spread.finalize(spread(Images(jnp.asarray(image)))))
    assert value == pytest.approx(np.sqrt(np.var([0.2, 0.4, 0.2, 0.4]) / 3))
    assert np.isnan(float(spread.finalize(spread(Images(jnp.zeros((1, 12, 12, 3)))))))


def _logits_of(classifier, images):
    return np.asarray(eqx.filter_jit(classifier)(jnp.asarray(images)))


@settings(max_examples=15)
@given(
    artifact=images(rows=st.sampled_from([1, 5]), size=st.just(11), channels=st.just(3), classes=3)
)
def test_class_accuracy_is_the_share_of_rows_whose_argmax_is_their_label(artifact):
    logits = _logits_of(UNTRAINED, artifact.generated)
    expected = np.mean(logits.argmax(axis=-1) == np.asarray(artifact.labels))
    metric = metrics.class_accuracy(UNTRAINED)
    assert float(metric.finalize(metric(artifact))) == pytest.approx(expected)


@settings(max_examples=10)
@given(artifact=clips(rows=st.just(2), frames=st.sampled_from([1, 3]), channels=3, classes=3))
def test_class_accuracy_of_clips_classifies_every_frame_under_its_clip_label(artifact):
    frames = artifact.generated.shape[1]
    logits = _logits_of(UNTRAINED, np.asarray(artifact.generated).reshape(-1, 11, 11, 3))
    labels = np.repeat(np.asarray(artifact.labels), frames)
    expected = np.mean(logits.argmax(axis=-1) == labels)
    metric = metrics.class_accuracy(UNTRAINED, clips=True)
    assert metric.artifact_type is Clips
    assert float(metric.finalize(metric(artifact))) == pytest.approx(expected)


@pytest.mark.parametrize(
    "metric",
    [metrics.class_accuracy(UNTRAINED), *_foreground_metrics()],
    ids=lambda metric: metric.name,
)
def test_sample_metrics_obey_the_monoid_laws_over_images(metric):
    check_metric_laws(
        metric, images(size=st.just(11), channels=st.just(3), classes=3), max_examples=10
    )


@pytest.mark.parametrize(
    "metric",
    [metrics.class_accuracy(UNTRAINED, clips=True), *_foreground_metrics(clips=True)],
    ids=lambda metric: metric.name,
)
def test_sample_metrics_obey_the_monoid_laws_over_clips(metric):
    check_metric_laws(metric, clips(channels=3, classes=3), max_examples=6)


def test_class_accuracy_without_labels_names_what_is_missing():
    metric = metrics.class_accuracy(UNTRAINED)
    with pytest.raises(ValueError, match="these Images carry no labels"):
        metric(Images(jnp.zeros((2, 11, 11, 3))))


def test_class_accuracy_names_a_label_outside_the_classifier_classes():
    metric = metrics.class_accuracy(UNTRAINED)
    bad = Images(jnp.zeros((2, 11, 11, 3)), labels=jnp.asarray([0, 3], jnp.int32))
    with pytest.raises(ValueError, match="holds label 3 at row 1; valid labels are 0 to 2"):
        metric(bad)


def test_a_real_row_statistic_without_reference_rows_says_so():
    metric = ForegroundParts(population="reference", name="real_foreground_parts")
    with pytest.raises(ValueError, match=r"reads the real rows, but Images\.reference is None"):
        metric(Images(jnp.zeros((2, 11, 11, 3))))


def test_sample_metrics_read_their_artifact_type():
    with pytest.raises(TypeError, match="reads Images, got Clips"):
        ForegroundFraction()(Clips(jnp.zeros((1, 2, 11, 11, 3))))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"population": "real"},
            "population must be one of ('generated', 'reference'), got 'real'",
        ),
        ({"threshold": -0.1}, "threshold must be a finite number >= 0, got -0.1"),
        ({"threshold": float("nan")}, "threshold must be a finite number >= 0, got nan"),
    ],
)
def test_foreground_metrics_refuse_a_bad_population_or_threshold(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ForegroundFraction(**kwargs)


def test_class_accuracy_describes_its_classifier_for_the_sampling_record():
    described = metrics.class_accuracy(UNTRAINED).feature_definition()
    assert described["network"].startswith("ShapeClassifier")
    assert described["held_out_accuracy"] is None and described["weights_sha256"] is None
    assert isinstance(metrics.class_accuracy(UNTRAINED), metrics.DescribesFeatures)
