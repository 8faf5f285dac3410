"""Which way a metric is better: the one vocabulary of dew's knobs, and the rule that guesses
it from a bare name where no metric declared one (decision 0064).

A direction is `"minimize"` (lower is better: losses, perplexity, errors, FID) or
`"maximize"` (higher is better: accuracies, PSNR, CLIP score); `None` says neither is (a
statistic best near the data's own value). The knobs that take one (`sweep(direction=...)`,
`optuna_search(direction=...)`, `EarlyStopper(mode=...)`) also read `"min"` and `"max"`, the
early stopper's spelling before these were one vocabulary.

```python
>>> check_direction("max", "mode")
'maximize'
>>> guessed_direction("token_accuracy"), guessed_direction("perplexity")
('maximize', 'minimize')

```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ALLOWED",
    "DIRECTIONS",
    "MAXIMIZE",
    "MINIMIZE",
    "canonical_direction",
    "check_direction",
    "direction_of",
    "guessed_direction",
]

MINIMIZE = "minimize"
MAXIMIZE = "maximize"
DIRECTIONS = (MINIMIZE, MAXIMIZE)
_SHORT = {"min": MINIMIZE, "max": MAXIMIZE}
ALLOWED = "'minimize', 'maximize' (or 'min', 'max')"
"""The allowed spellings, as the errors name them."""


def canonical_direction(value: Any) -> str | None:
    """`value` as `"minimize"` or `"maximize"` (`"min"`, `"max"` read as them); `None`
    for anything else."""
    if not isinstance(value, str):
        return None
    return value if value in DIRECTIONS else _SHORT.get(value)


def check_direction(value: Any, what: str) -> str:
    """`value` as `"minimize"` or `"maximize"`; anything else raises a `ValueError` naming
    `what` (the knob) and the allowed spellings."""
    direction = canonical_direction(value)
    if direction is None:
        raise ValueError(f"{what} {value!r} is not one of {ALLOWED}.")
    return direction


_HIGHER_IS_BETTER = (
    "accuracy",
    "psnr",
    "ssim",
    "clip_score",
    "auc",
    "auroc",
    "f1",
    "precision",
    "recall",
    "per_second",
    "mfu",
)
"""Bare names containing one of these are guessed better higher; every other one lower."""

_NEAR_THE_DATA = ("foreground_fraction", "foreground_parts")
"""Bare names containing one of these, or starting with `real_` (the same statistic of the
real rows), are guessed better near the data's own value (`dew.metrics.shape_scores`)."""


def guessed_direction(bare: str) -> str | None:
    """The direction a bare metric name suggests, for a metric that declares none: a run
    recorded before metrics declared theirs, a training metric an objective reports (`loss`),
    or a `Metric` subclass that sets no `direction`. A name with `accuracy`, `psnr`, `ssim`,
    `clip_score`, `auc`, `f1`, `precision`, `recall`, `per_second` or `mfu` (the training
    throughput) in it is `"maximize"`; one starting
    with `real_` or holding `foreground_fraction` or `foreground_parts` has none (`None`);
    every other one (losses, perplexity, errors, FID, CRPS) is `"minimize"`."""
    if bare.startswith("real_") or any(word in bare for word in _NEAR_THE_DATA):
        return None
    return MAXIMIZE if any(word in bare for word in _HIGHER_IS_BETTER) else MINIMIZE


def direction_of(bare: str, declared: Mapping[str, str | None] | None = None) -> str | None:
    """The direction of the bare metric name `bare`: the one `declared` (bare name to
    direction, as a fit records its metrics') gives it, else the guess from its name."""
    if declared is not None and bare in declared:
        return declared[bare]
    return guessed_direction(bare)
