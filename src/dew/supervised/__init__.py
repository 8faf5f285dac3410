"""Supervised training: `run_supervised`, validation, early stopping and their pieces."""

from dew.supervised._early_stopping import EarlyStopper as EarlyStopper
from dew.supervised._early_stopping import EarlyStopping as EarlyStopping
from dew.supervised._runner import Batch as Batch
from dew.supervised._runner import HeldOutValidation as HeldOutValidation
from dew.supervised._runner import Optimizer as Optimizer
from dew.supervised._runner import create_optimizer as create_optimizer
from dew.supervised._runner import initialize_training_state as initialize_training_state
from dew.supervised._runner import run_supervised as run_supervised

__all__ = [
    "Batch",
    "EarlyStopper",
    "EarlyStopping",
    "HeldOutValidation",
    "Optimizer",
    "create_optimizer",
    "initialize_training_state",
    "run_supervised",
]
