"""MeanStage, GammaVarianceStage and run_stages: the CRPS and Gamma NLL against
independent references, and a two-stage heteroscedastic fit with separate curves."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.events import TrackerEventSink
from dew.metrics import gaussian_crps
from dew.supervised import (
    Batch,
    GammaVarianceStage,
    MeanStage,
    gamma_variance_nll,
    positive_variance,
    run_stages,
)
from dew.tracking import InMemoryTracker


def _crps_by_integration(mu, sigma, y):
    """CRPS = ∫ (F(x) - 1{x >= y})² dx, integrated numerically on each side of y."""
    from scipy import integrate, stats  # here, not at collection

    cdf = stats.norm(loc=mu, scale=sigma).cdf
    below, _ = integrate.quad(lambda x: cdf(x) ** 2, -np.inf, y, epsabs=1e-10)
    above, _ = integrate.quad(lambda x: (1.0 - cdf(x)) ** 2, y, np.inf, epsabs=1e-10)
    return below + above


@pytest.mark.parametrize(
    ("mu", "sigma", "y"),
    [(0.0, 1.0, 0.0), (1.5, 0.3, 2.0), (-2.0, 2.5, 3.0), (0.7, 0.05, 0.6), (4.0, 1.2, -1.0)],
)
def test_gaussian_crps_matches_numerical_integration(mu, sigma, y):
    got = gaussian_crps(jnp.array(mu), jnp.array(sigma), jnp.array(y))
    np.testing.assert_allclose(float(got), _crps_by_integration(mu, sigma, y), rtol=1e-5)


@pytest.mark.parametrize("squared", [0.01, 0.5, 3.0])
def test_gamma_nll_is_the_scipy_gamma_nll_up_to_a_constant(squared):
    from scipy import stats  # here, not at collection

    variances = np.array([0.05, 0.3, 1.0, 2.0, 7.5], dtype=np.float64)
    ours = np.asarray(
        gamma_variance_nll(
            jnp.asarray(variances, jnp.float32), jnp.full(variances.shape, squared, jnp.float32)
        ),
        dtype=np.float64,
    )
    reference = -stats.gamma(a=0.5, scale=2.0 * variances).logpdf(squared)
    differences = ours - reference
    np.testing.assert_allclose(differences, differences[0], atol=1e-5)
    # and the constant is the v-free part of -log p: log Γ(1/2) + log(2 r²) / 2
    constant = 0.5 * np.log(squared) + 0.5 * np.log(2.0) + np.log(np.sqrt(np.pi))
    np.testing.assert_allclose(differences[0], -constant, atol=1e-5)


def test_positive_variance_is_softplus_plus_a_floor():
    raw = jnp.array([-30.0, 0.0, 2.0])
    np.testing.assert_allclose(positive_variance(raw), jax.nn.softplus(raw) + 1e-6, rtol=1e-6)
    assert float(positive_variance(jnp.array(-100.0))) == float(np.float32(1e-6))


MEAN_EPOCHS, VARIANCE_EPOCHS = 30, 60


def _data(key, count):
    x_key, noise_key = jax.random.split(key)
    inputs = jax.random.uniform(x_key, (count, 1), minval=-2.0, maxval=2.0)
    scale = 0.2 + jnp.abs(inputs)
    targets = 2.0 * inputs + 1.0 + jax.random.normal(noise_key, (count, 1)) * scale
    return inputs, targets


def _stages(epochs=2, mean_epochs=None):
    mean_model = eqx.nn.Linear(1, 1, key=jax.random.key(1))
    variance_model = eqx.nn.MLP(1, 1, 32, 2, key=jax.random.key(2))
    mean = MeanStage(mean_model, optax.adam(1e-1), mean_epochs or epochs)
    variance = GammaVarianceStage(variance_model, optax.adam(2e-2), epochs, mean_model=mean)
    return mean, variance


@pytest.mark.slow
def test_two_stages_record_separate_curves_and_learn_the_variance():
    train_x, train_y = _data(jax.random.key(0), 1024)
    valid_x, valid_y = _data(jax.random.key(1), 512)

    def loader(*, split, epoch):
        if split == "train":
            return [Batch(train_x[:512], train_y[:512]), Batch(train_x[512:], train_y[512:])]
        return [Batch(valid_x, valid_y)]

    mean, variance = _stages(epochs=VARIANCE_EPOCHS, mean_epochs=MEAN_EPOCHS)
    tracker = InMemoryTracker()
    states = run_stages(
        [mean, variance], loader, loader, [TrackerEventSink(tracker)], jax.random.key(3)
    )
    assert set(states) == {"mean", "variance"}
    assert set(tracker.scalars) == {
        f"{stage}/{split}/{metric}"
        for stage in ("mean", "variance")
        for split, metrics in (("train", ["loss"]), ("validation", ["loss", "rmse", "point_crps"]))
        for metric in metrics
    }
    mean_steps = [step for step, _ in tracker.scalars["mean/train/loss"]]
    variance_steps = [step for step, _ in tracker.scalars["variance/train/loss"]]
    assert mean_steps == list(range(MEAN_EPOCHS))
    assert variance_steps == list(range(VARIANCE_EPOCHS))
    assert dict(states["variance"].metric_history).keys() == {
        tag for tag in tracker.scalars if tag.startswith("variance/")
    }

    rmse = [value for _, value in tracker.scalars["mean/validation/rmse"]]
    noise_rmse = float(jnp.sqrt(jnp.mean(jnp.square(valid_y - (2.0 * valid_x + 1.0)))))
    assert rmse[-1] < rmse[0]
    assert rmse[-1] < 1.05 * noise_rmse  # the mean is learned down to the noise
    # the frozen mean: the variance stage reports the mean stage's final rmse throughout
    variance_rmse = {round(value, 5) for _, value in tracker.scalars["variance/validation/rmse"]}
    assert variance_rmse == {round(rmse[-1], 5)}
    variance_losses = [value for _, value in tracker.scalars["variance/train/loss"]]
    assert variance_losses[-1] < variance_losses[0]

    learned = np.asarray(variance.variance(states["variance"], valid_x))[:, 0]
    true = np.asarray(jnp.square(0.2 + jnp.abs(valid_x)))[:, 0]
    assert np.corrcoef(learned, true)[0, 1] > 0.5
    # a heteroscedastic predictive distribution scores a better CRPS than a constant spread
    mean_crps = tracker.scalars["mean/validation/point_crps"][-1][1]
    variance_crps = tracker.scalars["variance/validation/point_crps"][-1][1]
    assert variance_crps < mean_crps


def test_mean_stage_point_crps_uses_the_training_residual_std():
    inputs = jnp.linspace(-1.0, 1.0, 8).reshape(-1, 1)
    targets = 3.0 * inputs

    def loader(*, split, epoch):
        return [Batch(inputs, targets)]

    model = eqx.nn.Linear(1, 1, key=jax.random.key(0))
    stage = MeanStage(model, optax.sgd(0.0), 1)  # a zero learning rate leaves the model as is
    tracker = InMemoryTracker()
    stage.run(loader, loader, [TrackerEventSink(tracker)], jax.random.key(0))
    mean = jax.vmap(model)(inputs)
    sigma = jnp.sqrt(jnp.mean(jnp.square(targets - mean)))
    want = jnp.mean(gaussian_crps(mean, jnp.broadcast_to(sigma, mean.shape), targets))
    ((_, got),) = tracker.scalars["mean/validation/point_crps"]
    np.testing.assert_allclose(got, float(want), rtol=1e-5)
    ((_, rmse),) = tracker.scalars["mean/validation/rmse"]
    np.testing.assert_allclose(rmse, float(sigma), rtol=1e-5)


def test_bad_input_raises():
    model = eqx.nn.Linear(1, 1, key=jax.random.key(0))
    with pytest.raises(ValueError, match="epochs must be an integer >= 1, got 0"):
        MeanStage(model, optax.sgd(0.1), 0)
    with pytest.raises(ValueError, match="epochs must be an integer >= 1, got True"):
        GammaVarianceStage(model, optax.sgd(0.1), True, mean_model=model)
    with pytest.raises(ValueError, match="stage may not be empty"):
        MeanStage(model, optax.sgd(0.1), 1, stage="")
    with pytest.raises(ValueError, match="duplicate stage names \\['mean'\\]"):
        run_stages(
            [MeanStage(model, optax.sgd(0.1), 1), MeanStage(model, optax.sgd(0.1), 1)],
            lambda *, split, epoch: [],
            None,
            [],
            jax.random.key(0),
        )
    mean, variance = _stages()
    with pytest.raises(ValueError, match="needs the MeanStage 'mean' to run before it"):
        run_stages([variance, mean], lambda *, split, epoch: [], None, [], jax.random.key(0))
    with pytest.raises(ValueError, match="run both through run_stages"):
        variance.run(lambda *, split, epoch: [], None, [], jax.random.key(0))
