"""FID: streaming float64 moments (Chan's merge) against np.mean/np.cov, the Fréchet distance
against SciPy's sqrtm formula and closed forms (singular covariances included), the metric's
laws, populations of different sizes, state size, errors, and precomputed statistics.

The metric runs here on cheap stand-in feature networks; pytorch-fid's InceptionV3 is
`dew.nn.inception`'s (tests/test_inception.py), and the distance's parity with pytorch-fid
is tests/parity/test_fid_parity.py."""

import hashlib
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from _weights import random_inception_weights
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dew import io, metrics
from dew.artifacts import Images, Representations
from dew.metrics import (
    FIDStatistics,
    Moments,
    frechet_distance,
    load_fid_statistics,
    save_fid_statistics,
)
from dew.metrics._fid import FID, _statistics
from dew.nn import inception
from dew.testing import check_metric_laws, images


def channel_means(images: jax.Array) -> jax.Array:
    """A stand-in feature network: each image's mean per channel (3 features)."""
    return jnp.mean(images, axis=(1, 2))


def pixels(images: jax.Array) -> jax.Array:
    """A stand-in with more features than the tests have rows, exact whatever the batch:
    every other pixel of every other row."""
    return images[:, ::2, ::2].reshape(images.shape[0], -1)


def _images(seed: int, rows: int, side: int = 11, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.random((rows, side, side, 3)) + shift, 0.0, 1.0).astype(np.float32)


def _features(network, images: np.ndarray) -> np.ndarray:
    return np.asarray(network(jnp.asarray(images)), np.float64)


def _spd(rng: np.random.Generator, dims: int, rank: int | None = None) -> np.ndarray:
    factor = rng.normal(size=(dims, rank or dims + 3))
    return factor @ factor.T / factor.shape[1]


def _sqrtm_formula(mean1, cov1, mean2, cov2) -> float:
    """The textbook formula with SciPy's general matrix square root (tests only)."""
    root = scipy.linalg.sqrtm(cov1 @ cov2)
    return float(np.sum((mean1 - mean2) ** 2) + np.trace(cov1 + cov2 - 2 * np.real(root)))


def _nuclear_formula(x1: np.ndarray, x2: np.ndarray) -> float:
    """The distance from the features themselves: tr √(C₁C₂) = ‖A Bᵀ‖_* with C₁ = AᵀA,
    C₂ = BᵀB, exact whatever the ranks."""
    a = (x1 - x1.mean(0)) / np.sqrt(len(x1) - 1)
    b = (x2 - x2.mean(0)) / np.sqrt(len(x2) - 1)
    difference = x1.mean(0) - x2.mean(0)
    nuclear = np.linalg.svd(a @ b.T, compute_uv=False).sum()
    return float(difference @ difference + (a * a).sum() + (b * b).sum() - 2 * nuclear)


# --- Moments: Chan's merge ---------------------------------------------------------------

feature_rows = st.integers(2, 40).flatmap(
    lambda rows: st.tuples(
        hnp.arrays(
            np.float64,
            (rows, 3),
            elements=st.floats(-10, 10, allow_nan=False, allow_infinity=False),
        ),
        st.lists(st.integers(0, rows), max_size=6),
        st.sampled_from([0.0, 1e3]),
    )
)


@settings(max_examples=60)
@given(feature_rows)
def test_moments_of_any_split_equal_those_of_the_whole(case):
    features, cuts, offset = case
    features = features + offset  # an offset stresses cancellation in the centred M2
    bounds = [0, *sorted(cuts), len(features)]
    merged = Moments.empty()
    for start, stop in itertools.pairwise(bounds):
        merged = merged.merge(Moments.of(features[start:stop]))
    scale = 1.0 + np.abs(features).max()
    assert merged.count == len(features)
    np.testing.assert_allclose(merged.mean, np.mean(features, axis=0), rtol=0, atol=1e-10 * scale)
    np.testing.assert_allclose(
        merged.covariance(), np.cov(features, rowvar=False), rtol=0, atol=1e-10 * scale
    )


@settings(max_examples=40)
@given(feature_rows)
def test_moments_merge_is_associative_with_an_identity(case):
    features, cuts, _ = case
    first, second = sorted([*cuts, 0, 0][:2])
    a, b, c = (Moments.of(part) for part in np.split(features, [first, second]))
    left, right = a.merge(b).merge(c), a.merge(b.merge(c))
    assert left.count == right.count
    np.testing.assert_allclose(left.mean, right.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(left.m2, right.m2, rtol=1e-10, atol=1e-10)
    whole = Moments.of(features)
    assert Moments.empty().merge(whole) is whole
    assert whole.merge(Moments.empty()) is whole


def test_merge_leaves_its_operands_untouched():
    rng = np.random.default_rng(0)
    a, b = Moments.of(rng.normal(size=(5, 4))), Moments.of(rng.normal(size=(3, 4)))
    copies = [array.copy() for array in (a.mean, a.m2, b.mean, b.m2)]
    a.merge(b)
    for array, copy in zip((a.mean, a.m2, b.mean, b.m2), copies, strict=True):
        np.testing.assert_array_equal(array, copy)


# --- the Fréchet distance ----------------------------------------------------------------


@pytest.mark.parametrize("dims", [1, 2, 5, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distance_matches_the_sqrtm_formula_on_well_conditioned_covariances(dims, seed):
    rng = np.random.default_rng(seed)
    mean1, mean2 = rng.normal(size=dims), rng.normal(size=dims)
    cov1, cov2 = _spd(rng, dims), _spd(rng, dims)
    result = frechet_distance(mean1, cov1, mean2, cov2)
    assert result.route == "cholesky"
    assert result.negative_mass < 1e-13
    expected = _sqrtm_formula(mean1, cov1, mean2, cov2)
    assert result.distance == pytest.approx(expected, rel=1e-10)
    assert float(result) == pytest.approx(expected, rel=1e-10)  # as pytorch-fid's callers write
    # tr √(C₁C₂) is symmetric in the two Gaussians
    swapped = frechet_distance(mean2, cov2, mean1, cov1).distance
    assert swapped == pytest.approx(result.distance, rel=1e-12)


def test_identical_gaussians_are_at_distance_zero():
    rng = np.random.default_rng(3)
    mean, cov = rng.normal(size=32), _spd(rng, 32)
    assert abs(frechet_distance(mean, cov, mean, cov).distance) < 1e-10 * np.trace(cov)
    singular = _spd(rng, 32, rank=5)
    result = frechet_distance(mean, singular, mean, singular)
    assert result.route == "eigh"
    assert abs(result.distance) < 1e-6 * np.trace(singular)


@pytest.mark.parametrize("zeros", [0, 2])
def test_diagonal_covariances_have_the_closed_form(zeros):
    rng = np.random.default_rng(4)
    a, b = rng.uniform(0.1, 3.0, 6), rng.uniform(0.1, 3.0, 6)
    a[:zeros] = 0.0  # singular: both routes
    b[:zeros] = 0.0
    mean1, mean2 = rng.normal(size=6), rng.normal(size=6)
    expected = np.sum((np.sqrt(a) - np.sqrt(b)) ** 2) + np.sum((mean1 - mean2) ** 2)
    result = frechet_distance(mean1, np.diag(a), mean2, np.diag(b))
    assert result.route == ("cholesky" if zeros == 0 else "eigh")
    assert result.distance == pytest.approx(expected, rel=1e-12)


def test_zero_covariances_leave_the_means_and_the_other_trace():
    zero = np.zeros((2, 2))
    assert frechet_distance(np.zeros(2), zero, np.ones(2), zero).distance == 2.0
    result = frechet_distance(np.zeros(2), zero, np.ones(2), np.diag([1.0, 3.0]))
    assert result.distance == pytest.approx(2.0 + 4.0) and result.negative_mass == 0.0


def test_one_singular_covariance_takes_the_other_ones_cholesky_factor():
    rng = np.random.default_rng(5)
    x1, x2 = rng.normal(size=(4, 8)), rng.normal(size=(40, 8)) + 0.3
    result = frechet_distance(
        x1.mean(0), np.cov(x1, rowvar=False), x2.mean(0), np.cov(x2, rowvar=False)
    )
    assert result.route == "cholesky"
    # the product's zero eigenvalues come out as rounding noise ε, and √ε ≈ 1e-8
    assert result.distance == pytest.approx(_nuclear_formula(x1, x2), rel=1e-7)


@pytest.mark.parametrize(("rows1", "rows2"), [(3, 5), (10, 10), (64, 20), (40, 4), (100, 127)])
def test_singular_covariances_from_fewer_rows_than_dims(rows1, rows2):
    rng = np.random.default_rng(rows1)
    mix = rng.normal(size=(128, 128)) / np.sqrt(128)
    x1 = np.maximum(rng.normal(size=(rows1, 128)) @ mix, 0.0)
    x2 = np.maximum(rng.normal(size=(rows2, 128)) @ mix + 0.1, 0.0)
    result = frechet_distance(
        x1.mean(0), np.cov(x1, rowvar=False), x2.mean(0), np.cov(x2, rowvar=False)
    )
    assert result.route == "eigh"
    assert result.negative_mass < 1e-10
    # the factor drops C₁'s eigenvalues below D·ε·λmax (about D - n + 1 of them, noise of
    # either sign); where C₂ has the lower rank the product's zero eigenvalues are noise too,
    # whose √ε ≈ 1e-8 enters the trace
    assert result.distance == pytest.approx(_nuclear_formula(x1, x2), rel=1e-7)


@pytest.mark.parametrize(
    ("rows1", "rows2", "dims"), [(60, 60, 128), (40, 300, 128), (300, 300, 128)]
)
def test_covariances_spanning_many_scales_keep_their_small_product_eigenvalues(rows1, rows2, dims):
    # directions spanning six orders of magnitude and large means, as pool3 features with
    # random weights have: C₁C₂'s eigenvalues run from ~1e12 down to ~1e-12 and the small ones
    # are real (a floor at D·ε·λmax(C₁C₂) dropped them and moved such a distance by 1%)
    rng = np.random.default_rng(rows1 + rows2)
    basis = np.linalg.qr(rng.normal(size=(dims, dims)))[0]
    scales = np.logspace(3, -3, dims)
    x1 = (rng.normal(size=(rows1, dims)) * scales) @ basis + 100.0
    x2 = (rng.normal(size=(rows2, dims)) * scales * 1.1) @ basis + 100.5
    result = frechet_distance(
        x1.mean(0), np.cov(x1, rowvar=False), x2.mean(0), np.cov(x2, rowvar=False)
    )
    assert result.distance == pytest.approx(_nuclear_formula(x1, x2), rel=1e-6)


def test_negative_eigenvalue_mass_is_reported_and_warned_about():
    mean = np.zeros(2)
    not_a_covariance = np.array([[1.0, 0.0], [0.0, -0.5]])
    with pytest.warns(RuntimeWarning, match=r"negative eigenvalues holding 0\.333"):
        result = frechet_distance(mean, not_a_covariance, mean, np.eye(2))
    assert result.route == "cholesky"  # the identity's factor
    assert result.negative_mass == pytest.approx(1 / 3)
    # the clipped eigenvalue counts as zero: √(1·1) + √(0·1)
    assert result.distance == pytest.approx(0.5 + 2.0 - 2.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_moments_give_a_nan_distance(bad):
    mean, cov = np.zeros(3), np.eye(3)
    result = frechet_distance(np.array([0.0, bad, 0.0]), cov, mean, cov)
    assert np.isnan(result.distance) and result.route == "non-finite"
    broken = cov.copy()
    broken[0, 1] = broken[1, 0] = bad
    assert np.isnan(frechet_distance(mean, cov, mean, broken).distance)


def test_distance_rejects_shapes_that_disagree():
    with pytest.raises(ValueError, match=r"mean1 \(3,\) and cov1 \(2, 2\)"):
        frechet_distance(np.zeros(3), np.eye(2), np.zeros(3), np.eye(3))
    with pytest.raises(ValueError, match=r"mean2 must have shape \(dims,\)"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros((3, 1)), np.eye(3))
    with pytest.raises(ValueError, match="one dimension, got 3 and 2 dims"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(2), np.eye(2))


# --- the metric ----------------------------------------------------------------------------


def test_fid_obeys_the_metric_laws():
    check_metric_laws(
        FID(network=channel_means),
        images(rows=st.integers(4, 6), size=11, channels=3),
        max_examples=15,
    )


@settings(max_examples=15)
@given(
    generated_rows=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    reference_rows=st.lists(st.integers(0, 7), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_populations_of_different_sizes_pool_like_np_cov(generated_rows, reference_rows, seed):
    total_generated, total_reference = sum(generated_rows), sum(reference_rows)
    assume(total_generated >= 2 and total_reference >= 2)
    generated = _images(seed, total_generated)
    reference = _images(seed + 1, total_reference, shift=0.1)
    metric = FID(network=pixels)
    batches = max(len(generated_rows), len(reference_rows))
    g_bounds = np.cumsum([0, *generated_rows, *[0] * (batches - len(generated_rows))])
    r_bounds = np.cumsum([0, *reference_rows, *[0] * (batches - len(reference_rows))])
    state = metric.init()
    for i in range(batches):
        batch = Images(
            jnp.asarray(generated[g_bounds[i] : g_bounds[i + 1]]),
            reference=jnp.asarray(reference[r_bounds[i] : r_bounds[i + 1]]),
        )
        state = metric.merge(state, metric(batch))
    x1, x2 = _features(pixels, generated), _features(pixels, reference)
    assert state.generated.count == total_generated
    assert state.reference.count == total_reference
    np.testing.assert_allclose(state.generated.covariance(), np.cov(x1, rowvar=False), atol=1e-12)
    np.testing.assert_allclose(state.reference.covariance(), np.cov(x2, rowvar=False), atol=1e-12)
    value = metric.finalize(state)
    assert isinstance(value, float)
    assert value == pytest.approx(_nuclear_formula(x1, x2), rel=1e-6)


def test_fid_in_a_metric_set_with_device_metrics():
    generated, reference = _images(0, 6), _images(1, 6, shift=0.2)
    batches = [
        Images(jnp.asarray(generated[:3]), reference=jnp.asarray(reference[:3])),
        Images(jnp.asarray(generated[3:]), reference=jnp.asarray(reference[3:])),
    ]
    scores = metrics.reduce([metrics.psnr(), FID(network=pixels)], batches)
    assert list(scores) == ["psnr", "fid"]
    expected = _nuclear_formula(_features(pixels, generated), _features(pixels, reference))
    assert scores["fid"] == pytest.approx(expected, rel=1e-6)
    assert np.isnan(metrics.reduce([FID(network=pixels)], [])["fid"])


@pytest.mark.slow
def test_fid_scores_a_diffusion_objective_through_evaluate():
    from dew import evaluate
    from dew.nn.backbones.dit import DiT
    from dew.objectives.diffusion import DiffusionObjective, Sampling

    model = DiT(16, 4, 3, width=32, depth=1, heads=2, key=jax.random.key(0))
    objective = DiffusionObjective(model, sampling=Sampling(steps=2))
    batches = [{"images": _images(seed, 4, side=16)} for seed in range(3)]
    fid = FID(network=channel_means)
    result = evaluate(
        objective, objective.init_params(), batches, metrics=[fid], key=jax.random.key(1)
    )
    assert list(result.scores) == ["fid"] and np.isfinite(result.scores["fid"])
    assert result.scores["fid"] > 0.0


def test_state_stays_the_same_size_after_1_and_100_batches():
    metric = FID(network=pixels)
    generated, reference = _images(0, 200), _images(1, 200)
    sizes = {}
    for batches in (1, 100):
        state = metric.init()
        for i in range(batches):
            rows = slice(2 * i, 2 * i + 2)
            batch = Images(jnp.asarray(generated[rows]), reference=jnp.asarray(reference[rows]))
            state = metric.merge(state, metric(batch))
        leaves = jax.tree.leaves(state)
        assert all(np.isscalar(leaf) or isinstance(leaf, np.ndarray) for leaf in leaves)
        sizes[batches] = sum(np.asarray(leaf).nbytes for leaf in leaves)
    dims = 6 * 6 * 3
    assert sizes[1] == sizes[100] == 2 * (8 + 8 * dims + 8 * dims * dims)


def test_an_empty_pass_is_nan_and_fewer_than_two_rows_raise():
    metric = FID(network=channel_means)
    assert np.isnan(metric.finalize(metric.init()))
    one = Images(jnp.asarray(_images(0, 1)), reference=jnp.asarray(_images(1, 5)))
    with pytest.raises(ValueError, match="at least two rows in each population, got 1 generated"):
        metric.finalize(metric(one))
    few = Images(jnp.asarray(_images(0, 5)), reference=jnp.asarray(_images(1, 1)))
    with pytest.raises(ValueError, match="got 5 generated and 1 reference rows"):
        metrics.reduce([metric], [few])
    none = Images(jnp.asarray(_images(0, 5)), reference=jnp.zeros((0, 11, 11, 3)))
    with pytest.raises(ValueError, match="got 5 generated and 0 reference rows"):
        metric.finalize(metric(none))


def test_non_finite_features_give_a_nan_distance():
    generated = _images(0, 5)
    generated[2, 0, 0, 1] = np.nan
    batch = Images(jnp.asarray(generated), reference=jnp.asarray(_images(1, 5)))
    value = metrics.reduce([FID(network=channel_means)], [batch])["fid"]
    assert np.isnan(value)


def test_bad_input_errors():
    metric = FID(network=channel_means)
    with pytest.raises(TypeError, match="metric 'fid' reads Images, got Representations"):
        metric(Representations(jnp.zeros((4, 3))))
    with pytest.raises(ValueError, match="the batch has no reference images"):
        metric(Images(jnp.asarray(_images(0, 4))))
    with pytest.raises(ValueError, match=r"shape \(rows, dims\), got shape \(4, 3, 1\)"):
        FID(network=lambda x: channel_means(x)[..., None])(
            Images(jnp.asarray(_images(0, 4)), reference=jnp.asarray(_images(1, 4)))
        )
    with pytest.raises(ValueError, match="moments of 3 and 75 features cannot be merged"):
        Moments.of(np.ones((2, 3))).merge(Moments.of(np.ones((2, 75))))
    with pytest.raises(ValueError, match="metric name 'FID' must be bare snake_case"):
        FID(network=channel_means, name="FID")


# --- precomputed reference statistics ------------------------------------------------------


def test_statistics_round_trip_and_score_like_the_pooled_reference(tmp_path):
    generated, reference = _images(0, 8), _images(1, 30, shift=0.1)
    pooling = FID(network=channel_means)  # full-rank covariances: no √ of rounding noise
    real = pooling.moments(reference[:10]).merge(pooling.moments(reference[10:]))
    path = save_fid_statistics(tmp_path / "real.npz", real)
    assert path == tmp_path / "real.npz" and [p.name for p in tmp_path.iterdir()] == ["real.npz"]
    features = np.concatenate(
        [_features(channel_means, reference[:10]), _features(channel_means, reference[10:])]
    )
    with np.load(path) as archive:  # pytorch-fid's keys, read as pytorch-fid reads them
        np.testing.assert_allclose(archive["mu"], np.mean(features, axis=0), rtol=1e-14)
        np.testing.assert_allclose(archive["sigma"], np.cov(features, rowvar=False), rtol=1e-12)
        assert archive["count"] == 30
    loaded = load_fid_statistics(path)
    assert isinstance(loaded, FIDStatistics) and loaded.count == 30 and loaded.rows == "30"
    np.testing.assert_array_equal(loaded.mean, real.mean)
    np.testing.assert_allclose(loaded.covariance, np.cov(features, rowvar=False), rtol=1e-12)

    scored = FID(network=channel_means, reference=loaded)
    state = scored(Images(jnp.asarray(generated)))
    pooled = pooling.merge(
        pooling(Images(jnp.asarray(generated), reference=jnp.asarray(reference[:10]))),
        pooling(Images(jnp.asarray(generated[:0]), reference=jnp.asarray(reference[10:]))),
    )
    assert scored.finalize(state) == pytest.approx(pooling.finalize(pooled), rel=1e-12)
    # the batch's own reference rows are ignored when statistics are given
    batch = Images(jnp.asarray(generated), reference=jnp.asarray(reference[:3]))
    assert scored.finalize(scored(batch)) == scored.finalize(state)


def test_saving_refuses_fewer_than_two_rows_and_keeps_an_existing_file(tmp_path):
    path = tmp_path / "real.npz"
    path.write_bytes(b"kept")
    with pytest.raises(ValueError, match="at least two rows, got 1"):
        save_fid_statistics(path, Moments.of(np.ones((1, 3))))
    assert path.read_bytes() == b"kept"
    assert [p.name for p in tmp_path.iterdir()] == ["real.npz"]


def test_loading_rejects_what_is_not_dew_statistics(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_fid_statistics(tmp_path / "missing.npz")
    weights = tmp_path / "pt_inception.pth"
    weights.write_bytes(b"\x80\x02}q\x00.")  # a pickle, as a .pth holds
    with pytest.raises(ValueError, match=re.escape(f"{weights} is not an .npz of FID statistics")):
        load_fid_statistics(weights)
    stamped = tmp_path / "stamped.npz"  # dew's format stamp, but no count
    np.savez(stamped, mu=np.zeros(3), sigma=np.eye(3), format="dew.fid_statistics.v1")
    with pytest.raises(ValueError, match=r"has keys \['mu', 'sigma'\] and format"):
        load_fid_statistics(stamped)
    no_sigma = tmp_path / "no_sigma.npz"
    np.savez_compressed(no_sigma, mu=np.zeros(3))
    with pytest.raises(ValueError, match=r"has keys \['mu'\] and format .* or pytorch-fid's"):
        load_fid_statistics(no_sigma)
    single = tmp_path / "single.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(ValueError, match=r"holds a single array, not an \.npz"):
        load_fid_statistics(single)
    other = tmp_path / "other.npz"
    np.savez(other, mu=np.zeros(3), sigma=np.eye(3), count=np.float64(5), format="other.v9")
    with pytest.raises(ValueError, match=r"format 'other\.v9', expected"):
        load_fid_statistics(other)
    malformed = tmp_path / "malformed.npz"
    np.savez(malformed, mu=np.zeros(3), sigma=np.eye(2), count=np.float64(5))
    with pytest.raises(ValueError, match=r"malformed FID statistics: mu \(3,\), sigma \(2, 2\)"):
        load_fid_statistics(malformed)


def test_pytorch_fids_own_statistics_score_with_their_count_unknown(tmp_path):
    generated, reference = _images(0, 8), _images(1, 30, shift=0.1)
    features = _features(channel_means, reference)
    path = tmp_path / "pytorch_fid.npz"
    # as pytorch-fid's save_fid_stats writes them: np.mean and np.cov of its float64
    # activations, compressed, with no row count
    np.savez_compressed(path, mu=np.mean(features, axis=0), sigma=np.cov(features, rowvar=False))
    loaded = load_fid_statistics(path)
    assert loaded.count is None and loaded.rows == "unknown"
    np.testing.assert_allclose(loaded.covariance, np.cov(features, rowvar=False), rtol=1e-15)
    against_file = FID(network=channel_means, reference=loaded)
    pooled = FID(network=channel_means)
    batch = Images(jnp.asarray(generated), reference=jnp.asarray(reference))
    value = against_file.finalize(against_file(batch))
    assert value == pytest.approx(pooled.finalize(pooled(batch)), rel=1e-12)
    x1 = _features(channel_means, generated)
    expected = _sqrtm_formula(
        np.mean(x1, axis=0), np.cov(x1, rowvar=False), loaded.mean, loaded.covariance
    )
    assert value == pytest.approx(expected, rel=1e-9)
    one_row = Images(jnp.asarray(generated[:1]))
    with pytest.raises(ValueError, match="got 1 generated and unknown reference rows"):
        against_file.finalize(against_file(one_row))


def test_the_feature_definition_names_the_network_and_the_reference(tmp_path):
    pooled = FID(network=channel_means)
    assert isinstance(pooled, metrics.DescribesFeatures)
    assert pooled.feature_definition() == {
        "network": "channel_means",  # no definition given: the callable's name alone
        "preprocessing": None,
        "weights_sha256": None,
        "reference": "pooled",
    }
    definition = metrics.FeatureDefinition("means", "none", "ab" * 32)
    path = tmp_path / "pytorch_fid.npz"
    np.savez_compressed(path, mu=np.zeros(3), sigma=np.eye(3))
    against_file = FID(
        network=channel_means, definition=definition, reference=load_fid_statistics(path)
    )
    assert against_file.feature_definition() == {
        "network": "means",
        "preprocessing": "none",
        "weights_sha256": "ab" * 32,
        "reference": "statistics",
        "reference_rows": None,  # pytorch-fid's file: the count is unknown
    }


def test_reference_moments_are_converted_and_need_two_rows():
    moments = Moments.of(np.arange(12.0).reshape(4, 3) ** 2)
    metric = FID(network=channel_means, reference=moments)
    assert isinstance(metric.reference, FIDStatistics) and metric.reference.count == 4
    np.testing.assert_array_equal(metric.reference.mean, moments.mean)
    np.testing.assert_allclose(
        metric.reference.covariance, np.cov(np.arange(12.0).reshape(4, 3) ** 2, rowvar=False)
    )
    with pytest.raises(ValueError, match="reference statistics need at least two rows, got 1"):
        FID(network=channel_means, reference=Moments.of(np.ones((1, 3))))
    with pytest.raises(TypeError, match=r"FID's reference must be FIDStatistics.*got ndarray"):
        _statistics(np.zeros(3))  # the converter (the tests' type checks refuse it first)


def test_reference_statistics_of_other_dims_are_refused_at_finalize(tmp_path):
    path = save_fid_statistics(tmp_path / "real.npz", Moments.of(np.eye(4)))
    metric = FID(network=channel_means, reference=load_fid_statistics(path))
    state = metric(Images(jnp.asarray(_images(0, 5))))
    with pytest.raises(ValueError, match="generated features have 3 dims but the reference"):
        metric.finalize(state)


# --- fid(): pytorch-fid's InceptionV3 ------------------------------------------------------


def test_fid_without_weights_says_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.delenv("DEW_FID_WEIGHTS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError) as caught:
        metrics.fid()
    message = str(caught.value)
    cached = tmp_path / ".cache" / "dew" / "pt_inception-2015-12-05-6726825d.pth"
    assert str(cached) in message and "github.com/mseitzer/pytorch-fid/releases" in message
    with pytest.raises(FileNotFoundError, match=r"absent\.pth"):
        metrics.fid(weights=tmp_path / "absent.pth")


@pytest.mark.slow
def test_fid_on_inception_features_with_reference_statistics(tmp_path, monkeypatch):
    weights = tmp_path / "random_inception.safetensors"
    random_inception_weights(weights)
    hashed = []
    monkeypatch.setattr(
        inception, "sha256_of", lambda path: hashed.append(path) or io.sha256_of(path)
    )
    metric = metrics.fid(weights=weights)
    assert isinstance(metric, FID) and metric.name == "fid"
    # the feature definition a SamplingProtocol records, the weights' digest computed once
    assert [metric.feature_definition() for _ in range(3)] == 3 * [
        {
            "network": "pytorch-fid 0.3.0 FID InceptionV3, pool3 (2048 features)",
            "preprocessing": "bilinear resize to 299x299 without antialiasing "
            "(align_corners=False), [0, 1] scaled to [-1, 1], computed in float32",
            "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
            "reference": "pooled",
        }
    ]
    assert hashed == [weights]
    assert isinstance(metric, metrics.DescribesFeatures)
    # one shape for every call: each new shape compiles the whole network again
    generated, reference = _images(0, 4, side=16), _images(1, 4, side=16, shift=0.2)
    batch = Images(jnp.asarray(generated), reference=jnp.asarray(reference))
    state = metric(batch)
    assert state.generated.dims == state.reference.dims == 2048
    value = metric.finalize(state)
    network = metric.network.__self__  # FIDInceptionV3.features, bound to the loaded model
    x1, x2 = (_features(network.features, images) for images in (generated, reference))
    assert np.all(np.isfinite(x1)) and x1.std() > 0.01  # features, not zeros
    assert value == pytest.approx(_nuclear_formula(x1, x2), rel=1e-6)
    path = save_fid_statistics(tmp_path / "real.npz", state.reference)
    against_file = metrics.fid(weights=weights, reference=path, name="fid_against_file")
    described = against_file.feature_definition()
    assert (described["reference"], described["reference_rows"]) == ("statistics", 4)
    scored = against_file.finalize(against_file(Images(jnp.asarray(generated))))
    assert scored == pytest.approx(value, rel=1e-6)
