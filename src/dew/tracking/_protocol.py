"""The tracker protocol: what any tracker, dew's or a user's, provides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Tracker", "add_note_once", "same_failure"]


def add_note_once(error: BaseException, note: str) -> None:
    """Attach `note` to `error` unless it already carries it: an exception object raised
    again (a tracker that keeps failing with one instance) never collects copies."""
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)


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
