"""The evaluation cadence: an evaluation event every `eval_every` steps, and the final
evaluation at the fit's last step when the cadence missed it."""

from collections.abc import Callable

from dew._loop import Callback, Loop
from dew.telemetry.records import Record
from dew.training._evaluation_event import SAMPLING_RECORD

__all__ = ["Evaluation"]


class Evaluation(Callback):
    """Run `event(loop, step)` (`evaluation_event`) every `every` steps (`None`: the fit does
    not evaluate) and, with `final`, at the fit's last step (`steps`, or the step an early
    stop ended it at) when the cadence missed it: before that step's checkpoint, so the
    saved early-stopping state has its verdict. `sampling` makes the objective's
    `SamplingProtocol` record, reported once when the fit starts."""

    def __init__(
        self,
        every: int | None,
        final: bool,
        event: Callable[[Loop, int], None],
        sampling: Callable[[], Record] | None = None,
    ) -> None:
        self.every = every
        self.final = final
        self.event = event
        self.sampling = sampling

    def on_fit_start(self, loop: Loop) -> None:
        if self.sampling is not None:  # its protocol, once per fit
            loop.record(SAMPLING_RECORD, self.sampling(), loop.start)

    def on_step(self, step: int, loop: Loop) -> None:
        self.event(loop, step)
