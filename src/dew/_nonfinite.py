"""What a training loop does when training turns non-finite (`on_nonfinite`).

Both runners look at the training loss only where they fetch it anyway (`Trainer.fit` at
its log steps, `run_supervised` at the end of each epoch) and at the params once before they save or
return a state (`dew._finite_params`, the guard's one part that computes), so a run that
diverged stops with an error naming the step and the value instead of training on and
checkpointing NaN params (Keras calls this TerminateOnNaN).
"""

import contextlib
import contextvars
import math
from collections.abc import Iterator

__all__ = [
    "ON_NONFINITE",
    "NonFiniteTrainingError",
    "check_loss",
    "nonfinite_advice",
    "raises_on_nonfinite",
    "stopped",
]

ON_NONFINITE: tuple[str, ...] = ("raise", "continue")
_ADVICE = contextvars.ContextVar("dew_nonfinite_advice", default="on_nonfinite='continue'")


@contextlib.contextmanager
def nonfinite_advice(switch: str) -> Iterator[None]:
    """Within this block, the error of a run that turned non-finite tells the user to pass
    `switch` to train on (the `dew` command's `--on-nonfinite continue`) instead of the
    Python argument `on_nonfinite='continue'`."""
    token = _ADVICE.set(switch)
    try:
        yield
    finally:
        _ADVICE.reset(token)


class NonFiniteTrainingError(ValueError):
    """Training turned non-finite (a NaN or infinite loss, or parameters) and the run
    stopped (`on_nonfinite="raise"`). A sweep's trial function can catch it to score
    the trial NaN, as `dew sweep` does."""


def raises_on_nonfinite(on_nonfinite: object) -> bool:
    """Check an `on_nonfinite` argument; `True` when non-finite training must raise."""
    if not isinstance(on_nonfinite, str) or on_nonfinite not in ON_NONFINITE:
        allowed = " or ".join(repr(value) for value in ON_NONFINITE)
        raise ValueError(f"on_nonfinite must be {allowed}, got {on_nonfinite!r}.")
    return on_nonfinite == "raise"


def stopped(what: str) -> NonFiniteTrainingError:
    """The error of a run that stopped because `what` turned non-finite (`"training loss is
    nan at step 3"`): it says the state was neither saved nor returned, and how to train on."""
    return NonFiniteTrainingError(
        f"{what}; the run stopped there, before saving or returning that state; "
        f"pass {_ADVICE.get()} to train on."
    )


def check_loss(loss: float, step: int, *, note: str = "") -> None:
    """Raise a `ValueError` naming `step` and `loss` when the training loss is not finite."""
    if not math.isfinite(loss):
        raise stopped(f"training loss is {loss} at step {step}{note}")
