"""FIDInceptionV3 against pytorch-fid 0.3.0's own InceptionV3 on the same random weights,
saved in torch's legacy format so that dew.io's legacy reader runs (the published weights
predate torch 1.6). Tolerances: docs/decisions/0018-fid-float32-tolerance.md."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pytorch_fid import calibrated_state_dict, import_pytorch_fid, pytorch_fid_inception

from dew.io import load_torch_state_dict
from dew.nn.inception import FIDInceptionV3

torch = pytest.importorskip("torch")
import_pytorch_fid()

pytestmark = pytest.mark.parity

# Two sizes: one upsampled to 299x299, one downsampled on one axis and upsampled on the other
# (where an antialiased resize would differ by ~0.5).
SIZES = {"upsampled": (3, 64, 48), "mixed": (2, 400, 160)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The random weights as a legacy-format .pth, the test images (NCHW float64), and
    pytorch-fid's features of them in float64 and in float32."""
    torch.set_num_threads(2)
    state = calibrated_state_dict(seed=0, sizes=[size[1:] for size in SIZES.values()])
    path = tmp_path_factory.mktemp("weights") / "calibrated_legacy.pth"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    with pytest.MonkeyPatch.context() as patch:
        net = pytorch_fid_inception(state, patch)
    generator = torch.Generator().manual_seed(2)
    images = {
        name: torch.rand(rows, 3, height, width, generator=generator, dtype=torch.float64)
        for name, (rows, height, width) in SIZES.items()
    }
    with torch.no_grad():
        float64 = {name: _pool3(net.double(), x) for name, x in images.items()}
        float32 = {name: _pool3(net.float(), x.float()) for name, x in images.items()}
    return path, images, float64, float32


def _pool3(net, images) -> np.ndarray:
    return net(images)[0].reshape(images.shape[0], -1).numpy()


def _nhwc(images) -> jnp.ndarray:
    return jnp.asarray(images.numpy().transpose(0, 2, 3, 1))


def test_the_legacy_file_reads_as_torch_reads_it(reference):
    path = reference[0]
    expected = torch.load(path)
    loaded = load_torch_state_dict(path)
    assert list(loaded) == list(expected)
    assert all(np.array_equal(loaded[k], v.numpy()) for k, v in expected.items())


@pytest.mark.parametrize("size", SIZES)
def test_float64_features_match_pytorch_fid_to_1e_4(reference, size):
    path, images, float64, _ = reference
    with jax.enable_x64(True):
        model = FIDInceptionV3.load(path, dtype="float64")
        features = model.features(_nhwc(images[size]))
        assert features.dtype == jnp.float64
        features = np.asarray(features)
    expected = float64[size]
    assert features.shape == expected.shape == (SIZES[size][0], 2048)
    # Calibrated: the features are neither near zero nor large (the tolerance is absolute).
    assert np.abs(expected).mean() > 0.1 and np.abs(expected).max() < 10
    np.testing.assert_allclose(features, expected, rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def float32_features(reference):
    path, images, _, _ = reference
    model = FIDInceptionV3.load(path)
    return {name: model.features(_nhwc(x.float())) for name, x in images.items()}


@pytest.mark.parametrize("size", SIZES)
def test_float32_features_are_within_1e_3_of_pytorch_fid_float64(reference, float32_features, size):
    assert float32_features[size].dtype == jnp.float32
    expected = reference[2][size]
    np.testing.assert_allclose(np.asarray(float32_features[size]), expected, rtol=0, atol=1e-3)


def test_float32_features_match_pytorch_fid_float32_to_1e_3(reference, float32_features):
    # On the upsampled images, where pytorch-fid's own float32 is within ~5e-4 of its float64;
    # on the downsampled noise its float32 is 3e-3 from its float64 while dew's is 1e-4
    # (decision 0018), so no one can match it to 1e-3 there.
    _, _, float64, float32 = reference
    assert np.abs(float32["upsampled"] - float64["upsampled"]).max() < 1e-3
    np.testing.assert_allclose(
        np.asarray(float32_features["upsampled"]), float32["upsampled"], rtol=0, atol=1e-3
    )
