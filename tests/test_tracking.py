"""dew.tracking: the protocol, the context-manager base and InMemoryTracker."""

import jax.numpy as jnp
import pytest
from _checks import rejects

from dew.artifacts import Images
from dew.naming import Split, flatten_parameters, preview_name
from dew.tracking import AbstractTracker, InMemoryTracker, Tracker, Trackers
from dew.tracking._protocol import takes_artifacts


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
    message = "tracker 'runs/x' of type str has no log_metrics"
    with rejects(TypeError, message, parameter="trackers"):
        Trackers(InMemoryTracker(), "runs/x")


class ExperimentTracker:
    """Document 001's InMemoryTracker, as its page writes it (an ExperimentTracker)."""

    def __init__(self):
        self.params = {}
        self.scalars = {}
        self.artifacts = {}

    def log_params(self, values):
        self.params.update(flatten_parameters(values))

    def log_metrics(self, values, *, step):
        for tag, value in values.items():
            self.scalars.setdefault(tag, []).append((step, value))

    def log_artifact(self, name, value):
        self.artifacts[name] = value


class OnlyScalars:
    """Document 000's "tracker that only takes scalars"."""

    def __init__(self):
        self.scalars = []

    def log_metrics(self, values, *, step):
        self.scalars.append((step, dict(values)))


class OldProtocol:
    """Document 000's wording of the protocol: log(scalars, step), artifact(value, step)."""

    def log(self, scalars, step):
        pass

    def artifact(self, value, step):
        pass

    def close(self):
        pass


class NoStep:
    def log_metrics(self, values):
        pass


class ArtifactAttribute:
    log_artifact = "samples"

    def log_metrics(self, values, *, step):
        pass


def test_what_a_runner_takes_as_a_tracker():
    assert takes_artifacts(InMemoryTracker()) and takes_artifacts(Trackers())
    assert not takes_artifacts(ExperimentTracker())  # its runners never give it artifacts
    assert not takes_artifacts(OnlyScalars())
    for tracker, missing in [
        (OldProtocol(), "has no log_metrics method"),
        (NoStep(), "its log_metrics takes no step keyword"),
        (ArtifactAttribute(), "its log_artifact is not a method"),
        (None, "tracker None of type NoneType has no log_metrics method"),
    ]:
        with pytest.raises(TypeError, match=missing) as caught:
            takes_artifacts(tracker)
        assert "a tracker has log_metrics(values, *, step)" in str(caught.value)


def test_scalar_only_trackers_in_trackers_get_the_metrics_and_params_they_take():
    experiment, scalars, memory = ExperimentTracker(), OnlyScalars(), InMemoryTracker()
    with Trackers(experiment, scalars, memory) as tracker:
        tracker.log_params({"optimizer": {"name": "sgd"}})
        tracker.log_metrics({"lm/train/loss": 1.0}, step=2)
        tracker.log_artifact("notes", "three epochs of SGD", step=2)
    assert experiment.scalars == memory.scalars == {"lm/train/loss": [(2, 1.0)]}
    assert scalars.scalars == [(2, {"lm/train/loss": 1.0})]
    assert experiment.params == memory.params == {"optimizer/name": "sgd"}
    assert experiment.artifacts == {}
    assert memory.artifacts == {"notes": [(2, "three epochs of SGD")]}
    assert memory.closed
    with rejects(TypeError, "its log_metrics takes no step keyword", parameter="trackers"):
        Trackers(memory, NoStep())


def test_two_stages_previews_keep_their_own_names_in_memory():
    shown = {"a": Images(jnp.zeros((1, 2, 2, 1))), "b": Images(jnp.ones((1, 2, 2, 1)))}
    memory = InMemoryTracker()
    with Trackers(memory) as tracker:
        for stage, images in shown.items():
            tracker.log_artifact(preview_name(stage, Split.VALIDATION, "samples"), images, step=3)
        with pytest.raises(ValueError, match="a preview's name is stage/split/name"):
            tracker.log_artifact("samples", shown["a"], step=3)  # checked before any tracker
    assert memory.artifacts == {
        "a/validation/samples": [(3, shown["a"])],
        "b/validation/samples": [(3, shown["b"])],
    }


class FailsOn(InMemoryTracker):
    """Raises `error` (one object, every time) when an artifact named `name` is logged."""

    def __init__(self, name, error):
        super().__init__()
        self.name, self.error = name, error

    def log_artifact(self, name, value, *, step=None):
        super().log_artifact(name, value, step=step)
        if name == self.name:
            raise self.error


def _engine(tracker):
    from dew._loop import LoopEngine
    from dew.steps import MetricHistory

    return LoopEngine(stage="lm", current=lambda: None, history=MetricHistory(), tracker=tracker)


def test_a_tracker_failing_on_fit_ended_never_replaces_the_fits_own_error():
    tracker = FailsOn("fit_ended", OSError("disk full"))
    engine = _engine(tracker)
    with (
        pytest.raises(ValueError, match="token 9 is outside the vocabulary") as caught,
        engine.reporting_fit(start=0, steps=10, completed=lambda: 3),
    ):
        raise ValueError("token 9 is outside the vocabulary")
    assert caught.value.__notes__ == [
        "Reporting FitEnded('failed') to the tracker also failed: OSError: disk full"
    ]
    ended = tracker.artifacts["fit_ended"][0][1]
    assert (ended.status, ended.step) == ("failed", 3)
    assert ended.error == "ValueError: token 9 is outside the vocabulary"


def test_a_tracker_failing_on_fit_ended_after_an_interrupt_keeps_the_interrupt():
    tracker = FailsOn("fit_ended", OSError("disk full"))
    engine = _engine(tracker)
    with (
        pytest.raises(KeyboardInterrupt) as caught,
        engine.reporting_fit(start=0, steps=10, completed=lambda: 2),
    ):
        raise KeyboardInterrupt
    assert caught.value.__notes__ == [
        "Reporting FitEnded('interrupted') to the tracker also failed: OSError: disk full"
    ]


def test_a_completed_fit_whose_fit_ended_report_fails_raises_that_failure():
    tracker = FailsOn("fit_ended", OSError("disk full"))
    engine = _engine(tracker)
    with (
        pytest.raises(OSError, match="disk full"),
        engine.reporting_fit(start=0, steps=10, completed=lambda: 10),
    ):
        pass


def test_healthy_trackers_see_fit_ended_failed_when_another_fails_on_fit_started(tmp_path):
    from dew.tracking import LocalTracker, read_journal

    healthy, memory = LocalTracker(tmp_path), InMemoryTracker()
    broken = FailsOn("fit_started", ConnectionError("tracking server unreachable"))
    body_ran = []
    with (
        Trackers(healthy, broken, memory) as tracker,
        pytest.raises(ConnectionError, match="unreachable") as caught,
        _engine(tracker).reporting_fit(start=4, steps=10, completed=lambda: 4),
    ):
        body_ran.append(True)
    assert body_ran == []
    assert not hasattr(caught.value, "__notes__")  # FitEnded reached the broken one too
    records = [(name, record.type) for name, _, record in read_journal(tmp_path).records]
    assert records == [("fit_started", "fit_started"), ("fit_ended", "fit_ended")]
    for ended in (read_journal(tmp_path).records[1][2], memory.artifacts["fit_ended"][0][1]):
        assert (ended.status, ended.step) == ("failed", 4)
        assert (
            ended.error
            == "reporting FitStarted failed: ConnectionError: tracking server unreachable"
        )
    assert [step for step, _ in broken.artifacts["fit_ended"]] == [4]


def test_a_reused_exception_collects_each_note_once():
    shared = OSError("disk full")  # one object, raised by every call
    first = FailsOn("samples", shared)
    second = FailsOn("samples", OSError("network down"))
    tracker = Trackers(first, second)
    for _ in range(3):
        with pytest.raises(OSError, match="disk full") as caught:
            tracker.log_artifact("samples", "x", step=1)
        assert caught.value is shared
        assert shared.__notes__ == ["Another tracker also failed: OSError: network down"]


def test_one_exception_raised_by_two_trackers_carries_no_note_about_itself():
    shared = OSError("disk full")
    tracker = Trackers(FailsOn("samples", shared), FailsOn("samples", shared))
    with pytest.raises(OSError, match="disk full"):
        tracker.log_artifact("samples", "x", step=1)
    assert not hasattr(shared, "__notes__")


def test_closing_failures_noted_once_on_a_reused_exception():
    shared = ZeroDivisionError("step 3")
    for _ in range(2):
        with pytest.raises(ZeroDivisionError), FailingClose():
            raise shared
    assert shared.__notes__ == [
        "While handling this exception, closing FailingClose also failed: OSError: disk full "
        "while flushing"
    ]


def test_trackers_check_names_and_steps_before_any_tracker_is_called():
    first, second = InMemoryTracker(), InMemoryTracker()
    tracker = Trackers(first, second)
    with pytest.raises(ValueError, match=r"artifact name '\.\.' may not be"):
        tracker.log_artifact("..", "x", step=1)
    with pytest.raises(ValueError, match="step must be an integer >= 0, got -1"):
        tracker.log_metrics({"lm/train/loss": 1.0}, step=-1)
    assert first.artifacts == second.artifacts == {} and first.scalars == second.scalars == {}


class Interrupted(InMemoryTracker):
    """Raises KeyboardInterrupt on every report and on closing (after recording it)."""

    def _log_metrics(self, values, *, step):
        super()._log_metrics(values, step=step)
        raise KeyboardInterrupt

    def _close(self):
        raise KeyboardInterrupt


def test_a_keyboard_interrupt_from_one_tracker_still_lets_every_tracker_report():
    first, interrupted, last = InMemoryTracker(), Interrupted(), InMemoryTracker()
    broken = Exploding("disk full")
    tracker = Trackers(first, broken, interrupted, last)
    with pytest.raises(KeyboardInterrupt) as caught:  # the interrupt wins over the OSError
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    assert first.scalars == interrupted.scalars == last.scalars == {"lm/train/loss": [(0, 1.0)]}
    assert caught.value.__notes__ == ["Another tracker also failed: OSError: disk full"]
    with pytest.raises(KeyboardInterrupt):
        tracker.close()
    assert first.closed and interrupted.closed and last.closed and broken.closed


class FailsEachStep(InMemoryTracker):
    """Raises a new error naming itself and the step on every report."""

    def __init__(self, label):
        super().__init__()
        self.label = label

    def _log_metrics(self, values, *, step):
        raise OSError(f"{self.label}: step {step} lost")


def test_a_reused_exception_carries_the_notes_of_its_latest_raise_only():
    shared = OSError("disk full")  # one object, raised by every call

    class Shared(InMemoryTracker):
        def _log_metrics(self, values, *, step):
            raise shared

    inner = Trackers(Shared(), FailsEachStep("inner"))
    tracker = Trackers(inner, FailsEachStep("outer"))
    for step in range(1000):
        with pytest.raises(OSError, match="disk full") as caught:
            tracker.log_metrics({"lm/train/loss": 1.0}, step=step)
        assert caught.value is shared
    assert shared.__notes__ == [  # one note from each Trackers, about the latest call
        "Another tracker also failed: OSError: inner: step 999 lost",
        "Another tracker also failed: OSError: outer: step 999 lost",
    ]


def test_a_reused_exception_left_in_a_with_block_carries_one_closing_note():
    shared = ZeroDivisionError("step 3")

    class FailingCloseAt(FailingClose):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def close(self):
            self.calls += 1
            raise OSError(f"disk full on close {self.calls}")

    tracker = FailingCloseAt()
    for _ in range(1000):
        with pytest.raises(ZeroDivisionError), tracker:
            raise shared
    assert shared.__notes__ == [
        "While handling this exception, closing FailingCloseAt also failed: OSError: disk full "
        "on close 1000"
    ]


def test_a_reused_exception_through_1000_fits_carries_one_fit_ended_note():
    shared = ValueError("token 9 is outside the vocabulary")
    for index in range(1000):
        tracker = FailsOn("fit_ended", OSError(f"disk full ({index})"))
        with (
            pytest.raises(ValueError, match="outside the vocabulary"),
            _engine(tracker).reporting_fit(start=0, steps=10, completed=lambda: 3),
        ):
            raise shared
    assert shared.__notes__ == [
        "Reporting FitEnded('failed') to the tracker also failed: OSError: disk full (999)"
    ]


def test_leaving_a_trackers_block_on_an_exception_marks_every_tracker_failed():
    first, second = InMemoryTracker(), InMemoryTracker()
    with pytest.raises(KeyError), Trackers(first, second):
        raise KeyError("in the loop")
    assert first.closed and second.closed and first.failed and second.failed
    clean = InMemoryTracker()
    with Trackers(clean):
        pass
    assert clean.closed and not clean.failed
