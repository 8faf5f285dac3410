"""Early stopping on one monitored metric."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import SupportsFloat

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

    - `metric`: the monitored metric's bare name (`loss`), never a tag.
    - `mode`: `"min"` when lower is better, `"max"` when higher is better.
    - `patience`: how many consecutive updates without improvement are tolerated;
      the next one stops. `patience=0` stops at the first update that does not improve.
    - `source`: the `Split` the metric is read from (validation by default).
    - `min_delta`: how much a value must beat the best by to count as improving.

    A non-finite value (NaN) never improves.

    ```python
    >>> stopper = EarlyStopper(metric="loss", mode="min", patience=1)
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

    metric: str
    mode: str = "min"
    patience: int = 0
    source: Split | str = Split.VALIDATION
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        check_metric_name(self.metric)
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode {self.mode!r} is not one of 'min', 'max'.")
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

    def init(self) -> EarlyStoppingState:
        """The state before any measurement."""
        return EarlyStoppingState()

    def improves(self, value: float, best: float | None) -> bool:
        """Whether `value` improves on `best` under this stopper's mode and min_delta."""
        if not math.isfinite(value) and not (math.isinf(value) and self._better_inf(value)):
            return False
        if best is None:
            return True
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta

    def _better_inf(self, value: float) -> bool:
        return (value < 0) if self.mode == "min" else (value > 0)

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
