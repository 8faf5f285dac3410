"""EarlyStopper: improvement and stopping tables for min and max modes."""

import math

import pytest
from _checks import rejects

from dew.naming import Split
from dew.supervised import EarlyStopper


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
