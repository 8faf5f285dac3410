"""dew: a typed, functional JAX library for training, evaluating and tracking models.

The pure core (naming, events, records, metrics, objectives, steps) does the
numerical work; a thin shell (runners, trackers, sweeps, checkpoints) drives it.
Importing `dew` imports no optional extra, and no JAX: each name below imports its module
when it is first used (`dew.Trainer`, `from dew import metrics`), so the `dew` command's
`--help` and `dew runs` start without JAX; trackers import their extras when built.

Each public name has one home, the module whose reference page documents it (decision
0086). The guides' shortcuts, importable from `dew` too, are those homes' objects:

- `dew.Trainer`: [`dew.training.Trainer`][dew.training.Trainer]
- `dew.evaluate`: [`dew.evaluation.evaluate`][dew.evaluation.evaluate]
- `dew.Evaluation`: [`dew.evaluation.Evaluation`][dew.evaluation.Evaluation]
- `dew.load_run`: [`dew.config.load_run`][dew.config.load_run]
- `dew.LoadedRun`: [`dew.config.LoadedRun`][dew.config.LoadedRun]
- `dew.profile`: [`dew.profiling.profile`][dew.profiling.profile]
- `dew.Profile`: [`dew.profiling.Profile`][dew.profiling.Profile]
- `dew.Trackers`: [`dew.tracking.Trackers`][dew.tracking.Trackers]
- `dew.InMemoryTracker`: [`dew.tracking.InMemoryTracker`][dew.tracking.InMemoryTracker]
- `dew.LocalTracker`: [`dew.tracking.local.LocalTracker`][dew.tracking.local.LocalTracker]
- `dew.TensorBoardTracker`:
  [`dew.tracking.tensorboard.TensorBoardTracker`][dew.tracking.tensorboard.TensorBoardTracker]
- `dew.MLflowTracker`: [`dew.tracking.mlflow.MLflowTracker`][dew.tracking.mlflow.MLflowTracker]
- `dew.WandbTracker`: [`dew.tracking.wandb.WandbTracker`][dew.tracking.wandb.WandbTracker]
"""

from typing import TYPE_CHECKING

from dew._lazy import lazy_names

if TYPE_CHECKING:  # the names as type checkers, IDEs and the reference site see them
    from dew import events as events
    from dew import metrics as metrics
    from dew import naming as naming
    from dew import tracking as tracking
    from dew._version import __version__ as __version__
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

# Each public name and the module it comes from: a submodule is its own name's module.
_HOMES: dict[str, str] = {
    "Evaluation": "dew.evaluation",
    "InMemoryTracker": "dew.tracking",
    "LoadedRun": "dew.config._load",
    "LocalTracker": "dew.tracking",
    "MLflowTracker": "dew.tracking",
    "TensorBoardTracker": "dew.tracking",
    "Profile": "dew.profiling",
    "Trainer": "dew.training",
    "Trackers": "dew.tracking",
    "WandbTracker": "dew.tracking",
    "__version__": "dew._version",
    "evaluate": "dew.evaluation",
    "events": "dew.events",
    "load_run": "dew.config._load",
    "metrics": "dew.metrics",
    "profile": "dew.profiling",
    "naming": "dew.naming",
    "tracking": "dew.tracking",
}

# The submodules the guides reach through `dew`; the shortcuts in `_HOMES` are listed at
# their homes alone, so the reference shows each once.
__all__ = ["__version__", "events", "metrics", "naming", "tracking"]

__getattr__, __dir__ = lazy_names(__name__, _HOMES)
