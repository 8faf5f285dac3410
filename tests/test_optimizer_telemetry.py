"""`fit(..., log_optimizer=True)` and `train_step(..., log_optimizer=True)`: the learning rate
against the optax schedule, the gradient and update norms against NumPy norms of `jax.grad`
and `optimizer.update`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import Trainer
from dew.data import Dataset
from dew.objectives.base import Objective, combine, trainable
from dew.objectives.supervised import SupervisedObjective
from dew.steps import TrainState, train_step
from dew.tracking import InMemoryTracker

STEPS, LOG_EVERY, ROWS = 8, 4, 8
SCHEDULE = optax.linear_schedule(0.1, 0.01, STEPS)


def _mse(model, inputs, targets, sample_weight, key, training):
    return jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets))


def _batches():
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(STEPS):
        inputs = rng.normal(size=(ROWS, 3)).astype(np.float32)
        targets = (inputs.sum(axis=1, keepdims=True) + rng.normal(size=(ROWS, 1))).astype(
            np.float32
        )
        batches.append({"inputs": inputs, "targets": targets})
    return batches


def _data():
    batches = _batches()
    return Dataset(train=lambda partition: iter(batches), records=ROWS, batch=ROWS)


@pytest.fixture(scope="module")
def objective():
    return SupervisedObjective(eqx.nn.MLP(3, 1, 8, 1, key=jax.random.key(0)), _mse)


def _norm(tree):
    return float(
        np.sqrt(
            sum(np.sum(np.square(np.asarray(leaf, np.float64))) for leaf in jax.tree.leaves(tree))
        )
    )


@pytest.fixture(scope="module")
def hand(objective):
    """Each step's gradient norm and update norm, from jax.grad and optimizer.update."""
    optimizer = optax.adam(SCHEDULE)
    params = objective.init_params()
    opt_state = optimizer.init(params)
    grad_norms, update_norms = [], []
    for batch in _batches():
        grads = jax.grad(lambda p, b: objective.loss(p, b, jax.random.key(0))[0])(params, batch)
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        grad_norms.append(_norm(grads))
        update_norms.append(_norm(updates))
    return np.array(grad_norms), np.array(update_norms)


def _fit(objective, optimizer, **kwargs):
    tracker = InMemoryTracker()
    trainer = Trainer(objective, optimizer, key=jax.random.key(1), **kwargs.pop("trainer", {}))
    trainer.fit(
        _data(),
        STEPS,
        log_every=LOG_EVERY,
        tracker=tracker,
        progress=False,
        log_optimizer=True,
        **kwargs,
    )
    return tracker.scalars


def _values(series):
    return [value for _, value in series]


LOG_STEPS = list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
# the n-th update applies the schedule at optax's count n - 1
RATES = [float(SCHEDULE(step - 1)) for step in LOG_STEPS]


def test_the_learning_rate_the_norms_and_their_windows(objective, hand):
    scalars = _fit(objective, optax.adam(SCHEDULE), trainer={"learning_rate": SCHEDULE})
    rates = scalars["supervised/train/learning_rate"]
    assert [step for step, _ in rates] == LOG_STEPS
    np.testing.assert_allclose(_values(rates), RATES, rtol=1e-6)  # the window's last value
    grad_norms, update_norms = hand
    windows = [slice(end - LOG_EVERY, end) for end in LOG_STEPS]
    np.testing.assert_allclose(
        _values(scalars["supervised/train/grad_norm"]),
        [grad_norms[window].mean() for window in windows],
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        _values(scalars["supervised/train/update_norm"]),
        [update_norms[window].mean() for window in windows],
        rtol=1e-5,
    )


def test_last_reports_each_log_steps_own_norms(objective, hand):
    scalars = _fit(
        objective,
        optax.adam(SCHEDULE),
        trainer={"learning_rate": SCHEDULE},
        steps_per_call=2,
        train_reduction="last",
    )
    grad_norms, update_norms = hand
    logged = [step - 1 for step in LOG_STEPS]
    np.testing.assert_allclose(
        _values(scalars["supervised/train/grad_norm"]), grad_norms[logged], rtol=1e-5
    )
    np.testing.assert_allclose(
        _values(scalars["supervised/train/update_norm"]), update_norms[logged], rtol=1e-5
    )
    np.testing.assert_allclose(_values(scalars["supervised/train/learning_rate"]), RATES, rtol=1e-6)


def test_the_learning_rate_read_from_inject_hyperparams(objective):
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.sgd)(learning_rate=SCHEDULE)
    )
    scalars = _fit(objective, optimizer)
    np.testing.assert_allclose(_values(scalars["supervised/train/learning_rate"]), RATES, rtol=1e-6)


def test_a_constant_learning_rate(objective):
    scalars = _fit(objective, optax.sgd(0.05), trainer={"learning_rate": 0.05})
    np.testing.assert_allclose(_values(scalars["supervised/train/learning_rate"]), [0.05, 0.05])


def test_no_learning_rate_to_log_is_refused_before_any_step(objective):
    tracker = InMemoryTracker()
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(1))
    with pytest.raises(ValueError, match=r"inject_hyperparams.*learning_rate=") as raised:
        trainer.fit(_data(), STEPS, log_every=LOG_EVERY, tracker=tracker, log_optimizer=True)
    assert "log_optimizer=True" in str(raised.value)
    assert not tracker.scalars and not tracker.artifacts  # nothing started


class _AuxNamed(Objective):
    """A squared error whose aux is named like an optimizer metric."""

    model: eqx.nn.Linear
    name: str = eqx.field(static=True, default="aux")

    def init_params(self):
        return trainable(self.model)

    def loss(self, params, batch, key):
        model = combine(params, self.model)
        loss = jnp.mean(jnp.square(jax.vmap(model)(batch["inputs"]) - batch["targets"]))
        return loss, {"grad_norm": loss}

    def evaluate(self, params, batch, key):
        raise NotImplementedError

    def batch_keys(self, split):
        return {"inputs": None, "targets": None}

    def check_batch(self, batch):
        pass

    def generate_preview(self, params, batch, key):
        return None

    def default_metrics(self):
        return ()


def test_an_aux_named_like_an_optimizer_metric_is_refused():
    objective = _AuxNamed(eqx.nn.Linear(3, 1, key=jax.random.key(0)))
    trainer = Trainer(objective, optax.sgd(0.1), key=jax.random.key(1), learning_rate=0.1)
    with pytest.raises(ValueError, match="aux already names grad_norm"):
        trainer.fit(_data(), STEPS, log_every=LOG_EVERY, log_optimizer=True, progress=False)
    trainer.fit(_data(), STEPS, log_every=LOG_EVERY, progress=False)  # fine without telemetry


def test_train_step_logs_the_optimizer_in_a_custom_loop(objective, hand):
    optimizer = optax.adam(SCHEDULE)
    step = jax.jit(
        lambda state, batch: train_step(
            objective,
            optimizer,
            state,
            batch,
            jax.random.key(0),
            log_optimizer=True,
            learning_rate=SCHEDULE,
        )
    )
    state = TrainState.create(objective, optimizer, key=jax.random.key(1))
    batch = _batches()[0]
    state, outputs = step(state, batch)
    assert sorted(outputs) == ["grad_norm", "learning_rate", "loss", "update_norm"]
    np.testing.assert_allclose(float(outputs["grad_norm"]), hand[0][0], rtol=1e-5)
    np.testing.assert_allclose(float(outputs["learning_rate"]), float(SCHEDULE(0)), rtol=1e-6)
    with pytest.raises(ValueError, match="has none to read"):
        train_step(objective, optimizer, state, batch, jax.random.key(0), log_optimizer=True)
