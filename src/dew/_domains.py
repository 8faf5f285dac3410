"""dew's fixed RNG domains: every key a runner derives is `fold_in(key, DOMAIN)` for one
of these, so draws of different purposes never share a key stream, whatever else a run does.
They are part of what makes a run reproducible: changing one changes the numbers drawn."""

__all__ = [
    "MODEL_DOMAIN",
    "OBJECTIVE_DOMAIN",
    "PREVIEW_DOMAIN",
    "RUN_DOMAIN",
    "SCORING_DOMAIN",
    "SUPERVISED_STEP_DOMAIN",
    "TRAIN_STEP_DOMAIN",
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
