"""The Fréchet distance against pytorch-fid 0.3.0's `calculate_frechet_distance` on identical
moments, to 1e-5 relative, singular covariances included; and the FID metric's pooled moments
against pytorch-fid's `np.mean`/`np.cov` of the same float64 activations.

Needs torch and pytorch-fid (the `parity` extra); skips cleanly without them. pytorch-fid
0.3.0 calls `scipy.linalg.sqrtm(..., disp=False)`: SciPy 1.17 warns that `disp` is
deprecated (silenced here, like sqrtm's LinAlgWarning on the singular products compared on
purpose), and SciPy 1.18 removes it, so where `sqrtm` no longer takes
`disp` the test hands pytorch-fid a `sqrtm` that accepts it and returns what SciPy < 1.18
returned for `disp=False`, `(root, error estimate)`, leaving pytorch-fid's own arithmetic
unchanged. pytorch-fid's ε·I retry (taken when `sqrtm` is not finite) must not fire: its
message would be printed, and the test checks that it was not.
"""

import inspect
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from _pytorch_fid import import_pytorch_fid

from dew.artifacts import Images
from dew.metrics import frechet_distance
from dew.metrics._fid import FID

import_pytorch_fid()  # skips without torch, torchvision or pytorch-fid
fid_score = pytest.importorskip("pytorch_fid.fid_score")

pytestmark = pytest.mark.parity

RTOL = 1e-5


def _sqrtm_with_disp(matrix, disp=True, blocksize=64):
    root = scipy.linalg.sqrtm(matrix, blocksize=blocksize)
    return root if disp else (root, 0.0)


@pytest.fixture
def pytorch_fid_distance(monkeypatch, capsys):
    """pytorch-fid's `calculate_frechet_distance`, callable with any installed SciPy."""
    if "disp" not in inspect.signature(scipy.linalg.sqrtm).parameters:
        monkeypatch.setattr(fid_score, "linalg", types.SimpleNamespace(sqrtm=_sqrtm_with_disp))

    def distance(*moments):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The `disp` argument", DeprecationWarning)
            # sqrtm's own note on a singular product, the case compared here on purpose
            warnings.filterwarnings("ignore", "Matrix is singular", scipy.linalg.LinAlgWarning)
            value = float(fid_score.calculate_frechet_distance(*moments))
        assert "adding" not in capsys.readouterr().out, "pytorch-fid took its eps retry"
        return value

    return distance


def _activations(rng, rows: int, dims: int, shift: float) -> np.ndarray:
    """ReLU'd correlated features, as pool3 activations are: non-negative, mixed."""
    mix = rng.normal(size=(dims, dims)) / np.sqrt(dims)
    return np.maximum(rng.normal(size=(rows, dims)) @ mix + shift, 0.0)


def _moments(activations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pytorch-fid's `calculate_activation_statistics`, on its float64 activations."""
    return np.mean(activations, axis=0), np.cov(activations, rowvar=False)


@pytest.mark.parametrize(
    ("rows1", "rows2", "dims", "route"),
    [
        (400, 300, 32, "cholesky"),  # both covariances full rank
        (6, 300, 32, "cholesky"),  # one singular: the other one's factor
        (40, 25, 128, "eigh"),  # both singular (rows <= dims), as small-population FID is
        (3, 3, 64, "eigh"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_distance_matches_pytorch_fid(pytorch_fid_distance, rows1, rows2, dims, route, seed):
    rng = np.random.default_rng(seed)
    mean1, cov1 = _moments(_activations(rng, rows1, dims, 0.0))
    mean2, cov2 = _moments(_activations(rng, rows2, dims, 0.2))
    result = frechet_distance(mean1, cov1, mean2, cov2)
    assert result.route == route
    expected = pytorch_fid_distance(mean1, cov1, mean2, cov2)
    assert result.distance == pytest.approx(expected, rel=RTOL)
    # a drop-in for float(calculate_frechet_distance(...)), as pytorch-fid's callers write it
    assert float(result) == pytest.approx(expected, rel=RTOL)


def test_identical_populations(pytorch_fid_distance):
    rng = np.random.default_rng(2)
    for rows in (500, 20):
        mean, cov = _moments(_activations(rng, rows, 32, 0.0))
        expected = pytorch_fid_distance(mean, cov, mean, cov)
        assert frechet_distance(mean, cov, mean, cov).distance == pytest.approx(
            expected, abs=RTOL * np.trace(cov)
        )


def _pixels(images: jax.Array) -> jax.Array:
    return images[:, ::4, ::4].reshape(images.shape[0], -1)


def test_the_metric_pools_the_moments_pytorch_fid_computes(pytorch_fid_distance):
    rng = np.random.default_rng(3)
    generated = rng.random((30, 16, 16, 3), dtype=np.float32)
    reference = np.clip(rng.random((50, 16, 16, 3)) + 0.1, 0, 1).astype(np.float32)
    metric = FID(network=_pixels)
    state = metric.init()
    for start in range(0, 50, 10):  # generated and reference batches of different sizes
        batch = Images(
            jnp.asarray(generated[start // 10 * 6 : start // 10 * 6 + 6]),
            reference=jnp.asarray(reference[start : start + 10]),
        )
        state = metric.merge(state, metric(batch))
    # pytorch-fid stores activations in a float64 array, then takes np.mean and np.cov
    activations = [np.asarray(_pixels(jnp.asarray(x)), np.float64) for x in (generated, reference)]
    expected = pytorch_fid_distance(*_moments(activations[0]), *_moments(activations[1]))
    assert metric.finalize(state) == pytest.approx(expected, rel=RTOL)
