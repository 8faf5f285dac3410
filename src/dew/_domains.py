"""dew's fixed RNG domains and the keys a run derives from them.

Every key dew derives from another goes through `derive(key, DOMAIN, *counters)`: one fixed
domain constant folded into `key`, then the counters (a step, an epoch, a batch index, a
stage index) in a fixed order. The rule that keeps purposes apart: **a key receives either
domains or counters, never both.** A counter takes any value, so a key that received a
domain and also a counter would meet that domain's stream when the counter equals the
domain's value (as the evaluation event at step 1953 = `0x7A1` once drew its preview from
the key of training step 2542 = `0x9EE`). `derive` gives the key a domain leads to counters
only, and a key that receives domains (a seed, a run key, an event key) is never given a
counter directly. The domain values are all distinct, so one key reaching several runners
(a `Trainer`, `run_supervised`, `run_stages`, `evaluate`) still gives every purpose its own
stream. A key that is drawn from is derived from by nothing else.

The keys of a run (each name below is a function of this module):

    seed                                         jax.random.key(trainer.seed) of a recipe
    ├── model_key        MODEL_DOMAIN            the model's initialisation
    ├── objective_key    OBJECTIVE_DOMAIN        an objective builder's own (JEPA's predictor)
    └── run_key          RUN_DOMAIN              the Trainer's key, TrainState.key
        ├── train_step_key    TRAIN_STEP_DOMAIN, step    handed to the objective's loss
        │   └── (accumulate=k) split(it, k)[i]           micro-batch i's loss (dew._accumulate)
        └── evaluation_key    EVALUATION_DOMAIN, step    an evaluation event (and dew eval's)
            ├── scoring_key   SCORING_DOMAIN, batch      handed to the objective's evaluate
            └── preview_key   PREVIEW_DOMAIN             handed to its generate_preview
    run_stages' key
    └── stage_key        STAGE_DOMAIN, index      a stage's run_supervised state key
    run_supervised's state key
    ├── supervised_step_key        SUPERVISED_STEP_DOMAIN, step    handed to the loss
    └── supervised_validation_key  SUPERVISED_VALIDATION_DOMAIN, epoch   an event key:
                                                  scoring_key(it, batch) per batch

An objective owns the key it is handed and keeps the rule below it: it splits the key
(`jax.random.split(key, n)[i]` is the key counter `i` gives) or folds domains into it
(`DiffusionObjective` folds its preview domain and `Sampling.seed_domain`), never both.
`dew.objectives.lm.generate` (the language objectives' previews and GRPO's rollouts) only
splits: row `i` of a key draws from `split(key, rows)[i]`, and that row's token `t` from
`split(row key, max_new_tokens)[t]`.
`tests/test_domains.py` builds this whole tree over counters that take every domain's value
and checks that no two keys in it are equal. The tree is part of what makes a run
reproducible: changing a domain or the order of a derivation changes the numbers drawn.
"""

from typing import Any

import jax
from jaxtyping import PRNGKeyArray

__all__ = [
    "EVALUATION_DOMAIN",
    "MODEL_DOMAIN",
    "OBJECTIVE_DOMAIN",
    "PREVIEW_DOMAIN",
    "RUN_DOMAIN",
    "SCORING_DOMAIN",
    "STAGE_DOMAIN",
    "SUPERVISED_STEP_DOMAIN",
    "SUPERVISED_VALIDATION_DOMAIN",
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

# Under a recipe's seed key: the model's initialisation, an objective builder's own key
# (JEPA's predictor), and the run key.
MODEL_DOMAIN = 0
RUN_DOMAIN = 1
OBJECTIVE_DOMAIN = 0x0B1
# Under the run key: a Trainer step's key and an evaluation event's key, each then folded
# with the step number.
TRAIN_STEP_DOMAIN = 0x7A1
EVALUATION_DOMAIN = 0xE7A
# Under an evaluation event's key: scoring batch i (then folded with i), and the preview.
SCORING_DOMAIN = 0x5C0
PREVIEW_DOMAIN = 0x9EE
# Under run_supervised's state key: a step's key (then the step) and the validation key at
# the end of an epoch (then the epoch); under run_stages' key, a stage's (then its index).
SUPERVISED_STEP_DOMAIN = 0x5D1
SUPERVISED_VALIDATION_DOMAIN = 0x5FA
STAGE_DOMAIN = 0x57A

Counter = Any  # an int, or an integer array under jit (a traced step)


def derive(key: PRNGKeyArray, domain: int, *counters: Counter) -> PRNGKeyArray:
    """`domain` folded into `key`, then each of `counters` in order: the one way dew derives
    a key from another (see the module's rule: `key` receives domains only).

    **Arguments:**

    - `key`: a typed key (`jax.random.key`), one that receives domains only.
    - `domain`: one of this module's constants, or an objective's own (`Sampling.seed_domain`).
    - `counters`: ints, or integer arrays under `jax.jit` (a traced step).
    """
    key = jax.random.fold_in(key, domain)
    for counter in counters:
        key = jax.random.fold_in(key, counter)
    return key


def model_key(seed: PRNGKeyArray) -> PRNGKeyArray:
    """A recipe's model initialisation key, from its seed key."""
    return derive(seed, MODEL_DOMAIN)


def objective_key(seed: PRNGKeyArray) -> PRNGKeyArray:
    """The key a recipe's objective builder initialises itself from (JEPA's predictor)."""
    return derive(seed, OBJECTIVE_DOMAIN)


def run_key(seed: PRNGKeyArray) -> PRNGKeyArray:
    """A recipe's run key (the Trainer's `key`, `TrainState.key`), from its seed key."""
    return derive(seed, RUN_DOMAIN)


def train_step_key(key: PRNGKeyArray, step: Counter) -> PRNGKeyArray:
    """The key a `Trainer` step at `step` trains with, from the run key."""
    return derive(key, TRAIN_STEP_DOMAIN, step)


def evaluation_key(key: PRNGKeyArray, step: Counter) -> PRNGKeyArray:
    """The key of the evaluation event at `step` (the Trainer's and `dew eval`'s), from the
    run key."""
    return derive(key, EVALUATION_DOMAIN, step)


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
    state's key; the validation pass scores batch `i` with `scoring_key(it, i)`."""
    return derive(key, SUPERVISED_VALIDATION_DOMAIN, epoch)


def stage_key(key: PRNGKeyArray, index: Counter) -> PRNGKeyArray:
    """The state key of stage `index` of `run_stages`, from its key."""
    return derive(key, STAGE_DOMAIN, index)
