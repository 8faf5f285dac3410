"""dew.tracking._base: every tracker dew ships shares one lifecycle (AbstractRunTracker)."""

import pytest

from dew.telemetry.records import FitEnded
from dew.tracking import (
    AbstractRunTracker,
    AbstractTracker,
    InMemoryTracker,
    LocalTracker,
    MLflowTracker,
    TensorBoardTracker,
    Trackers,
    WandbTracker,
)

# MLflow's SQL store configures its SQLAlchemy mappers with a loader SQLAlchemy deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


def _memory(tmp_path, monkeypatch):
    return InMemoryTracker(), "InMemoryTracker"


def _local(tmp_path, monkeypatch):
    return LocalTracker(tmp_path), f"LocalTracker({str(tmp_path)!r})"


def _tensorboard(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    return TensorBoardTracker(tmp_path), f"TensorBoardTracker({str(tmp_path)!r})"


def _mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    tracker = MLflowTracker("lifecycle", uri=tmp_path / "mlruns")
    return tracker, f"MLflowTracker(run {tracker.run_id})"


def _wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    tracker = WandbTracker("dew-tests", offline=True, dir=tmp_path / "wandb")
    return tracker, f"WandbTracker(run {tracker.run.id})"


def _fanout(tmp_path, monkeypatch):
    return Trackers(InMemoryTracker(), LocalTracker(tmp_path)), "Trackers"


FACTORIES = [_memory, _local, _tensorboard, _mlflow, _wandb, _fanout]
CLASSES = [InMemoryTracker, LocalTracker, TensorBoardTracker, MLflowTracker, WandbTracker, Trackers]


@pytest.fixture(params=FACTORIES, ids=lambda factory: factory.__name__.strip("_"))
def made(request, tmp_path, monkeypatch):
    tracker, description = request.param(tmp_path, monkeypatch)
    yield tracker, description
    tracker.close()


def test_a_closed_tracker_refuses_every_report_in_the_same_words(made):
    tracker, description = made
    assert not tracker.closed and not tracker.failed
    tracker.close()
    tracker.close()  # closing twice is harmless
    assert tracker.closed
    expected = f"{description} is closed; it records nothing more."
    for report in (
        lambda: tracker.log_params({"seed": 1}),
        lambda: tracker.log_metrics({"lm/train/loss": 1.0}, step=0),
        lambda: tracker.log_artifact("notes", "text", step=0),
    ):
        with pytest.raises(RuntimeError) as caught:
            report()
        assert str(caught.value) == expected


def _fail_inside(tracker):
    with tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
        raise KeyError("in the loop")


def test_leaving_the_with_block_on_an_exception_marks_the_run_failed(made):
    tracker, _ = made
    with pytest.raises(KeyError, match="in the loop"):
        _fail_inside(tracker)
    assert tracker.closed and tracker.failed


def test_a_fit_ended_record_decides_whether_the_run_failed(made):
    tracker, _ = made
    with tracker:
        tracker.log_artifact("fit_ended", FitEnded(status="completed", step=0), step=0)
        assert not tracker.failed
        tracker.log_artifact("fit_ended", FitEnded(status="interrupted", step=1), step=1)
        assert tracker.failed
    assert tracker.closed and tracker.failed


def test_a_refused_report_leaves_the_run_as_it_was(made):
    tracker, _ = made
    with pytest.raises(ValueError, match="artifact name 'a/b' may not contain '/'"):
        tracker.log_artifact("a/b", FitEnded(status="failed", step=0), step=0)
    assert not tracker.failed and not tracker.closed


def test_a_clean_with_block_closes_without_marking_the_run_failed(made):
    tracker, _ = made
    with tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    assert tracker.closed and not tracker.failed


_CONCRETE = sorted(
    name
    for name, member in {**vars(AbstractTracker), **vars(AbstractRunTracker)}.items()
    if name not in {"__abstractmethods__", "_abc_impl", "__doc__", "__module__", "__dict__"}
    and not getattr(member, "__isabstractmethod__", False)
    and not name.startswith("__annotations")
    and (callable(member) or isinstance(member, property))
)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_a_tracker_fills_in_the_hooks_and_overrides_no_concrete_method(cls):
    assert {"log_params", "close", "__enter__", "__exit__", "closed", "failed"} <= set(_CONCRETE)
    assert issubclass(cls, AbstractRunTracker) and not cls.__abstractmethods__
    for klass in cls.__mro__[: cls.__mro__.index(AbstractRunTracker)]:
        overridden = sorted(set(_CONCRETE) & set(vars(klass)))
        assert overridden == [], f"{klass.__name__} overrides {overridden}"
