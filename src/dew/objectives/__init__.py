"""Objectives: Equinox modules that define how a model is trained, scored and previewed.

One module per objective family: `dew.objectives.lm`, `masked_diffusion`, `dpo`, `grpo`,
`supervised`, `classifier`, and the vision family `diffusion` (images and clips) and `jepa`.
"""

from dew.objectives.base import AbstractObjective as AbstractObjective
from dew.objectives.base import Objective as Objective

# The objective base is documented at its home, `dew.objectives.base`; importable here too.
__all__: list[str] = []
