"""dew.nn.inception: pytorch-fid's FID InceptionV3 in Equinox. Parity with pytorch-fid itself is
in tests/parity/test_inception_parity.py; these tests need no torch."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects

from dew.nn import _inception_layers as layers
from dew.nn.inception import (
    _FID_WEIGHTS_FILENAME,
    _FID_WEIGHTS_URL,
    FIDInceptionV3,
    default_weights_path,
)


@pytest.fixture(scope="module")
def shapes():
    return layers._parameter_shapes()


def _random_state(shapes, seed=0):
    """Random weights with pytorch-fid's keys, scaled so that activations stay O(1)."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape in shapes.items():
        if key.endswith("conv.weight"):
            fan_in = np.prod(shape[1:])
            state[key] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        elif key.endswith("running_var"):
            state[key] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            state[key] = rng.normal(0, 0.1, shape).astype(np.float32)
    return state


def test_the_network_reads_pytorch_fids_470_arrays(shapes):
    assert len(shapes) == 470  # 94 BasicConv2d: a conv weight and four batch-norm arrays
    assert shapes["Conv2d_1a_3x3.conv.weight"] == (32, 3, 3, 3)
    assert shapes["Mixed_6b.branch7x7dbl_3.conv.weight"] == (128, 128, 1, 7)
    assert shapes["Mixed_7c.branch_pool.conv.weight"] == (192, 2048, 1, 1)
    assert shapes["Mixed_7c.branch3x3dbl_3b.bn.running_var"] == (384,)


def test_a_wrong_state_dict_names_every_problem(shapes):
    state = _random_state(shapes)
    del state["Mixed_5b.branch1x1.conv.weight"]
    state["Mixed_5b.branch_pool.bn.bias"] = np.zeros(5, np.float32)
    state["Mixed_9z.conv.weight"] = np.zeros(1, np.float32)
    # Ignored: the classifier and num_batches_tracked.
    state["fc.weight"] = np.zeros((1008, 2048), np.float32)
    state["fc.bias"] = np.zeros(1008, np.float32)
    state["Conv2d_1a_3x3.bn.num_batches_tracked"] = np.array(1)
    with pytest.raises(ValueError, match="not pytorch-fid's FID InceptionV3") as caught:
        FIDInceptionV3(state)
    message = str(caught.value)
    assert "missing keys (1): Mixed_5b.branch1x1.conv.weight" in message
    assert "unexpected keys (1): Mixed_9z.conv.weight" in message
    assert "Mixed_5b.branch_pool.bn.bias: (5,), expected (32,)" in message
    assert "fc." not in message and "num_batches_tracked" not in message


def test_an_unknown_dtype_and_float64_without_x64_are_refused(shapes):
    state = _random_state(shapes)
    with pytest.raises(ValueError, match="dtype 'float16' is not one of 'float32', 'float64'"):
        FIDInceptionV3(state, dtype="float16")
    if not jax.config.read("jax_enable_x64"):
        with pytest.raises(ValueError, match=r"needs 64-bit JAX.*jax_enable_x64"):
            FIDInceptionV3(state, dtype="float64")


def _bilinear_reference(image: np.ndarray, size: int) -> np.ndarray:
    """PyTorch's upsample_bilinear2d (align_corners=False) pixel by pixel, in float64."""

    def source(i, n):
        position = max((i + 0.5) * n / size - 0.5, 0.0)
        low = min(int(np.floor(position)), n - 1)
        return low, min(low + 1, n - 1), position - low

    height, width, _ = image.shape
    out = np.zeros((size, size, image.shape[2]))
    for i, j in itertools.product(range(size), range(size)):
        h0, h1, a = source(i, height)
        w0, w1, b = source(j, width)
        out[i, j] = (1 - a) * ((1 - b) * image[h0, w0] + b * image[h0, w1]) + a * (
            (1 - b) * image[h1, w0] + b * image[h1, w1]
        )
    return out


@pytest.mark.parametrize(("height", "width"), [(5, 7), (40, 23), (9, 9)])
def test_the_resize_is_bilinear_without_antialiasing(height, width):
    image = np.random.default_rng(height).random((height, width, 3))
    expected = _bilinear_reference(image, 9)
    with jax.enable_x64(True):
        resized = np.asarray(layers._resize(jnp.asarray(image[None]), 9))[0]
        antialiased = jax.image.resize(jnp.asarray(image), (9, 9, 3), "bilinear")
    np.testing.assert_allclose(resized, expected, rtol=0, atol=1e-14)
    if height > 9:  # downsampling: the antialiased resize is another function
        assert np.abs(np.asarray(antialiased) - expected).max() > 1e-2


def test_the_average_pool_excludes_the_padding():
    x = np.random.default_rng(0).random((1, 4, 5, 2))
    expected = np.zeros_like(x)
    for i, j in itertools.product(range(4), range(5)):
        expected[0, i, j] = x[0, max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2].mean(axis=(0, 1))
    with jax.enable_x64(True):
        pooled = np.asarray(layers._average_pool(jnp.asarray(x)))
    np.testing.assert_allclose(pooled, expected, rtol=0, atol=1e-15)


def test_the_max_pools():
    x = -np.random.default_rng(0).random((1, 5, 6, 2)).astype(np.float32)  # all negative
    padded = np.asarray(layers._max_pool(jnp.asarray(x), 1, 1))
    strided = np.asarray(layers._max_pool(jnp.asarray(x)))
    for i, j in itertools.product(range(5), range(6)):
        window = x[0, max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2].max(axis=(0, 1))
        np.testing.assert_array_equal(padded[0, i, j], window)  # the padding is -inf, not 0
    assert strided.shape == (1, 2, 2, 2)
    np.testing.assert_array_equal(strided[0, 1, 1], x[0, 2:5, 2:5].max(axis=(0, 1)))


@pytest.fixture(scope="module")
def model(shapes):
    return FIDInceptionV3(_random_state(shapes))


@pytest.mark.slow
def test_features_are_per_image_and_jit_compatible(model):
    rng = np.random.default_rng(1)
    images = jnp.asarray(rng.random((2, 12, 10, 3), dtype=np.float32))
    features = model.features(images)
    assert features.shape == (2, 2048) and features.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(features))) and bool(jnp.all(features >= 0))
    jitted = jax.jit(lambda network, x: network.features(x))(model, images)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(features), rtol=0, atol=1e-5)
    swapped = model.features(images[::-1])  # rows do not mix
    np.testing.assert_allclose(np.asarray(swapped), np.asarray(features[::-1]), atol=1e-5)
    assert model.features(images[:0]).shape == (0, 2048)


def test_bad_images_are_refused(model):
    with rejects(
        ValueError, r"shape \(rows, height, width, 3\), got \(2, 8, 8\)", parameter="images"
    ):
        model.features(jnp.zeros((2, 8, 8)))
    with rejects(ValueError, r"got \(1, 8, 8, 4\)", parameter="images"):
        model.features(jnp.zeros((1, 8, 8, 4)))
    with rejects(ValueError, "float images in \\[0, 1\\], got uint8", parameter="images"):
        model.features(jnp.zeros((1, 8, 8, 3), jnp.uint8))


def test_the_default_weights_path(tmp_path, monkeypatch):
    monkeypatch.delenv("DEW_FID_WEIGHTS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    cached = tmp_path / ".cache" / "dew" / _FID_WEIGHTS_FILENAME
    with pytest.raises(FileNotFoundError) as caught:
        default_weights_path()
    message = str(caught.value)
    assert str(cached) in message and _FID_WEIGHTS_URL in message and "DEW_FID_WEIGHTS" in message
    assert "downloads nothing" in message
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    assert default_weights_path() == cached
    chosen = tmp_path / "chosen.pth"
    monkeypatch.setenv("DEW_FID_WEIGHTS", str(chosen))
    with pytest.raises(FileNotFoundError, match=r"chosen\.pth.*\$DEW_FID_WEIGHTS"):
        default_weights_path()
    chosen.write_bytes(b"")
    assert default_weights_path() == chosen
    explicit = tmp_path / "explicit.pth"
    with pytest.raises(FileNotFoundError, match=r"explicit\.pth.*the weights path given"):
        default_weights_path(explicit)
    explicit.write_bytes(b"")
    assert default_weights_path(explicit) == explicit


def test_the_default_weights_are_checked_by_their_sha256(tmp_path, monkeypatch, shapes):
    import struct

    monkeypatch.setenv("DEW_FID_WEIGHTS", str(tmp_path / "impostor.pth"))
    (tmp_path / "impostor.pth").write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(ValueError, match=r"impostor\.pth.*does not start with '6726825d'"):
        FIDInceptionV3.load()
    # An explicit path is not checked: it is read (here: an empty safetensors file).
    with pytest.raises(ValueError, match="missing keys \\(470\\)"):
        FIDInceptionV3.load(tmp_path / "impostor.pth")
