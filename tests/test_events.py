"""dew.events: training events and the adapter from events to a tracker."""

import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from hypothesis import given
from hypothesis import strategies as st

from dew.events import Decision, EventSink, TrackerEventSink, TrainingEvent
from dew.naming import Split, parse_metric_tag
from dew.tracking import InMemoryTracker


class RecordingTracker:
    """A tracker that records every call made on it, in order."""

    def __init__(self):
        self.calls = []

    def log_params(self, values):
        self.calls.append(("log_params", values))

    def log_metrics(self, values, *, step):
        self.calls.append(("log_metrics", dict(values), step))

    def log_artifact(self, name, value, *, step=None):
        self.calls.append(("log_artifact", name, value, step))

    def close(self):
        self.calls.append(("close",))


def test_a_metric_event_becomes_one_log_metrics_call_under_its_tags():
    tracker = RecordingTracker()
    sink = TrackerEventSink(tracker)
    sink.on_event(
        TrainingEvent(
            "validation_end", "mean", Split.VALIDATION, 4, metrics={"loss": 0.5, "rmse": 2}
        )
    )
    assert tracker.calls == [
        ("log_metrics", {"mean/validation/loss": 0.5, "mean/validation/rmse": 2}, 4)
    ]


def test_a_decision_event_logs_nothing():
    tracker = RecordingTracker()
    sink = TrackerEventSink(tracker)
    sink.on_event(
        TrainingEvent(
            "best_model", "supervised", Split.VALIDATION, 1, decision=Decision("loss", 0.1)
        )
    )
    sink.on_event(
        TrainingEvent("early_stop", "supervised", Split.TRAIN, 2, decision=Decision("loss", 0.2))
    )
    assert tracker.calls == []


def test_an_event_without_metrics_logs_nothing():
    tracker = RecordingTracker()
    TrackerEventSink(tracker).on_event(TrainingEvent("epoch_end", "lm", Split.TRAIN, 0))
    assert tracker.calls == []


def test_device_scalars_reach_the_tracker_as_python_numbers():
    tracker = InMemoryTracker()
    TrackerEventSink(tracker).on_event(
        TrainingEvent(
            "step_end",
            "lm",
            Split.TRAIN,
            3,
            metrics={"loss": jnp.float32(1.5), "count": np.int64(7), "nan": float("nan")},
        )
    )
    assert tracker.scalars["lm/train/loss"] == [(3, 1.5)]
    assert type(tracker.scalars["lm/train/loss"][0][1]) is float
    assert tracker.scalars["lm/train/count"] == [(3, 7)]
    ((step, value),) = tracker.scalars["lm/train/nan"]
    assert step == 3 and np.isnan(value)


def test_non_scalar_metric_values_raise():
    sink = TrackerEventSink(InMemoryTracker())
    event = TrainingEvent("step_end", "lm", Split.TRAIN, 0, metrics={"loss": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"scalars, got an array of shape \(3,\)"):
        sink.on_event(event)


def test_a_bad_metric_name_raises_naming_it():
    sink = TrackerEventSink(InMemoryTracker())
    event = TrainingEvent("step_end", "lm", Split.TRAIN, 0, metrics={"nll/sum": 1.0})
    with pytest.raises(ValueError, match=r"^metric 'nll/sum' may not contain '/'.$"):
        sink.on_event(event)


def test_decision_events_may_not_carry_metrics():
    with pytest.raises(ValueError, match="decision event 'best_model' may not carry metrics"):
        TrainingEvent(
            "best_model", "s", Split.TRAIN, 0, metrics={"loss": 1.0}, decision=Decision("loss", 1.0)
        )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"split": "test"}, ValueError, "split 'test' is not one of 'train', 'validation'"),
        ({"step": -1}, ValueError, "event step must be an integer >= 0, got -1"),
        ({"step": 1.5}, TypeError, "event step must be an integer >= 0, got 1.5"),
        ({"name": ""}, ValueError, "event name must be a non-empty string"),
    ],
)
def test_bad_events_raise(kwargs, error, message):
    fields = {"name": "epoch_end", "stage": "s", "split": Split.TRAIN, "step": 0} | kwargs
    with rejects(error, message, parameter=next(iter(kwargs))):
        TrainingEvent(**fields)


def test_split_given_as_its_value_is_converted():
    assert TrainingEvent("epoch_end", "s", "validation", 0).split is Split.VALIDATION


def test_sinks_are_structural():
    class Printer:
        def on_event(self, event):
            pass

    assert isinstance(Printer(), EventSink)
    assert isinstance(TrackerEventSink(InMemoryTracker()), EventSink)
    assert not isinstance(object(), EventSink)


names = st.text(min_size=1, max_size=8).filter(lambda name: "/" not in name)


@given(
    stage=names,
    split=st.sampled_from(list(Split)),
    step=st.integers(0, 10**6),
    metrics=st.dictionaries(names, st.floats(allow_nan=False), max_size=5),
)
def test_tags_the_tracker_receives_parse_back_to_the_event(stage, split, step, metrics):
    tracker = RecordingTracker()
    TrackerEventSink(tracker).on_event(
        TrainingEvent("epoch_end", stage, split, step, metrics=metrics)
    )
    if not metrics:
        assert tracker.calls == []
        return
    ((kind, values, logged_step),) = tracker.calls
    assert kind == "log_metrics" and logged_step == step
    assert {parse_metric_tag(tag) for tag in values} == {(stage, split, name) for name in metrics}
    for tag, value in values.items():
        assert value == metrics[parse_metric_tag(tag).metric]
