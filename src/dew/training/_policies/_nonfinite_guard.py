"""The non-finite guard (`on_nonfinite="raise"`): a training loss that turns NaN or infinite
at a log step stops the fit, and no state whose loss or params are non-finite is saved or
returned."""

from collections.abc import Mapping

from dew._finite_params import check_params
from dew._loop import Callback, Loop
from dew._nonfinite import check_loss
from dew.naming import Split
from dew.training._window import WindowedCalls

__all__ = ["NonFiniteGuard"]


class NonFiniteGuard(Callback):
    """Look at the training loss of every training report (`on_evaluation`, after the
    report is shown: the non-finite value is reported, then raises), and `verify` a step's
    loss and params before its state is saved (`Checkpointing`) or returned (`on_fit_end`).
    Other steps are not looked at: they pay no device fetch. With `raising=False` it only
    keeps count."""

    every = None

    def __init__(self, raising: bool, start: int, calls: WindowedCalls) -> None:
        self.raising = raising
        self.start = start
        self.calls = calls
        self.seen = start  # the last step whose training loss was looked at
        self.verified = start  # the last step whose loss and params were checked before a save

    def on_evaluation(
        self, step: int, split: Split, values: Mapping[str, float], loop: Loop
    ) -> None:
        if split is Split.TRAIN and "loss" in values:
            self.look(step, values)

    def on_fit_end(self, loop: Loop) -> None:
        self.verify(loop.step, loop)  # the state fit returns is checked like a saved one

    def look(self, step: int, values: Mapping[str, float]) -> None:
        """Raise when `step`'s training loss is not finite (with `raising`)."""
        if self.raising:
            seen = self.seen
            note = f" (finite at step {seen}, the last step looked at)" if seen > self.start else ""
            check_loss(values["loss"], step, note=note)
        self.seen = step

    def verify(self, step: int, loop: Loop) -> None:
        """Before `step`'s state is saved or returned: its loss and params are finite."""
        if not self.raising or self.verified == step:
            return
        loss = self.calls.loss()  # the last step's (fetched when no log step has)
        if loss is None:  # no step ran in this fit
            return
        if self.seen != step:  # a checkpoint step that is not a log step fetches the loss
            self.look(step, {"loss": loss})
        state = loop.current()
        check_params((state.params, state.ema_params), step, loss=loss)
        self.verified = step
