"""Supervised training: early stopping (the runner `run_supervised` follows)."""

from dew.supervised._early_stopping import EarlyStopper as EarlyStopper
from dew.supervised._early_stopping import EarlyStopping as EarlyStopping

__all__ = ["EarlyStopper", "EarlyStopping"]
