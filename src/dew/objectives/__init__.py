"""Objectives: Equinox modules that define how a model is trained, scored and previewed.

One module per objective family: `dew.objectives.lm`, `masked_diffusion`, `dpo`, `grpo`,
`supervised`, `classifier`, and the vision family `diffusion` (images and clips) and `jepa`.
"""

from dew.objectives.base import AbstractObjective as AbstractObjective
from dew.objectives.base import Objective as Objective

__all__ = ["AbstractObjective", "Objective"]
