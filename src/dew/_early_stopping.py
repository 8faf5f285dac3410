"""Early stopping on one monitored metric."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, SupportsFloat

from dew._directions import MAXIMIZE, MINIMIZE, check_direction, direction_of
from dew._integers import check_integer
from dew.naming import Split, check_metric_name

__all__ = ["EarlyStopper", "EarlyStoppingState"]


@dataclasses.dataclass(frozen=True)
class EarlyStoppingState:
    """The early stopper's state after some updates.

    - `best`: the best value seen so far (`None` before the first update).
    - `best_step`: the step at which `best` was measured.
    - `waited`: consecutive updates since the last improvement.
    - `improved`: whether the latest update improved on `best`.
    - `stop`: whether training should stop after the latest update.
    """

    best: float | None = None
    best_step: int | None = None
    waited: int = 0
    improved: bool = False
    stop: bool = False


@dataclasses.dataclass(frozen=True)
class EarlyStopper:
    """Stop when a monitored metric has not improved for more than `patience` updates.

    **Arguments:**

    - `metric`: the monitored metric's bare name (`loss`), never a tag; or the metric
      itself (`metrics.accuracy()`), whose name and direction it takes.
    - `mode`: `"minimize"` when lower is better, `"maximize"` when higher is better
      (`"min"`, `"max"` read as them); `None` (default): the metric's own direction, as
      the metric given declares it, or, for a bare name, as the fit's metric of that name
      declares it (`Trainer.fit` tells the stopper), else as its name suggests
      (`loss`: lower is better; decision 0064).
    - `patience`: how many consecutive updates without improvement are tolerated;
      the next one stops. `patience=0` stops at the first update that does not improve.
    - `source`: the `Split` the metric is read from (validation by default).
    - `min_delta`: how much a value must beat the best by to count as improving.

    A non-finite value (NaN) never improves.

    ```python
    >>> stopper = EarlyStopper(metric="loss", mode="minimize", patience=1)
    >>> state = stopper.init()
    >>> for step, loss in enumerate([3.0, 2.0, 2.5, 2.4]):
    ...     state = stopper.update(state, loss, step=step)
    ...     print(step, state.improved, state.stop)
    0 True False
    1 True False
    2 False False
    3 False True

    ```
    """

    metric: str | Any
    mode: str | None = None
    patience: int = 0
    source: Split | str = Split.VALIDATION
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) and hasattr(self.metric, "direction"):
            declared = self.metric.direction  # a dew.metrics.Metric: its name and direction
            object.__setattr__(self, "metric", self.metric.name)
            if self.mode is None and declared is None:
                raise ValueError(
                    f"metric {self.metric!r} has no direction (it is best near the data's "
                    "own value); pass mode='minimize' or 'maximize'."
                )
            object.__setattr__(self, "mode", self.mode if self.mode is not None else declared)
        check_metric_name(self.metric)
        if self.mode is not None:
            object.__setattr__(self, "mode", check_direction(self.mode, "mode"))
        check_integer("patience", self.patience, minimum=0)
        try:
            object.__setattr__(self, "source", Split(self.source))
        except ValueError:
            allowed = ", ".join(repr(split.value) for split in Split)
            raise ValueError(f"source {self.source!r} is not one of {allowed}.") from None
        if not (isinstance(self.min_delta, numbers.Real) and self.min_delta >= 0):
            raise ValueError(f"min_delta must be a real number >= 0, got {self.min_delta!r}.")

    def monitored_metric_name(self) -> str:
        """The bare name of the monitored metric."""
        return self.metric

    @property
    def direction(self) -> str:
        """`mode`, or without one the direction the metric's name suggests (`loss`:
        `"minimize"`)."""
        return self.mode or direction_of(self.metric) or MINIMIZE

    def directed(self, directions: Mapping[str, str | None]) -> EarlyStopper:
        """This stopper with `mode` set from `directions` (bare name to direction, as a
        fit's metrics declare them) where it has none and they name its metric."""
        declared = directions.get(self.metric)
        if self.mode is not None or declared is None:
            return self
        return dataclasses.replace(self, mode=declared)

    def init(self) -> EarlyStoppingState:
        """The state before any measurement."""
        return EarlyStoppingState()

    def improves(self, value: float, best: float | None) -> bool:
        """Whether `value` improves on `best` under this stopper's mode and min_delta."""
        if not math.isfinite(value) and not (math.isinf(value) and self._better_inf(value)):
            return False
        if best is None:
            return True
        if self.direction == MINIMIZE:
            return value < best - self.min_delta
        return value > best + self.min_delta

    def _better_inf(self, value: float) -> bool:
        return (value > 0) if self.direction == MAXIMIZE else (value < 0)

    def update(
        self, state: EarlyStoppingState, value: SupportsFloat, *, step: int
    ) -> EarlyStoppingState:
        """Take the monitored metric's value at `step` and return the next state."""
        value = float(value)
        if self.improves(value, state.best):
            return EarlyStoppingState(
                best=value, best_step=step, waited=0, improved=True, stop=False
            )
        waited = state.waited + 1
        return dataclasses.replace(
            state, waited=waited, improved=False, stop=waited > self.patience
        )
