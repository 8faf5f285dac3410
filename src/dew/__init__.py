"""dew: a typed, functional JAX library for training, evaluating and tracking models.

The pure core (naming, events, records, metrics, objectives, steps) does the
numerical work; a thin shell (runners, trackers, sweeps, checkpoints) drives it.
Importing `dew` imports no optional extra: trackers import theirs when built.
"""

from importlib import metadata as _metadata

from dew import events as events
from dew import naming as naming
from dew import tracking as tracking
from dew.tracking import InMemoryTracker as InMemoryTracker

try:
    __version__ = _metadata.version("dew-ml")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["InMemoryTracker", "__version__", "events", "naming", "tracking"]
