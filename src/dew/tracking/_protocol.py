"""The tracker protocol: what any tracker, dew's or a user's, provides."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeGuard, runtime_checkable

__all__ = ["ScalarTracker", "Tracker", "same_failure", "set_notes", "takes_artifacts"]


_OWN_NOTES = "_dew_notes"  # on an exception: {source: the notes that source added}


def set_notes(error: BaseException, source: str, notes: Sequence[str]) -> None:
    """Make `notes` the notes `source` adds to `error` for this raise of it.

    A note dew adds tells what else failed alongside *one* raise of `error`. A tracker
    that keeps failing with one exception object raises it again and again: the notes
    `source` added to it on an earlier raise are taken off first, so the object carries
    the latest raise's notes only, however often it is raised (never one copy per
    call). A note whose text `error` already carries is not added twice. `source` names
    who adds them (one `Trackers`, one tracker's closing, a fit's `FitEnded` report).
    """
    owned: dict[str, list[str]] = error.__dict__.setdefault(_OWN_NOTES, {})
    present = getattr(error, "__notes__", None)
    for note in owned.pop(source, []):
        if present is not None and note in present:
            present.remove(note)
    added = []
    for note in notes:
        if note not in getattr(error, "__notes__", ()):
            error.add_note(note)
            added.append(note)
    if added:
        owned[source] = added


def same_failure(error: BaseException, other: BaseException) -> bool:
    """Whether two errors are one failure: the same object, or the operating system's
    same error on the same path (a full disk failing each write to one file)."""
    if error is other:
        return True
    return (
        isinstance(error, OSError)
        and isinstance(other, OSError)
        and (error.errno, error.filename) == (other.errno, other.filename)
    )


@runtime_checkable
class Tracker(Protocol):
    """A destination that records parameters, metrics and artifacts for one run.

    A tracker knows nothing about events: it is told what to record, never when
    a run reaches a point of interest. Whoever constructs a tracker closes it;
    `Trainer.fit` only borrows it.

    - `log_params(values)`: a nested mapping of hyperparameters. Trackers that
      store flat names flatten it with `dew.naming.flatten_parameters`.
    - `log_metrics(values, *, step)`: metric tag to scalar, at one step.
    - `log_artifact(name, value, *, step=None)`: a typed record
      (`dew.telemetry.records`), a preview artifact, or any value the tracker takes.
    - `close()`: flush and release everything.
    """

    def log_params(self, values: Mapping[str, Any]) -> None:
        """Record a nested mapping of hyperparameters."""

    def log_metrics(self, values: Mapping[str, Any], *, step: int) -> None:
        """Record metric tag to scalar, at one step."""

    def log_artifact(self, name: str, value: Any, *, step: int | None = None) -> None:
        """Record a typed record, a preview artifact, or any value the tracker takes."""

    def close(self) -> None:
        """Flush and release everything."""


@runtime_checkable
class ScalarTracker(Protocol):
    """The least a runner takes as a tracker: `log_metrics(values, *, step)` alone.

    Document 000's "tracker that only takes scalars" is one, and so is document 001's
    `ExperimentTracker`, whose `log_artifact(name, value)` has no step and which its
    runners only ever give metrics: `Trainer.fit` and `run_supervised` report their
    metrics to it and skip the records and previews (`takes_artifacts`).
    """

    def log_metrics(self, values: Mapping[str, Any], *, step: int) -> None:
        """Record metric tag to scalar, at one step."""


_PROTOCOL = (
    "a tracker has log_metrics(values, *, step), and log_artifact(name, value, *, step=None) "
    "for records and previews (one without it takes the scalars only)"
)


def _takes_step(method: Any) -> bool:
    """Whether `method` can be called with a `step` keyword."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): trust it
        return True
    return any(
        parameter.kind is parameter.VAR_KEYWORD
        or (parameter.name == "step" and parameter.kind is not parameter.POSITIONAL_ONLY)
        for parameter in parameters
    )


def takes_artifacts(tracker: object) -> TypeGuard[Tracker]:
    """Check that a runner can report to `tracker`; say whether it takes artifacts too.

    `tracker` needs a `log_metrics` that takes a `step` keyword. It takes artifacts
    (records and previews) when it also has a `log_artifact` that takes `step`; without
    one, or with document 001's `log_artifact(name, value)`, it takes the scalars only
    (`ScalarTracker`): a runner skips its records and previews, and it turns no preview
    on.

    **Raises:** `TypeError` naming the tracker and the method it lacks.
    """
    described = f"tracker {tracker!r} of type {type(tracker).__name__}"
    log_metrics = getattr(tracker, "log_metrics", None)
    if not callable(log_metrics):
        raise TypeError(f"{described} has no log_metrics method; {_PROTOCOL}.")
    if not _takes_step(log_metrics):
        raise TypeError(f"{described}: its log_metrics takes no step keyword; {_PROTOCOL}.")
    log_artifact = getattr(tracker, "log_artifact", None)
    if log_artifact is not None and not callable(log_artifact):
        raise TypeError(f"{described}: its log_artifact is not a method; {_PROTOCOL}.")
    return log_artifact is not None and _takes_step(log_artifact)
