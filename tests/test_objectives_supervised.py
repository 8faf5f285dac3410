"""SupervisedObjective: scalar and per-row losses, its scores, its predictive distribution,
its errors, and the Trainer training it as run_supervised does."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _checks import rejects

from dew import Trainer, metrics
from dew.artifacts import RegressionScores
from dew.data import Dataset
from dew.metrics import MetricSet
from dew.objectives.supervised import SupervisedObjective
from dew.supervised import Batch, create_optimizer, initialize_training_state, run_supervised
from dew.tracking import InMemoryTracker

INPUTS = jnp.linspace(-1.0, 1.0, 8).reshape(-1, 1)
TARGETS = 3.0 * INPUTS + 2.0
WEIGHTS = jnp.array([1.0, 0.0, 2.0, 1.0, 0.5, 0.0, 1.0, 3.0])
KEY = jax.random.key(0)


def _model():
    return eqx.nn.Linear(1, 1, key=jax.random.key(0))


def batch_loss(model, inputs, targets, sample_weight, key, training):
    return jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets))


def row_loss(model, inputs, targets, sample_weight, key, training):
    return jnp.square(jax.vmap(model)(inputs) - targets)[:, 0]


def _errors(model):
    return np.asarray(jnp.square(jax.vmap(model)(INPUTS) - TARGETS))[:, 0]


def test_a_scalar_loss_is_the_batch_loss_and_every_row_carries_it():
    model = _model()
    objective = SupervisedObjective(model, batch_loss)
    batch = {"inputs": INPUTS, "targets": TARGETS, "sample_weight": WEIGHTS}
    loss, aux = objective.loss(objective.init_params(), batch, KEY)
    np.testing.assert_allclose(float(loss), _errors(model).mean(), rtol=1e-6)
    assert aux == {}
    scores = objective.evaluate(objective.init_params(), batch, KEY)
    assert isinstance(scores, RegressionScores) and scores.mean is None
    np.testing.assert_allclose(scores.losses, np.full(8, _errors(model).mean()), rtol=1e-6)
    np.testing.assert_array_equal(scores.weights, np.ones(8))


def test_a_per_row_loss_is_weighted_by_the_sample_weights():
    model = _model()
    objective = SupervisedObjective(model, row_loss)
    batch = {"inputs": INPUTS, "targets": TARGETS, "sample_weight": WEIGHTS}
    loss, _ = objective.loss(objective.init_params(), batch, KEY)
    weights = np.asarray(WEIGHTS)
    want = np.sum(_errors(model) * weights) / np.sum(weights)
    np.testing.assert_allclose(float(loss), want, rtol=1e-6)
    scores = objective.evaluate(objective.init_params(), batch, KEY)
    np.testing.assert_allclose(scores.losses, _errors(model), rtol=1e-6)
    np.testing.assert_array_equal(scores.weights, weights)
    unweighted = {"inputs": INPUTS, "targets": TARGETS}
    loss, _ = objective.loss(objective.init_params(), unweighted, KEY)
    np.testing.assert_allclose(float(loss), _errors(model).mean(), rtol=1e-6)


def test_the_predictive_distribution_reaches_rmse_and_point_crps():
    model = _model()

    def predictive(model, inputs):
        return jax.vmap(model)(inputs), jnp.asarray(0.5, jnp.float32)

    objective = SupervisedObjective(model, row_loss, predictive=predictive)
    batch = {"inputs": INPUTS, "targets": TARGETS}
    scores = objective.evaluate(objective.init_params(), batch, KEY)
    np.testing.assert_array_equal(scores.std, np.full((8, 1), 0.5))
    np.testing.assert_array_equal(scores.targets, TARGETS)
    reduced = MetricSet([metrics.loss(), metrics.rmse(), metrics.point_crps()]).reduce([scores])
    np.testing.assert_allclose(reduced["rmse"], np.sqrt(_errors(model).mean()), rtol=1e-6)
    np.testing.assert_allclose(reduced["loss"], _errors(model).mean(), rtol=1e-6)
    assert 0 < reduced["point_crps"] < reduced["rmse"] + 0.5


def test_bad_losses_batches_and_arguments_are_refused():
    def wrong_shape(model, inputs, targets, sample_weight, key, training):
        return jnp.zeros((2, 3))

    objective = SupervisedObjective(_model(), wrong_shape)
    batch = {"inputs": INPUTS, "targets": TARGETS}
    message = r"must return a scalar or one value per row, shape \(8,\), got shape \(2, 3\)"
    with pytest.raises(ValueError, match=message):
        objective.loss(objective.init_params(), batch, KEY)
    with pytest.raises(KeyError, match=r"reads batch key 'targets', but the batch has 'inputs'\."):
        objective.check_batch({"inputs": INPUTS})
    with rejects(TypeError, "needs a callable loss, got 3", parameter="loss"):
        SupervisedObjective(_model(), 3)


def test_the_trainer_trains_it_as_run_supervised_does():
    model = _model()
    transformation = optax.sgd(0.1)
    objective = SupervisedObjective(model, batch_loss)
    halves = [
        {"inputs": INPUTS[:4], "targets": TARGETS[:4], "sample_weight": None},
        {"inputs": INPUTS[4:], "targets": TARGETS[4:], "sample_weight": None},
    ]
    data = Dataset(train=lambda partition: itertools.cycle(halves), val=lambda partition: halves)
    tracker = InMemoryTracker()
    trained = Trainer(objective, transformation, KEY).fit(
        data,
        6,
        log_every=2,
        eval_every=6,
        metrics=[metrics.loss()],
        tracker=tracker,
        progress=False,
    )
    optimizer = create_optimizer(model, transformation)

    def loader(*, split, epoch):
        return [Batch(half["inputs"], half["targets"]) for half in halves]

    supervised = run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=batch_loss,
        state=initialize_training_state(model, optimizer, KEY),
        epochs=3,
    )
    for got, want in zip(
        jax.tree.leaves(trained.params), jax.tree.leaves(supervised.params), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    [(step, validation)] = tracker.scalars["supervised/validation/loss"]
    final = eqx.combine(trained.params, model)
    np.testing.assert_allclose(validation, _errors(final).mean(), rtol=1e-5)
    assert step == 6
