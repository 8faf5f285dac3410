"""Training events: the one observation stream of a run.

A runner reports what happens during training as `TrainingEvent`s to any number
of `EventSink`s. `TrackerEventSink` is the adapter from events to a `Tracker`:
it turns each metric event into one `log_metrics` call under the metric tags
built by `dew.naming.metric_tag`, and does nothing else.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from dew._integers import check_integer
from dew.naming import Split, metric_tag
from dew.tracking._protocol import takes_artifacts

if TYPE_CHECKING:
    from dew.tracking import ScalarTracker

__all__ = ["Decision", "EventSink", "TrackerEventSink", "TrainingEvent"]

EPOCH_END = "epoch_end"
STEP_END = "step_end"
VALIDATION_END = "validation_end"
BEST_MODEL = "best_model"
EARLY_STOP = "early_stop"


@dataclasses.dataclass(frozen=True)
class Decision:
    """A judgement about a measurement already emitted: the monitored metric's
    bare name and its value at the event's step."""

    metric: str
    value: float


@dataclasses.dataclass(frozen=True)
class TrainingEvent:
    """A structured observation from a named point in a stage's lifecycle.

    **Fields:**

    - `name`: `epoch_end`, `step_end`, `validation_end`, `best_model`, `early_stop`, ...
    - `stage`: the stage that emitted it (the first segment of its metric tags).
    - `split`: the `Split` its metrics (or its decision's metric) were measured on.
    - `step`: the step (or epoch) of the stage, counted from zero by each stage.
    - `state`: the live training state. Sinks should only observe it.
    - `metrics`: bare metric name to value; empty for a decision event.
    - `decision`: the `Decision` of a decision event, else `None`.

    A decision event carries no metrics: constructing one with metrics raises.
    """

    name: str
    stage: str
    split: Split | str
    step: int
    state: Any = None
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    decision: Decision | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"event name must be a non-empty string, got {self.name!r}.")
        if not isinstance(self.split, Split):
            try:
                object.__setattr__(self, "split", Split(self.split))
            except ValueError:
                allowed = ", ".join(repr(s.value) for s in Split)
                raise ValueError(f"split {self.split!r} is not one of {allowed}.") from None
        object.__setattr__(self, "step", check_integer("event step", self.step, minimum=0))
        object.__setattr__(self, "metrics", dict(self.metrics))
        if self.decision is not None and self.metrics:
            raise ValueError(
                f"decision event {self.name!r} may not carry metrics, got {sorted(self.metrics)}; "
                "the measurement it judged travels in its decision."
            )


@runtime_checkable
class EventSink(Protocol):
    """Anything that watches a run: it receives every `TrainingEvent`."""

    def on_event(self, event: TrainingEvent) -> None:
        """Observe one event."""


def _scalar(value: Any) -> Any:
    if isinstance(value, numbers.Number):
        return value
    array = np.asarray(value)
    if array.shape != ():
        raise ValueError(f"metric values must be scalars, got an array of shape {array.shape}.")
    return array.item()


class TrackerEventSink:
    """The adapter from training events to a tracker.

    For each event with metrics it makes one `tracker.log_metrics` call whose
    keys are `metric_tag(event.stage, event.split, name)`, at `event.step`. A
    decision event logs nothing, so a measurement reaches the tracker once. It
    never calls `log_params` or `log_artifact`, so any tracker with
    `log_metrics(values, *, step)` will do (`dew.tracking.ScalarTracker`); anything
    else raises a `TypeError` naming it.

    ```python
    >>> from dew.tracking import InMemoryTracker
    >>> tracker = InMemoryTracker()
    >>> sink = TrackerEventSink(tracker)
    >>> event = TrainingEvent("epoch_end", "supervised", Split.TRAIN, 0, metrics={"loss": 0.5})
    >>> sink.on_event(event)
    >>> tracker.scalars
    {'supervised/train/loss': [(0, 0.5)]}

    ```
    """

    def __init__(self, tracker: ScalarTracker) -> None:
        takes_artifacts(tracker)  # a TypeError now for anything without log_metrics(step=)
        self.tracker = tracker

    def on_event(self, event: TrainingEvent) -> None:
        """Log the event's metrics as tags at `event.step`; a decision event logs nothing."""
        if event.decision is not None or not event.metrics:
            return
        values = {
            metric_tag(event.stage, event.split, name): _scalar(value)
            for name, value in event.metrics.items()
        }
        self.tracker.log_metrics(values, step=event.step)
