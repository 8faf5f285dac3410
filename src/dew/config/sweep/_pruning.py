"""Pruning a sweep's trials (decision 0055): the trial `sweep` is training, which its `train`
reports validation scores to, and the early stopper that reports them from `Trainer.fit` and
stops the fit when the search's pruner says so."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any, SupportsFloat

from dew._early_stopping import EarlyStopper, EarlyStoppingState
from dew.naming import Split


class TrialReports:
    """The trial `sweep` trains now: its `index`, the scores it reported (`reports`,
    `{step: value}`) and the step its pruner stopped it at (`pruned_at`, `None` while it
    trains on)."""

    def __init__(self, run: Any, index: int, direction: str = "minimize") -> None:
        self.run, self.index, self.direction = run, index, direction
        self.reports: dict[int, float] = {}
        self.pruned_at: int | None = None

    @property
    def prunes(self) -> bool:
        return bool(getattr(self.run, "prunes", False))

    def report(self, value: SupportsFloat, step: int) -> bool:
        """Report the trial's validation score at evaluation `step` to the search (Optuna's
        `trial.report`); True when its pruner stops the trial there (`trial.should_prune`),
        and from then on."""
        value = float(value)
        self.reports[int(step)] = value
        if self.pruned_at is None and self.run.report(self.index, int(step), value):
            self.pruned_at = int(step)
        return self.pruned_at is not None


_CURRENT: contextvars.ContextVar[TrialReports | None] = contextvars.ContextVar(
    "dew_sweep_trial", default=None
)


@contextlib.contextmanager
def training(run: Any, index: int, direction: str) -> Iterator[TrialReports]:
    """While `sweep` calls `train` for trial `index`: the trial `pruning_stopper` reports to."""
    trial = TrialReports(run, index, direction)
    token = _CURRENT.set(trial)
    try:
        yield trial
    finally:
        _CURRENT.reset(token)


@dataclasses.dataclass(frozen=True)
class PruningStopper(EarlyStopper):
    """An `EarlyStopper` that reports `metric` at every validation event to the sweep's
    trial and stops the fit when the pruner prunes it (its `best`, `best_step` and
    `improved` are kept as `EarlyStopper`'s, with `patience` unused). `pruning_stopper`
    makes one."""

    trial: TrialReports | None = None

    def update(
        self, state: EarlyStoppingState, value: SupportsFloat, *, step: int
    ) -> EarlyStoppingState:
        value = float(value)
        stop = self.trial is not None and self.trial.report(value, step)
        return dataclasses.replace(super().update(state, value, step=step), stop=stop)


def pruning_stopper(metric: str, *, mode: str | None = None) -> PruningStopper | None:
    """Inside a `sweep`'s `train` whose search has a pruner (`optuna_search(pruner=...)`):
    an early stopper for `Trainer.fit` or `RunConfig.train(early_stopper=...)` that reports
    the validation `metric` (a bare name) at every evaluation event to the trial and stops
    the fit, as early stopping does, when the pruner prunes it: its last checkpoint is
    saved, `fit` returns, and the sweep records the trial as pruned. `mode` is `"minimize"`
    or `"maximize"` (`"min"`, `"max"`; default: the sweep's direction). `None` outside such
    a sweep, so a `train` passes it whatever the search.

    ```python
    >>> print(pruning_stopper("loss"))  # not inside a sweep with a pruner
    None

    ```
    """
    trial = _CURRENT.get()
    if trial is None or not trial.prunes:
        return None
    if mode is None:
        mode = trial.direction
    return PruningStopper(metric=metric, mode=mode, source=Split.VALIDATION, trial=trial)
