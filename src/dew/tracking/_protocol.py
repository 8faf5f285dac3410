"""The tracker protocol: what any tracker, dew's or a user's, provides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Tracker", "set_notes"]


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
