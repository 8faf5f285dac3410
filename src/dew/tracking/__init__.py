"""Experiment trackers: the `Tracker` protocol, its base class and the trackers dew ships.

Concrete trackers for TensorBoard, MLflow and W&B live in their own modules and
import their extra only when constructed.
"""

from dew.tracking._memory import InMemoryTracker as InMemoryTracker
from dew.tracking._protocol import AbstractTracker as AbstractTracker
from dew.tracking._protocol import Tracker as Tracker

__all__ = ["AbstractTracker", "InMemoryTracker", "Tracker"]
