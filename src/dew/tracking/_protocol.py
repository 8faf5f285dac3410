"""The tracker protocol and the base every dew tracker builds on."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["AbstractTracker", "Tracker", "add_note_once"]

_T = TypeVar("_T", bound="AbstractTracker")


def add_note_once(error: BaseException, note: str) -> None:
    """Attach `note` to `error` unless it already carries it: an exception object raised
    again (a tracker that keeps failing with one instance) never collects copies."""
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)


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

    def log_params(self, values: Mapping[str, Any]) -> None: ...

    def log_metrics(self, values: Mapping[str, Any], *, step: int) -> None: ...

    def log_artifact(self, name: str, value: Any, *, step: int | None = None) -> None: ...

    def close(self) -> None: ...


class AbstractTracker(abc.ABC):
    """Base class that makes a tracker a context manager.

    Leaving the `with` block closes the tracker. When closing fails while
    another exception is already in flight, the original exception propagates
    and the closing failure is attached to it as a note; when nothing else
    failed, the closing failure is raised.

    ```python
    >>> from dew.tracking import InMemoryTracker
    >>> with InMemoryTracker() as tracker:
    ...     tracker.log_metrics({"lm/train/loss": 1.5}, step=0)
    >>> tracker.closed
    True

    ```
    """

    @abc.abstractmethod
    def log_params(self, values: Mapping[str, Any]) -> None:
        """Record a nested mapping of hyperparameters."""

    @abc.abstractmethod
    def log_metrics(self, values: Mapping[str, Any], *, step: int) -> None:
        """Record metric tag to scalar at `step`."""

    @abc.abstractmethod
    def log_artifact(self, name: str, value: Any, *, step: int | None = None) -> None:
        """Record a typed record, a preview artifact or another value."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release everything the tracker holds."""

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_error:
            add_note_once(
                exc,
                f"While handling this exception, closing {type(self).__name__} also failed: "
                f"{type(close_error).__name__}: {close_error}",
            )
