"""The checkpoint cadence: a save submitted every `checkpoint_every` steps and at the end,
and the save of the last completed step on Ctrl-C."""

import dataclasses
from typing import TYPE_CHECKING, Any

from dew._interrupts import FitInterrupted
from dew._loop import Callback, Loop
from dew._processes import is_multiprocess
from dew.telemetry.records import CheckpointRequested
from dew.training._policies._nonfinite_guard import NonFiniteGuard

if TYPE_CHECKING:
    from dew.checkpoints import Checkpointer

__all__ = ["Checkpointing"]


class Checkpointing(Callback):
    """Save the loop's state to `checkpoints` (`None`: the fit saves nothing) every `every`
    steps and once more at the end (`on_fit_end`, then wait for every save), each after the
    guard's `verify`; with it the step the data iterator started at (`data_start`) and the
    early stopper's state. `interrupted` saves the last completed step on Ctrl-C."""

    def __init__(
        self,
        checkpoints: "Checkpointer | None",
        every: int | None,
        data_start: int,
        guard: NonFiniteGuard,
        resumed: bool,
    ) -> None:
        self.checkpoints = checkpoints
        self.every = every if checkpoints is not None else None
        self.data_start = data_start
        self.guard = guard
        self.resumed = resumed  # restored from a checkpoint
        self.saved: int | None = None  # the step of the last save
        self.saving: int | None = None  # the step of the last save begun (Ctrl-C may cut it)

    def on_fit_start(self, loop: Loop) -> None:
        if self.checkpoints is not None and loop.start > 0:
            self.saved = self.saving = loop.start
        if loop.progress and self.resumed and self.checkpoints is not None:
            loop.print(f"resuming at step {loop.start} from {self.checkpoints.directory}")

    def on_step(self, step: int, loop: Loop) -> None:
        self.save(step, loop)

    def on_fit_end(self, loop: Loop) -> None:
        if self.checkpoints is None:
            return
        if self.saved != int(loop.current().step):
            self.save(int(loop.current().step), loop)
        self.checkpoints.wait()  # a failed save ends the fit as failed, not completed

    def save(self, step: int, loop: Loop) -> None:
        """Submit the save of `step`'s state and report `CheckpointRequested`."""
        assert self.checkpoints is not None
        self.guard.verify(step, loop)
        self.saving = step
        extra: dict[str, Any] = {"data_start": self.data_start}
        if loop.stopping is not None:
            extra["early_stopping"] = dataclasses.asdict(loop.stopping)
        self.checkpoints.save(step, loop.state(), extra)
        self.saved = step
        requested = CheckpointRequested(step=step, directory=self.checkpoints.directory)
        loop.record("checkpoint_requested", requested, step)

    def interrupted(self, step: int, loop: Loop) -> FitInterrupted:
        """Ctrl-C: save the last completed step (one process: several cannot agree on a
        step without a collective that may hang), then say where a new fit resumes."""
        if self.checkpoints is None or self.saving == step or is_multiprocess() or step == 0:
            return FitInterrupted(step, None if self.saving != self.saved else self.saved)
        try:
            self.save(step, loop)
        except KeyboardInterrupt:  # a second Ctrl-C: leave without this save
            return FitInterrupted(step, None)
        return FitInterrupted(step, step)
