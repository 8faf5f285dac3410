"""dew.tracking: the protocol, the context-manager base and InMemoryTracker."""

import pytest

from dew.tracking import AbstractTracker, InMemoryTracker, Tracker


class FailingClose(AbstractTracker):
    def __init__(self):
        self.closed = 0

    def log_params(self, values):
        pass

    def log_metrics(self, values, *, step):
        pass

    def log_artifact(self, name, value, *, step=None):
        pass

    def close(self):
        self.closed += 1
        raise OSError("disk full while flushing")


def test_in_memory_tracker_records_what_it_is_told():
    tracker = InMemoryTracker()
    tracker.log_params({"optimizer": {"name": "sgd", "learning_rate": 0.1}})
    tracker.log_metrics({"s/train/loss": 1.0, "s/validation/loss": 2.0}, step=0)
    tracker.log_metrics({"s/train/loss": 0.5}, step=1)
    tracker.log_artifact("notes", "three epochs of SGD")
    tracker.log_artifact("notes", "more", step=4)
    assert sorted(tracker.params) == ["optimizer/learning_rate", "optimizer/name"]
    assert tracker.scalars == {
        "s/train/loss": [(0, 1.0), (1, 0.5)],
        "s/validation/loss": [(0, 2.0)],
    }
    assert tracker.artifacts == {"notes": [(None, "three epochs of SGD"), (4, "more")]}


def test_in_memory_tracker_refuses_reports_after_close():
    tracker = InMemoryTracker()
    tracker.close()
    with pytest.raises(RuntimeError, match="InMemoryTracker is closed"):
        tracker.log_metrics({"s/train/loss": 1.0}, step=0)


def test_context_manager_closes():
    with InMemoryTracker() as tracker:
        assert not tracker.closed
    assert tracker.closed


def test_closing_failure_is_raised_when_nothing_else_failed():
    with pytest.raises(OSError, match="disk full"), FailingClose():
        pass


def test_closing_failure_never_hides_the_exception_in_flight():
    tracker = FailingClose()
    with pytest.raises(ZeroDivisionError) as caught, tracker:
        1 / 0  # noqa: B018
    assert tracker.closed == 1
    assert any("OSError: disk full while flushing" in note for note in caught.value.__notes__)


def test_keyboard_interrupt_in_flight_is_kept_too():
    with pytest.raises(KeyboardInterrupt), FailingClose():
        raise KeyboardInterrupt


def test_trackers_satisfy_the_protocol():
    assert isinstance(InMemoryTracker(), Tracker)
    assert not isinstance(object(), Tracker)


def test_the_base_is_abstract():
    class Partial(AbstractTracker):
        def close(self):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Partial()
