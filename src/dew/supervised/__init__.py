"""Supervised training: `run_supervised`, validation, early stopping and their pieces."""

from dew._early_stopping import EarlyStopper as EarlyStopper
from dew._early_stopping import EarlyStoppingState as EarlyStoppingState
from dew.supervised._runner import Batch as Batch
from dew.supervised._runner import HeldOutValidation as HeldOutValidation
from dew.supervised._runner import Optimizer as Optimizer
from dew.supervised._runner import create_optimizer as create_optimizer
from dew.supervised._runner import initialize_training_state as initialize_training_state
from dew.supervised._runner import run_supervised as run_supervised
from dew.supervised._stages import GammaVarianceStage as GammaVarianceStage
from dew.supervised._stages import GaussianValidation as GaussianValidation
from dew.supervised._stages import MeanStage as MeanStage
from dew.supervised._stages import gamma_variance_nll as gamma_variance_nll
from dew.supervised._stages import positive_variance as positive_variance
from dew.supervised._stages import run_stages as run_stages

__all__ = [
    "Batch",
    "EarlyStopper",
    "EarlyStoppingState",
    "GammaVarianceStage",
    "GaussianValidation",
    "HeldOutValidation",
    "MeanStage",
    "Optimizer",
    "create_optimizer",
    "gamma_variance_nll",
    "initialize_training_state",
    "positive_variance",
    "run_stages",
    "run_supervised",
]
