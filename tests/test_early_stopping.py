"""EarlyStopper: improvement and stopping tables for min and max modes, and what a report
without the monitored metric does."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from _checks import rejects

from dew._loop import LoopEngine
from dew.naming import Split
from dew.steps import EMPTY_HISTORY
from dew.supervised import (
    Batch,
    EarlyStopper,
    HeldOutValidation,
    create_optimizer,
    initialize_training_state,
    run_supervised,
)
from dew.tracking import InMemoryTracker


def _run(stopper, values):
    state = stopper.init()
    table = []
    for step, value in enumerate(values):
        state = stopper.update(state, value, step=step)
        table.append((state.improved, state.stop))
        if state.stop:
            break
    return table, state


def test_monitored_metric_name_is_bare():
    stopper = EarlyStopper(metric="loss", mode="min", patience=5, source=Split.TRAIN)
    assert stopper.monitored_metric_name() == "loss"
    assert stopper.source is Split.TRAIN
    assert EarlyStopper(metric="loss").source is Split.VALIDATION


@pytest.mark.parametrize(
    ("mode", "patience", "values", "expected"),
    [
        ("min", 0, [3, 2, 1], [(True, False)] * 3),
        ("min", 0, [3, 2, 2.5], [(True, False), (True, False), (False, True)]),
        ("min", 0, [3, 3], [(True, False), (False, True)]),
        (
            "min",
            1,
            [3, 4, 2, 5, 6],
            [(True, False), (False, False), (True, False), (False, False), (False, True)],
        ),
        ("min", 2, [3, 4, 5, 6], [(True, False), (False, False), (False, False), (False, True)]),
        (
            "min",
            2,
            [3, 4, 5, 1, 2],
            [(True, False), (False, False), (False, False), (True, False), (False, False)],
        ),
        ("max", 0, [0.1, 0.5, 0.4], [(True, False), (True, False), (False, True)]),
        (
            "max",
            1,
            [0.1, 0.05, 0.2, 0.2, 0.2],
            [(True, False), (False, False), (True, False), (False, False), (False, True)],
        ),
        (
            "max",
            3,
            [1, 0, 0, 0, 0],
            [(True, False), (False, False), (False, False), (False, False), (False, True)],
        ),
    ],
)
def test_stopping_tables(mode, patience, values, expected):
    table, _ = _run(EarlyStopper(metric="m", mode=mode, patience=patience), values)
    assert table == expected


def test_best_and_best_step_track_the_improvements():
    _, state = _run(EarlyStopper(metric="loss", patience=10), [5.0, 3.0, 4.0, 3.5])
    assert (state.best, state.best_step, state.waited) == (3.0, 1, 2)


def test_nan_never_improves():
    table, state = _run(
        EarlyStopper(metric="loss", patience=1), [math.nan, 1.0, math.nan, math.nan]
    )
    assert table == [(False, False), (True, False), (False, False), (False, True)]
    assert state.best == 1.0


def test_infinities_improve_only_in_their_direction():
    assert _run(EarlyStopper(metric="psnr", mode="max"), [30.0, math.inf])[0][-1] == (True, False)
    assert _run(EarlyStopper(metric="loss", mode="min"), [1.0, math.inf])[0][-1] == (False, True)
    assert _run(EarlyStopper(metric="loss", mode="min"), [1.0, -math.inf])[0][-1] == (True, False)


def test_min_delta():
    table, _ = _run(EarlyStopper(metric="loss", patience=0, min_delta=0.5), [3.0, 2.8])
    assert table == [(True, False), (False, True)]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"metric": "val/loss"}, ValueError, "^metric 'val/loss' may not contain '/'.$"),
        ({"metric": "loss", "mode": "lowest"}, ValueError, "mode 'lowest' is not one of"),
        (
            {"metric": "loss", "patience": -1},
            ValueError,
            "patience must be an integer >= 0, got -1",
        ),
        ({"metric": "loss", "patience": 1.5}, TypeError, "patience must be an integer"),
        ({"metric": "loss", "source": "test"}, ValueError, "source 'test' is not one of"),
        ({"metric": "loss", "min_delta": -1.0}, ValueError, "min_delta must be a real number"),
    ],
)
def test_bad_configuration_raises(kwargs, error, message):
    with rejects(error, message, parameter=next(reversed(kwargs))):
        EarlyStopper(**kwargs)


def _engine(stopper):
    return LoopEngine(stage="s", current=lambda: None, history=EMPTY_HISTORY, early_stopper=stopper)


def test_a_stopper_whose_metric_its_split_lacks_raises_naming_both():
    # A misspelt metric fails at the split's first report rather than never stopping.
    engine = _engine(EarlyStopper(metric="acuracy", patience=0))
    with pytest.raises(ValueError, match="monitors 'acuracy'") as caught:
        engine.update_early_stopping(Split.VALIDATION, 1, {"accuracy": 0.5, "loss": 1.0})
    assert str(caught.value) == (
        "the early stopper monitors 'acuracy' on the validation split, but the validation "
        "metrics are ['accuracy', 'loss']."
    )


def test_a_report_with_no_values_or_of_another_split_decides_nothing():
    engine = _engine(EarlyStopper(metric="loss", patience=0))
    before = engine.stopping
    update = engine.update_early_stopping
    assert update(Split.VALIDATION, 1, {}) is False  # an empty validation pass
    assert update(Split.TRAIN, 1, {"accuracy": 0.5}) is False  # not the watched split
    assert engine.stopping == before
    assert update(Split.VALIDATION, 2, {"loss": 1.0}) is False
    assert engine.stopping.improved and update(Split.VALIDATION, 3, {"loss": 2.0}) is True


def test_run_supervised_with_a_missing_validation_metric_raises():
    def loss(model, inputs, targets, sample_weight, key, training):
        return jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets))

    def loader(*, split, epoch):
        return [Batch(jnp.ones((4, 1)), jnp.zeros((4, 1)))]

    model = eqx.nn.Linear(1, 1, key=jax.random.key(0))
    optimizer = create_optimizer(model, optax.sgd(0.1))
    tracker = InMemoryTracker()
    with pytest.raises(ValueError, match="monitors 'val_loss' on the validation split, but the"):
        run_supervised(
            model=model,
            optimizer=optimizer,
            train_loader=loader,
            loss=loss,
            state=initialize_training_state(model, optimizer, jax.random.key(0)),
            epochs=3,
            validation=HeldOutValidation(model, loader, loss),
            early_stopper=EarlyStopper(metric="val_loss"),
            tracker=tracker,
        )
    assert tracker.artifacts["fit_ended"][0][1].status == "failed"
