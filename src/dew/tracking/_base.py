"""The base classes of trackers: a context manager, and the lifecycle of dew's own trackers."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from dew.telemetry.records import FitEnded
from dew.tracking._protocol import set_notes

__all__ = ["AbstractRunTracker", "AbstractTracker"]

_T = TypeVar("_T", bound="AbstractTracker")


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
            note = (
                f"While handling this exception, closing {type(self).__name__} also failed: "
                f"{type(close_error).__name__}: {close_error}"
            )
            set_notes(exc, f"closing {id(self)}", [note])


class AbstractRunTracker(AbstractTracker):
    """The lifecycle every tracker dew ships shares: open, then closed; failed or not.

    The four public methods are final: each refuses to run on a closed tracker, then
    calls the hook a subclass fills in (`_log_params`, `_log_metrics`, `_log_artifact`,
    `_close`). A subclass also says how the refusal names it (`_describe`). The hooks
    get the arguments as given and check them (a step with `dew.naming.check_index`,
    an artifact name with `dew.tracking._preview.check_artifact_name`), so each tracker
    names a bad value in its own terms before it writes anything.

    - `closed`: True once `close()` has run. Closing again does nothing; any other
      report raises `RuntimeError("<description> is closed; it records nothing more.")`.
    - `failed`: True once the tracker's `with` block raised, or once a `FitEnded`
      record with a status other than `completed` was logged. Trackers that end a run
      with a status (MLflow, W&B) read it in `_close`.

    Leaving the `with` block marks the run failed when an exception is in flight, then
    closes as `AbstractTracker` does (a closing failure never hides that exception);
    while that `_close` runs, `_leaving` holds the exception (`Trackers` hands it on).

    ```python
    >>> from dew.tracking import InMemoryTracker
    >>> tracker = InMemoryTracker()
    >>> try:
    ...     with tracker:
    ...         raise KeyboardInterrupt
    ... except KeyboardInterrupt:
    ...     pass
    >>> tracker.closed, tracker.failed
    (True, True)

    ```
    """

    _closed: bool = False
    _failed: bool = False
    _leaving: tuple[type[BaseException] | None, BaseException, TracebackType | None] | None = None
    """While `__exit__` closes on an exception: that exception, as `__exit__` got it."""

    @property
    def closed(self) -> bool:
        """Whether `close()` has run."""
        return self._closed

    @property
    def failed(self) -> bool:
        """Whether the run failed: its `with` block raised, or a failed `FitEnded` was logged."""
        return self._failed

    @abc.abstractmethod
    def _describe(self) -> str:
        """The tracker as a closed-tracker error names it (`LocalTracker('runs/x')`)."""

    @abc.abstractmethod
    def _log_params(self, values: Mapping[str, Any]) -> None:
        """Record a nested mapping of hyperparameters (the tracker is open)."""

    @abc.abstractmethod
    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        """Record metric tag to scalar at `step` (the tracker is open)."""

    @abc.abstractmethod
    def _log_artifact(self, name: str, value: Any, *, step: Any) -> None:
        """Record a typed record, a preview artifact or another value (the tracker is open)."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Flush and release everything; called once, by the first `close()`."""

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self._describe()} is closed; it records nothing more.")

    def log_params(self, values: Mapping[str, Any]) -> None:
        self._check_open()
        self._log_params(values)

    def log_metrics(self, values: Mapping[str, Any], *, step: int | np.integer) -> None:
        self._check_open()
        self._log_metrics(values, step=step)

    def log_artifact(self, name: str, value: Any, *, step: int | np.integer | None = None) -> None:
        self._check_open()
        self._log_artifact(name, value, step=step)
        if isinstance(value, FitEnded) and value.status != "completed":
            self._failed = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            super().__exit__(exc_type, exc, traceback)
            return
        self._failed = True
        self._leaving = (exc_type, exc, traceback)
        try:
            super().__exit__(exc_type, exc, traceback)
        finally:
            self._leaving = None
