"""Reporting to several trackers at once."""

from collections.abc import Callable, Mapping
from typing import Any

from dew.naming import check_index, check_path_segment
from dew.tracking._base import AbstractRunTracker
from dew.tracking._protocol import Tracker, set_notes

__all__ = ["Trackers"]


class Trackers(AbstractRunTracker):
    """Fan every report out to several trackers.

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
    A step that is not an integer >= 0, or an artifact name that is not a path segment
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

    def __init__(self, *trackers: Tracker) -> None:
        for tracker in trackers:
            if not isinstance(tracker, Tracker):
                raise TypeError(
                    f"Trackers takes trackers (log_params, log_metrics, log_artifact, close), "
                    f"got {tracker!r} of type {type(tracker).__name__}."
                )
        self.trackers = trackers

    def _each(self, call: Callable[[Tracker], Any]) -> None:
        failures: list[BaseException] = []
        for tracker in self.trackers:
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
        self._each(lambda tracker: tracker.log_params(values))

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        checked = check_index("step", step)
        self._each(lambda tracker: tracker.log_metrics(values, step=checked))

    def _log_artifact(self, name: str, value: Any, *, step: Any) -> None:
        check_path_segment("artifact name", name)
        checked = None if step is None else check_index("step", step)
        self._each(lambda tracker: tracker.log_artifact(name, value, step=checked))

    def _close(self) -> None:
        leaving = self._leaving
        if leaving is None:
            self._each(lambda tracker: tracker.close())
        else:  # each tracker leaves as if the block had been its own: MLflow ends FAILED
            self._each(lambda tracker: _leave(tracker, leaving))


def _leave(tracker: Tracker, leaving: tuple[Any, BaseException, Any]) -> None:
    """Close `tracker` while `leaving` (`__exit__`'s arguments) is in flight: through its
    own `__exit__` where it has one, so it marks its run failed; else `close()`."""
    leave = getattr(tracker, "__exit__", None)
    if leave is None:
        tracker.close()
    else:
        leave(*leaving)
