"""Regression metrics (loss, rmse, point_crps) against float64 NumPy and SciPy references,
their laws, their empty and degenerate passes, and their errors."""

import jax.numpy as jnp
import numpy as np
import pytest

from dew import metrics
from dew.artifacts import RegressionScores, TokenScores
from dew.testing import check_metric_laws, regression_scores

REGRESSION_METRICS = {
    "loss": metrics.loss,
    "rmse": metrics.rmse,
    "point_crps": metrics.point_crps,
}
NO_ROW = "the pass has rows but no counted row"


def _random_batches(seed: int, weight_kind: str) -> list[RegressionScores]:
    """Batches of unequal row counts with two values per row."""
    rng = np.random.default_rng(seed)
    batches = []
    for rows in (5, 1, 3, 7):
        if weight_kind == "none":
            weights = np.ones(rows)
        else:
            weights = rng.random(rows)
            weights[rng.random(rows) < 0.3] = 0.0
            weights[0] = 1.0
        batches.append(
            RegressionScores(
                jnp.asarray(rng.uniform(0.0, 4.0, rows), jnp.float32),
                jnp.asarray(weights, jnp.float32),
                jnp.asarray(rng.normal(0.0, 2.0, (rows, 2)), jnp.float32),
                jnp.asarray(rng.uniform(0.1, 2.0, (rows, 2)), jnp.float32),
                jnp.asarray(rng.normal(0.0, 2.0, (rows, 2)), jnp.float32),
            )
        )
    return batches


def _field(batches, name):
    return np.concatenate([np.asarray(getattr(b, name), np.float64) for b in batches])


def _reference(batches, name: str) -> float:
    """The pooled weighted mean over rows, in float64 NumPy (SciPy for the CRPS)."""
    from scipy import stats  # here, not at collection

    weights = _field(batches, "weights")
    mean, std, targets = (_field(batches, field) for field in ("mean", "std", "targets"))
    if name == "loss":
        per_row = _field(batches, "losses")
    elif name == "rmse":
        per_row = np.mean(np.square(targets - mean), axis=1)
    else:  # CRPS = E|X - y| - E|X - X'| / 2, from SciPy's normal distribution
        z = (targets - mean) / std
        per_row = np.mean(
            std * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / np.sqrt(np.pi)),
            axis=1,
        )
    value = np.sum(per_row * weights) / np.sum(weights)
    return float(np.sqrt(value) if name == "rmse" else value)


def _fold(metric, batches):
    state = metric.init()
    for batch in batches:
        state = metric.merge(state, metric(batch))
    return metric.finalize(state)


@pytest.mark.parametrize("weight_kind", ["none", "fractional"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(REGRESSION_METRICS))
def test_matches_a_float64_reference(name, seed, weight_kind):
    batches = _random_batches(seed, weight_kind)
    got = float(_fold(REGRESSION_METRICS[name](), batches))
    np.testing.assert_allclose(got, _reference(batches, name), rtol=1e-5)


def test_the_crps_of_a_sharp_prediction_is_the_absolute_error():
    mean, targets = jnp.array([[0.0], [1.0]]), jnp.array([[2.0], [-1.0]])
    scores = RegressionScores(jnp.zeros(2), jnp.ones(2), mean, jnp.full((2, 1), 1e-4), targets)
    np.testing.assert_allclose(float(_fold(metrics.point_crps(), [scores])), 2.0, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(REGRESSION_METRICS))
def test_laws(name):
    check_metric_laws(REGRESSION_METRICS[name](), regression_scores(), max_examples=10)


def test_the_loss_reads_scores_without_predictions():
    check_metric_laws(metrics.loss(), regression_scores(with_predictions=False), max_examples=5)


@pytest.mark.parametrize("name", sorted(REGRESSION_METRICS))
def test_an_empty_pass_is_nan_and_a_pass_with_no_counted_row_raises(name):
    metric = REGRESSION_METRICS[name]()
    assert np.isnan(float(metric.finalize(metric.init())))
    [batch] = _random_batches(0, "none")[:1]
    unweighted = RegressionScores(
        batch.losses, jnp.zeros_like(batch.weights), batch.mean, batch.std, batch.targets
    )
    with pytest.raises(ValueError, match=f"metric '{name}': {NO_ROW}"):
        _fold(metric, [unweighted])
    with pytest.raises(ValueError, match=NO_ROW):  # and through a compiled pass
        metrics.MetricSet([metric]).reduce([unweighted])


def test_non_finite_values_are_data():
    scores = RegressionScores(jnp.array([1.0, jnp.nan]), jnp.ones(2))
    assert np.isnan(float(_fold(metrics.loss(), [scores])))
    scores = RegressionScores(jnp.array([1.0, jnp.inf]), jnp.ones(2))
    assert float(_fold(metrics.loss(), [scores])) == np.inf


def test_metrics_that_need_predictions_say_so():
    scores = RegressionScores(jnp.ones(2), jnp.ones(2))
    with pytest.raises(
        ValueError, match=r"metric 'rmse' needs RegressionScores\.mean and \.targets"
    ):
        metrics.rmse()(scores)
    sharp = RegressionScores(jnp.ones(2), jnp.ones(2), jnp.ones((2, 1)), None, jnp.ones((2, 1)))
    with pytest.raises(ValueError, match="carry no std; give the objective a predictive"):
        metrics.point_crps()(sharp)
    with pytest.raises(TypeError, match="metric 'loss' reads RegressionScores, got TokenScores"):
        metrics.loss()(TokenScores(jnp.ones((1, 2)), jnp.ones((1, 2))))
