"""dew: a typed, functional JAX library for training, evaluating and tracking models.

The pure core (naming, events, records, metrics, objectives, steps) does the
numerical work; a thin shell (runners, trackers, sweeps, checkpoints) drives it.
Importing `dew` imports no optional extra: trackers import theirs when built.
"""

from importlib import metadata as _metadata

from dew import events as events
from dew import metrics as metrics
from dew import naming as naming
from dew import tracking as tracking
from dew.config._load import LoadedRun as LoadedRun
from dew.config._load import load_run as load_run
from dew.evaluation import Evaluation as Evaluation
from dew.evaluation import evaluate as evaluate
from dew.profiling import Profile as Profile
from dew.profiling import profile as profile
from dew.tracking import InMemoryTracker as InMemoryTracker
from dew.tracking import LocalTracker as LocalTracker
from dew.tracking import MLflowTracker as MLflowTracker
from dew.tracking import TensorBoardTracker as TensorBoardTracker
from dew.tracking import Trackers as Trackers
from dew.tracking import WandbTracker as WandbTracker
from dew.training import Trainer as Trainer

try:
    __version__ = _metadata.version("dew-ml")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "Evaluation",
    "InMemoryTracker",
    "LoadedRun",
    "LocalTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "Profile",
    "Trainer",
    "Trackers",
    "WandbTracker",
    "__version__",
    "evaluate",
    "events",
    "load_run",
    "metrics",
    "profile",
    "naming",
    "tracking",
]
