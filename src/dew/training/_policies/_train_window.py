"""The training window's reports: every `log_every` steps, the window's metrics fetched in one
call and reported (`step_end`, `<stage>/train/<metric>`) with the training speed since the last
report (`examples_per_second`, `tokens_per_second`, `mfu`: decision 0080)."""

from typing import Any

from dew._loop import Callback, Loop
from dew.events import STEP_END
from dew.naming import Split
from dew.training._throughput import Throughput
from dew.training._window import WindowedCalls

__all__ = ["TrainingReport"]


class TrainingReport(Callback):
    """Report the training window every `every` steps (`WindowedCalls.values`: its means, or
    the log step's values) and, with `throughput`, the speed of the window's steps; the
    batches drawn since the last fetch (`unsynced`, kept to explain a failed step, and
    counted for the speed) are then known good."""

    def __init__(
        self,
        every: int,
        calls: WindowedCalls,
        unsynced: list[Any],
        throughput: Throughput | None = None,
    ) -> None:
        self.every = every
        self.calls = calls
        self.unsynced = unsynced
        self.throughput = throughput

    def on_step(self, step: int, loop: Loop) -> None:
        values = self.calls.values()  # the window's, then emptied: its steps have run
        if self.throughput is not None and self.calls.opened is not None:
            values.update(self.throughput.measured(self.calls.opened, self.unsynced))
        self.unsynced.clear()
        loop.report(STEP_END, Split.TRAIN, step, values)
