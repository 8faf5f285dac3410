"""The training window's reports: every `log_every` steps, the window's metrics fetched in one
call and reported (`step_end`, `<stage>/train/<metric>`)."""

from typing import Any

from dew._loop import Callback, Loop
from dew.events import STEP_END
from dew.naming import Split
from dew.training._window import WindowedCalls

__all__ = ["TrainingReport"]


class TrainingReport(Callback):
    """Report the training window every `every` steps (`WindowedCalls.values`: its means, or
    the log step's values); the batches drawn since the last fetch (`unsynced`, kept to
    explain a failed step) are then known good."""

    def __init__(self, every: int, calls: WindowedCalls, unsynced: list[Any]) -> None:
        self.every = every
        self.calls = calls
        self.unsynced = unsynced

    def on_step(self, step: int, loop: Loop) -> None:
        values = self.calls.values()  # the window's, then emptied
        self.unsynced.clear()
        loop.report(STEP_END, Split.TRAIN, step, values)
