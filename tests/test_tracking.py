"""dew.tracking: the protocol, the context-manager base and InMemoryTracker."""

import pytest
from _checks import rejects

from dew.tracking import AbstractTracker, InMemoryTracker, Tracker, Trackers


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


class Exploding(InMemoryTracker):
    def __init__(self, message):
        super().__init__()
        self.message = message

    def log_metrics(self, values, *, step):
        raise OSError(self.message)

    def close(self):
        super().close()
        raise OSError(f"close: {self.message}")


def test_trackers_reach_every_tracker_even_when_one_fails():
    first, broken, last = InMemoryTracker(), Exploding("disk full"), InMemoryTracker()
    broken_too = Exploding("network down")
    tracker = Trackers(first, broken, last, broken_too)
    with pytest.raises(OSError, match="disk full") as caught:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    assert first.scalars == last.scalars == {"lm/train/loss": [(0, 1.0)]}
    assert any("network down" in note for note in caught.value.__notes__)
    tracker.log_params({"seed": 1})
    tracker.log_artifact("notes", "x", step=2)
    assert first.params == last.params == broken.params == {"seed": 1}
    assert last.artifacts == {"notes": [(2, "x")]}
    with pytest.raises(OSError, match="close: disk full"):
        tracker.close()
    assert first.closed and broken.closed and last.closed and broken_too.closed


def test_trackers_refuse_non_trackers():
    with rejects(TypeError, "Trackers takes trackers", parameter="trackers"):
        Trackers(InMemoryTracker(), "runs/x")
