"""dew's fixed RNG domains and the keys a run derives from them: every key a runner derives
goes through one of the functions below, so draws of different purposes never share a key
stream, whatever else a run does. They are part of what makes a run reproducible: changing
one changes the numbers drawn."""

from typing import Any

import jax
from jaxtyping import PRNGKeyArray

__all__ = [
    "MODEL_DOMAIN",
    "OBJECTIVE_DOMAIN",
    "PREVIEW_DOMAIN",
    "RUN_DOMAIN",
    "SCORING_DOMAIN",
    "SUPERVISED_STEP_DOMAIN",
    "TRAIN_STEP_DOMAIN",
    "derive",
    "evaluation_key",
    "model_key",
    "objective_key",
    "preview_key",
    "run_key",
    "scoring_key",
    "stage_key",
    "supervised_step_key",
    "supervised_validation_key",
    "train_step_key",
]

# A recipe's seed key: the model's initialisation and the run key.
MODEL_DOMAIN = 0
RUN_DOMAIN = 1
# Under the model key: what an objective builder initialises itself (JEPA's predictor).
OBJECTIVE_DOMAIN = 0x0B1
# Under the run key: a Trainer step's key (then folded with the step number), and a
# run_supervised step's key (the same, a separate stream).
TRAIN_STEP_DOMAIN = 0x7A1
SUPERVISED_STEP_DOMAIN = 0x5D1
# Under an evaluation event's key: scoring batch i (then folded with i), and previews.
SCORING_DOMAIN = 0x5C0
PREVIEW_DOMAIN = 0x9EE

Counter = Any  # an int, or an integer array under jit (a traced step)


def derive(key: PRNGKeyArray, domain: int, *counters: Counter) -> PRNGKeyArray:
    """`domain` folded into `key`, then each of `counters` in order."""
    key = jax.random.fold_in(key, domain)
    for counter in counters:
        key = jax.random.fold_in(key, counter)
    return key


def model_key(seed: PRNGKeyArray) -> PRNGKeyArray:
    """A recipe's model initialisation key, from its seed key."""
    return derive(seed, MODEL_DOMAIN)


def objective_key(seed: PRNGKeyArray) -> PRNGKeyArray:
    """The key a recipe's objective builder initialises itself from (JEPA's predictor)."""
    return derive(model_key(seed), OBJECTIVE_DOMAIN)


def run_key(seed: PRNGKeyArray) -> PRNGKeyArray:
    """A recipe's run key (the Trainer's `key`, `TrainState.key`), from its seed key."""
    return derive(seed, RUN_DOMAIN)


def train_step_key(key: PRNGKeyArray, step: Counter) -> PRNGKeyArray:
    """The key a `Trainer` step at `step` trains with, from the run key."""
    return derive(key, TRAIN_STEP_DOMAIN, step)


def evaluation_key(key: PRNGKeyArray, step: Counter) -> PRNGKeyArray:
    """The key of the evaluation event at `step` (the Trainer's and `dew eval`'s), from the
    run key."""
    return jax.random.fold_in(key, step)


def scoring_key(key: PRNGKeyArray, batch_index: Counter) -> PRNGKeyArray:
    """The key batch `batch_index` of a pass is scored with, in the scoring domain."""
    return derive(key, SCORING_DOMAIN, batch_index)


def preview_key(key: PRNGKeyArray) -> PRNGKeyArray:
    """The key an evaluation event's preview is generated with, from the event key."""
    return derive(key, PREVIEW_DOMAIN)


def supervised_step_key(key: PRNGKeyArray, step: Counter) -> PRNGKeyArray:
    """The key a `run_supervised` step at `step` trains with, from the state's key."""
    return derive(key, SUPERVISED_STEP_DOMAIN, step)


def supervised_validation_key(key: PRNGKeyArray, epoch: Counter) -> PRNGKeyArray:
    """The key `run_supervised`'s validation at the end of `epoch` scores with, from the
    state's key."""
    return jax.random.fold_in(key, epoch)


def stage_key(key: PRNGKeyArray, index: Counter) -> PRNGKeyArray:
    """The state key of stage `index` of `run_stages`, from its key."""
    return jax.random.fold_in(key, index)
