"""The base classes of trackers: a context manager, and the lifecycle of dew's own trackers."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import numpy as np

from dew.naming import check_index
from dew.telemetry.records import FitEnded, Record
from dew.tracking._preview import Pieces, check_artifact_name, is_preview
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
    calls the hooks a subclass fills in (`_log_params`, `_log_metrics`, `_close`, and for
    artifacts `_log_record`, `_log_preview`, `_log_value`). A subclass also says how the
    refusal names it (`_describe`). `_log_params` and `_log_metrics` get the arguments as
    given and check them (a step with `dew.naming.check_index`), so each tracker names a bad
    value in its own terms before it writes anything.

    `log_artifact` checks an artifact's name (`dew.tracking._preview.check_artifact_name`:
    a preview name for a preview, a path segment for anything else) and its step (an integer
    >= 0, or None) for every tracker, then sorts the artifact once:

    - a record (`dew.telemetry.records.Record`) goes to `_log_record(name, record, *, step)`;
    - a preview (an artifact, or a `dew.tracking.Preview` of one) to
      `_log_preview(name, pieces, *, step)`: `pieces` (`dew.tracking._preview.Pieces`) are
      the neutral pieces it renders to, rendered when first read, and `pieces.value` the
      preview as logged. Reading them refuses an artifact with no preview form with a
      `TypeError` that names the tracker's class and says it has no `_preview_form` form
      (`"preview"`; TensorBoard's is `"summary"`);
    - anything else to `_log_value(name, value, *, step)`.

    `step` is an `int`, or None when none was given. A tracker that keeps or forwards what
    it is told (`InMemoryTracker`, `Trackers`) takes `record`, `pieces.value` and `value`
    as they are.

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
    _preview_form: ClassVar[str] = "preview"
    """The word for what an artifact with no preview form lacks, in the tracker's refusal."""

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
    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        """Record a typed record (the tracker is open; `name` and `step` are checked)."""

    @abc.abstractmethod
    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        """Record a preview: its `pieces`, read before anything is written (reading them
        refuses an artifact with no preview form), or `pieces.value` as it was logged."""

    @abc.abstractmethod
    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
        """Record any other value (the tracker is open; `name` and `step` are checked)."""

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
        check_artifact_name(name, value)
        checked = None if step is None else check_index("step", step)
        if isinstance(value, Record):
            self._log_record(name, value, step=checked)
        elif is_preview(value):
            taker = f"{type(self).__name__} takes"
            pieces = Pieces(value, name, taker=taker, form=self._preview_form)
            self._log_preview(name, pieces, step=checked)
        else:
            self._log_value(name, value, step=checked)
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
