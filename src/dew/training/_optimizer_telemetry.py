"""`Trainer.fit(..., log_optimizer=True)`: where the logged learning rate comes from, checked
when the Trainer is built and when the fit starts, before any step (decision 0025)."""

import numbers
from typing import TYPE_CHECKING

import jax

from dew.steps import LearningRate, find_learning_rate, no_learning_rate_error
from dew.training._compiled_step import Telemetry

if TYPE_CHECKING:
    from dew.training._trainer import Trainer

__all__ = ["checked_learning_rate", "optimizer_telemetry"]


def checked_learning_rate(learning_rate: object) -> LearningRate | None:
    """Check a Trainer's `learning_rate`: `None`, a real number or a schedule (a callable
    of the update count)."""
    if learning_rate is None or callable(learning_rate):
        return learning_rate  # type: ignore[return-value]
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real):
        raise TypeError(
            "learning_rate must be None, a real number or an optax schedule (a callable of "
            f"the update count), got {learning_rate!r}."
        )
    return float(learning_rate)


def optimizer_telemetry(trainer: "Trainer", log_optimizer: object) -> Telemetry:
    """What the fit's compiled step logs of the optimizer (`None`: nothing); with
    `log_optimizer=True` and no learning rate to read, a `ValueError` saying how to give one."""
    if not isinstance(log_optimizer, bool):
        raise TypeError(f"log_optimizer must be True or False, got {log_optimizer!r}.")
    if not log_optimizer:
        return None
    if trainer.learning_rate is None:
        params = trainer.objective.init_params()
        opt_state = jax.eval_shape(trainer.optimizer.init, params)
        if find_learning_rate(opt_state, None) is None:
            raise no_learning_rate_error("the Trainer's optimizer state")
    return (trainer.learning_rate,)
