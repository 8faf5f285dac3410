"""Reporting to several trackers at once."""

from collections.abc import Callable, Mapping
from typing import Any

from dew.naming import check_index, check_path_segment
from dew.tracking._base import AbstractRunTracker
from dew.tracking._protocol import Tracker, add_note_once

__all__ = ["Trackers"]


class Trackers(AbstractRunTracker):
    """Fan every report out to several trackers.

    Every tracker receives each report even if another one fails; after all were
    called, the first failure is raised (later failures are attached to it as
    notes, each once, however often one exception object is raised). Closing closes
    every tracker the same way, once; a closed `Trackers` records nothing more. There
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
        failures: list[Exception] = []
        for tracker in self.trackers:
            try:
                call(tracker)
            except Exception as failure:
                failures.append(failure)
        if failures:
            first = failures[0]
            for later in failures[1:]:
                if later is not first:
                    add_note_once(
                        first, f"Another tracker also failed: {type(later).__name__}: {later}"
                    )
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
        self._each(lambda tracker: tracker.close())
