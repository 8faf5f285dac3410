"""Training-window metrics: what a log step reports is the mean over the steps since the last
log step, checked against a hand-written `jax.jit(train_step)` loop and NumPy."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew import Trainer
from dew._nonfinite import NonFiniteTrainingError
from dew.data import Dataset
from dew.events import BEST_MODEL
from dew.naming import Split
from dew.objectives.supervised import SupervisedObjective
from dew.steps import TrainState, train_step
from dew.supervised import EarlyStopper
from dew.tracking import InMemoryTracker
from dew.training._window import TrainWindow, window_values

STEPS, LOG_EVERY, ROWS = 12, 4, 8


def _poisoned_mse(model, inputs, targets, sample_weight, key, training):
    """The squared error on `targets[:, :1]`, plus `targets[:, 1:]`'s mean with no gradient:
    a NaN there makes that step's loss NaN and leaves its gradients (and params) finite."""
    error = jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets[:, :1]))
    return error + jax.lax.stop_gradient(jnp.mean(targets[:, 1:]))


def _batches(poison_step=None):
    rng = np.random.default_rng(0)
    batches = []
    for step in range(1, STEPS + 1):
        inputs = rng.normal(size=(ROWS, 3)).astype(np.float32)
        targets = np.zeros((ROWS, 2), np.float32)
        targets[:, 0] = inputs.sum(axis=1) + rng.normal(size=ROWS).astype(np.float32)
        if step == poison_step:
            targets[:, 1] = np.nan
        batches.append({"inputs": inputs, "targets": targets})
    return batches


def _data(batches):
    return Dataset(train=lambda partition: iter(batches), records=ROWS, batch=ROWS)


@pytest.fixture(scope="module")
def objective():
    model = eqx.nn.MLP(3, 1, 8, 1, key=jax.random.key(0))
    return SupervisedObjective(model, _poisoned_mse)


OPTIMIZER = optax.adam(0.05)


@pytest.fixture(scope="module")
def hand_losses(objective):
    """Each step's loss from a hand-written jitted loop over the same batches."""
    step = jax.jit(lambda state, batch: train_step(objective, OPTIMIZER, state, batch, KEY))
    state = TrainState.create(objective, OPTIMIZER, key=jax.random.key(1))
    losses = []
    for batch in _batches():
        state, outputs = step(state, batch)
        losses.append(float(outputs["loss"]))
    return np.array(losses, np.float64)


KEY = jax.random.key(2)  # the loss ignores its key, so the hand loop may use any


def _window_means(losses, start=0):
    """The mean of each window of `LOG_EVERY` steps ending at a log step, from `start`."""
    ends = [end for end in range(start + 1, STEPS + 1) if end % LOG_EVERY == 0]
    return [(end, float(np.mean(losses[max(start, end - LOG_EVERY) : end]))) for end in ends]


def _fit(objective, **kwargs):
    tracker = InMemoryTracker()
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(1), **kwargs.pop("trainer", {}))
    trainer.fit(
        _data(kwargs.pop("batches", _batches())),
        kwargs.pop("steps", STEPS),
        log_every=LOG_EVERY,
        tracker=tracker,
        progress=False,
        **kwargs,
    )
    return tracker.scalars["supervised/train/loss"]


@pytest.mark.parametrize("steps_per_call", [1, 2, 4])
def test_a_log_step_reports_the_windows_mean(objective, hand_losses, steps_per_call):
    reported = _fit(objective, steps_per_call=steps_per_call)
    expected = _window_means(hand_losses)
    assert [step for step, _ in reported] == [step for step, _ in expected]
    np.testing.assert_allclose([v for _, v in reported], [v for _, v in expected], rtol=1e-5)
    # and not the log step's own value: the windows' losses differ
    assert not np.allclose([v for _, v in reported], hand_losses[LOG_EVERY - 1 :: LOG_EVERY])


def test_train_reduction_last_reports_the_log_steps_own_value(objective, hand_losses):
    reported = _fit(objective, train_reduction="last")
    np.testing.assert_allclose(
        [value for _, value in reported], hand_losses[LOG_EVERY - 1 :: LOG_EVERY], rtol=1e-5
    )


def test_a_resumed_fit_starts_an_empty_window(objective, hand_losses, tmp_path):
    folder = {"checkpoint_dir": tmp_path / "run"}
    first = _fit(objective, steps=6, trainer=folder)  # saves step 6 (off the log cadence)
    assert [step for step, _ in first] == [4]
    second = _fit(objective, trainer=folder)  # resumes at 6: windows 7-8 and 9-12
    expected = _window_means(hand_losses, start=6)
    assert [step for step, _ in second] == [8, 12]
    np.testing.assert_allclose([v for _, v in second], [v for _, v in expected], rtol=1e-5)


def test_a_nan_inside_the_window_shows_at_its_log_step(objective):
    poisoned = _batches(poison_step=2)  # a NaN loss at step 2, finite params throughout
    with pytest.raises(NonFiniteTrainingError, match="training loss is nan at step 4"):
        _fit(objective, batches=poisoned)
    reported = _fit(objective, batches=poisoned, train_reduction="last")  # step 4 is finite
    assert all(np.isfinite(value) for _, value in reported)
    continued = _fit(objective, batches=poisoned, on_nonfinite="continue")
    assert np.isnan(continued[0][1]) and np.isfinite(continued[1][1])  # the window reset


def test_early_stopping_on_the_training_split_reads_the_windows_mean(objective, hand_losses):
    class Decisions:
        def __init__(self):
            self.values = []

        def on_event(self, event):
            if event.name == BEST_MODEL:
                self.values.append((event.step, event.decision.value))

    decisions = Decisions()
    stopper = EarlyStopper(metric="loss", patience=10, source=Split.TRAIN)
    _fit(objective, early_stopper=stopper, event_sinks=[decisions])
    expected = dict(_window_means(hand_losses))
    assert decisions.values and decisions.values[0][0] == LOG_EVERY  # the first always improves
    for step, value in decisions.values:
        np.testing.assert_allclose(value, expected[step], rtol=1e-5)


@pytest.mark.parametrize("bad", ["median", "Mean"])
def test_an_unknown_train_reduction_is_refused_by_name(objective, bad):
    with pytest.raises(ValueError, match=f"train_reduction must be 'mean' or 'last', got {bad!r}"):
        _fit(objective, train_reduction=bad)


_values = st.lists(
    st.one_of(
        st.floats(-1e6, 1e6, width=32),
        st.sampled_from([np.nan, np.inf, -np.inf]),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(_values)
def test_the_window_is_the_mean_of_its_steps(values):
    """The window's fold over steps equals NumPy's float64 mean; a NaN or an infinity at any
    step shows in it as NumPy's mean shows it."""
    window = TrainWindow.empty(("loss",))
    for value in values:
        window = window.add({"loss": jnp.float32(value)})
    fetched = jax.device_get(window)
    mean = fetched.means()["loss"]
    # The third row holds the last step's values: what `train_reduction="last"` reports.
    last = window_values(("loss",), fetched.sums, mean=False)["loss"]
    np.testing.assert_array_equal(np.float32(last), np.float32(values[-1]))
    with np.errstate(invalid="ignore"):
        expected = float(np.mean(np.asarray(values, np.float32).astype(np.float64)))
    if np.isfinite(expected):
        np.testing.assert_allclose(mean, expected, rtol=1e-6, atol=1e-6)
    else:
        assert mean == expected or (np.isnan(mean) and np.isnan(expected))
