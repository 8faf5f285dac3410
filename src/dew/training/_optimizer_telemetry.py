"""`Trainer.fit(..., log_optimizer=True)`: where the logged learning rate comes from, checked
when the Trainer is built and when the fit starts, before any step (decision 0025)."""

import numbers

import jax
import optax

from dew.objectives.base import Objective
from dew.steps import LearningRate, find_learning_rate, no_learning_rate_error
from dew.training._compiled_step import Telemetry

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


def optimizer_telemetry(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    learning_rate: LearningRate | None,
    log_optimizer: object,
) -> Telemetry:
    """What the fit's compiled step logs of `optimizer` (`None`: nothing): `log_optimizer`,
    checked, with the Trainer's `learning_rate`. With `log_optimizer=True` and no learning
    rate to read (none given, and no `optax.inject_hyperparams` state), a `ValueError`
    saying how to give one."""
    if not isinstance(log_optimizer, bool):
        raise TypeError(f"log_optimizer must be True or False, got {log_optimizer!r}.")
    if not log_optimizer:
        return None
    if learning_rate is None:
        params = objective.init_params()
        opt_state = jax.eval_shape(optimizer.init, params)
        if find_learning_rate(opt_state, None) is None:
            raise no_learning_rate_error("the Trainer's optimizer state")
    return (learning_rate,)
