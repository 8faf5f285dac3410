"""dew.metrics.clip_score on a tiny random CLIP: its monoid laws, the clamp of the mean at
finalize (as torchmetrics' CLIPScore), the pairing of images with prompts, and its errors."""

import hashlib

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from test_clip_model import TINY, random_state_dict

from dew import metrics
from dew.artifacts import Images
from dew.metrics._clip import CLIPScore, CLIPScoreState
from dew.nn.clip import CLIP, tokenize
from dew.testing import check_metric_laws

pytest.importorskip("ftfy")
pytest.importorskip("regex")

PROMPTS = ("a photo of a cat", "two dogs in the snow", "Café &amp; crème", "", "x " * 90)


@pytest.fixture(scope="module")
def model():
    return CLIP(random_state_dict(TINY, seed=3), TINY)


@st.composite
def prompted_images(draw):
    rows = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    prompts = tuple(draw(st.sampled_from(PROMPTS)) for _ in range(rows))
    return Images(jnp.asarray(rng.random((rows, 16, 16, 3), np.float32)), prompts=prompts)


def _by_hand(model: CLIP, images: Images) -> np.ndarray:
    image = np.asarray(model.encode_image(images.generated), np.float64)
    text = np.asarray(model.encode_text(jnp.asarray(tokenize(images.prompts))), np.float64)
    cosine = (
        np.sum(image * text, -1) / np.linalg.norm(image, axis=-1) / np.linalg.norm(text, axis=-1)
    )
    return 100 * cosine


def test_clip_score_obeys_the_metric_laws(model):
    # Float32 features of a row may differ in the last bits with the batch's row count.
    check_metric_laws(
        metrics.clip_score(model), prompted_images(), max_examples=10, rtol=1e-5, atol=1e-4
    )


@pytest.mark.slow  # about 7 s; CI runs it with the slow tests
def test_the_score_is_the_mean_of_100_cosines_over_all_pairs(model):
    rng = np.random.default_rng(0)
    images = Images(jnp.asarray(rng.random((5, 20, 16, 3), np.float32)), prompts=PROMPTS)
    metric = metrics.clip_score(model)
    state = metric.merge(metric(images.rows(0, 2)), metric(images.rows(2, 5)))
    assert state.count == 5
    per_pair = _by_hand(model, images)
    np.testing.assert_allclose(state.total, per_pair.sum(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        metric.finalize(state), max(per_pair.mean(), 0.0), rtol=1e-5, atol=1e-4
    )


def test_a_pass_reduces_it_as_the_merge_of_its_batches(model):
    rng = np.random.default_rng(4)
    batches = [
        Images(jnp.asarray(rng.random((2, 16, 16, 3), np.float32)), prompts=PROMPTS[:2]),
        Images(jnp.asarray(rng.random((3, 16, 16, 3), np.float32)), prompts=PROMPTS[2:]),
    ]
    metric = metrics.clip_score(model)
    scores = metrics.reduce([metric], batches)
    expected = metric.finalize(metric.merge(metric(batches[0]), metric(batches[1])))
    assert list(scores) == ["clip_score"]
    np.testing.assert_allclose(scores["clip_score"], expected, rtol=1e-6)


def test_finalize_clamps_the_mean_not_each_pair(model):
    metric = CLIPScore(model)
    # Pairs scoring +30 and -50: torchmetrics' max(mean, 0) gives 0; clamping each pair
    # first would give 15.
    assert metric.finalize(CLIPScoreState(30.0 - 50.0, 2)) == 0.0
    assert metric.finalize(CLIPScoreState(30.0 - 10.0, 2)) == 10.0
    assert np.isnan(metric.finalize(metric.init()))  # an empty pass
    assert np.isnan(metric.finalize(CLIPScoreState(float("nan"), 1)))  # data, not hidden


def test_images_without_prompts_or_with_too_few_are_refused(model):
    metric = metrics.clip_score(model)
    generated = jnp.zeros((3, 16, 16, 3))
    with pytest.raises(ValueError, match=r"'clip_score' .* carry no prompts"):
        metric(Images(generated))
    with pytest.raises(ValueError, match=r"one prompt per generated row, got 2 prompt\(s\) for 3"):
        Images(generated, prompts=("a", "b"))


def test_images_outside_the_unit_interval_are_refused_and_nan_scores_nan(model):
    metric = metrics.clip_score(model)
    eight_bit = jnp.zeros((2, 16, 16, 3)).at[1, 3, 4, 2].set(255.0)
    with pytest.raises(
        ValueError, match=r"\[0, 1\], got 255.0 at row 1, pixel \(3, 4\), channel 2"
    ):
        metric(Images(eight_bit, prompts=PROMPTS[:2]))
    diverged = jnp.full((1, 16, 16, 3), jnp.nan)
    assert np.isnan(metric.finalize(metric(Images(diverged, prompts=PROMPTS[:1]))))


def test_the_factory_loads_a_checkpoint_and_names_the_metric(model, tmp_path):
    from test_clip_model import write_safetensors

    path = write_safetensors(tmp_path / "tiny.safetensors", random_state_dict(TINY, seed=3))
    metric = metrics.clip_score(path, model=TINY, name="prompt_alignment")
    assert metric.name == "prompt_alignment" and metric.host
    images = Images(
        jnp.asarray(np.random.default_rng(1).random((2, 16, 16, 3), np.float32)),
        prompts=PROMPTS[:2],
    )
    np.testing.assert_allclose(
        metric.finalize(metric(images)),
        metrics.clip_score(model).finalize(metrics.clip_score(model)(images)),
        rtol=1e-6,
    )
    # what a SamplingProtocol records of it: the architecture, the preprocessing, the file
    described = metric.feature_definition()
    assert isinstance(metric, metrics.DescribesFeatures)
    assert described["weights_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert f"'image_size': {TINY.image_size}" in described["network"]
    assert described["preprocessing"].startswith(f"images: short side resized to {TINY.image_size}")
    assert metrics.clip_score(model).feature_definition()["weights_sha256"] is None
