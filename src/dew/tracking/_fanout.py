"""Reporting to several trackers at once."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dew.naming import check_index
from dew.telemetry.records import Record
from dew.tracking._base import AbstractRunTracker
from dew.tracking._preview import Pieces
from dew.tracking._protocol import ScalarTracker, set_notes, takes_artifacts

__all__ = ["Trackers"]


class Trackers(AbstractRunTracker):
    """Fan every report out to several trackers.

    A tracker that only takes scalars (`dew.tracking.ScalarTracker`: `log_metrics`
    alone, or document 001's `log_artifact(name, value)` without a step) receives the
    metrics, and the parameters where it has `log_params`, but no artifact; anything
    without `log_metrics(values, *, step)` is refused with a `TypeError` naming it.

    Every tracker receives each report even if another one fails; after all were
    called, the first failure is raised (later failures are attached to it as
    notes, from this call only, however often one exception object is raised); a
    `KeyboardInterrupt` raised by one tracker still lets the others report, then it is
    raised ahead of any error. Closing closes every tracker the same way, once; a
    closed `Trackers` records nothing more. Leaving its `with` block on an exception
    leaves each tracker as if the block had been the tracker's own (its `__exit__` with
    that exception, where it has one, else `close()`), so MLflow and W&B end the run
    failed. There
    is no background queue: a report has reached every tracker when the call returns.
    A step that is not an integer >= 0, or an artifact name that is neither a preview
    name for a preview (`dew.naming.preview_name`) nor a path segment for anything else
    (`dew.naming.check_path_segment`), raises before any tracker is called.

    ```python
    >>> from dew.tracking import InMemoryTracker
    >>> first, second = InMemoryTracker(), InMemoryTracker()
    >>> with Trackers(first, second) as tracker:
    ...     tracker.log_metrics({"lm/train/loss": 1.0}, step=3)
    >>> first.scalars == second.scalars == {"lm/train/loss": [(3, 1.0)]}
    True

    ```
    """

    def __init__(self, *trackers: ScalarTracker) -> None:
        artifacts = [takes_artifacts(tracker) for tracker in trackers]  # raises for non-trackers
        self.trackers = trackers
        self._artifacts = [t for t, takes in zip(trackers, artifacts, strict=True) if takes]
        self._params = [t for t in trackers if callable(getattr(t, "log_params", None))]

    def _each(self, call: Callable[[Any], Any], trackers: Sequence[Any] | None = None) -> None:
        failures: list[BaseException] = []
        for tracker in self.trackers if trackers is None else trackers:
            try:
                call(tracker)
            except BaseException as failure:  # a Ctrl-C in one tracker too: the rest report
                failures.append(failure)
        if failures:
            # An interrupt (or SystemExit) outranks an error: it must stop the program.
            first = next((f for f in failures if not isinstance(f, Exception)), failures[0])
            notes = [
                f"Another tracker also failed: {type(later).__name__}: {later}"
                for later in failures
                if later is not first
            ]
            set_notes(first, f"Trackers {id(self)}", notes)
            raise first

    def _describe(self) -> str:
        return "Trackers"

    def _log_params(self, values: Mapping[str, Any]) -> None:
        self._each(lambda tracker: tracker.log_params(values), self._params)

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        checked = check_index("step", step)
        self._each(lambda tracker: tracker.log_metrics(values, step=checked))

    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        self._log_artifact(name, record, step=step)

    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        self._log_artifact(name, pieces.value, step=step)  # as logged: a Preview renders once

    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
        self._log_artifact(name, value, step=step)

    def _log_artifact(self, name: str, value: Any, *, step: int | None) -> None:
        self._each(lambda tracker: tracker.log_artifact(name, value, step=step), self._artifacts)

    def _close(self) -> None:
        leaving = self._leaving
        self._each(lambda tracker: _leave(tracker, leaving))


def _leave(tracker: Any, leaving: tuple[Any, BaseException, Any] | None) -> None:
    """Close `tracker`; while `leaving` (`__exit__`'s arguments) is in flight, through its
    own `__exit__` where it has one, so it marks its run failed (MLflow ends FAILED). A
    tracker with neither (a scalar-only one) has nothing to close."""
    leave = getattr(tracker, "__exit__", None)
    if leaving is not None and leave is not None:
        leave(*leaving)
    elif callable(getattr(tracker, "close", None)):
        tracker.close()
