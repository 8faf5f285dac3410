"""Experiment trackers: the `Tracker` protocol, its base classes and the trackers dew ships.

The trackers that write files or reach a service live in their own modules, where the
reference documents them: `dew.tracking.local.LocalTracker`,
`dew.tracking.tensorboard.TensorBoardTracker`, `dew.tracking.mlflow.MLflowTracker` and
`dew.tracking.wandb.WandbTracker`, each importing its extra only when constructed. They are
importable from `dew.tracking` too (and, as the dew guide does, from `dew` and
`dew.training`).
"""

from typing import TYPE_CHECKING

from dew._lazy import lazy_names

if TYPE_CHECKING:  # the names as type checkers, IDEs and the reference site see them
    from dew.tracking._base import AbstractRunTracker as AbstractRunTracker
    from dew.tracking._base import AbstractTracker as AbstractTracker
    from dew.tracking._fanout import Trackers as Trackers
    from dew.tracking._journal import Journal as Journal
    from dew.tracking._journal import read_journal as read_journal
    from dew.tracking._memory import InMemoryTracker as InMemoryTracker
    from dew.tracking._preview import Preview as Preview
    from dew.tracking._preview import preview_files as preview_files
    from dew.tracking._protocol import ScalarTracker as ScalarTracker
    from dew.tracking._protocol import Tracker as Tracker
    from dew.tracking.local import LocalTracker as LocalTracker
    from dew.tracking.mlflow import MLflowTracker as MLflowTracker
    from dew.tracking.tensorboard import TensorBoardTracker as TensorBoardTracker
    from dew.tracking.wandb import WandbTracker as WandbTracker

# The trackers of the modules below are importable here too, listed at their homes.
__all__ = [
    "AbstractRunTracker",
    "AbstractTracker",
    "InMemoryTracker",
    "Journal",
    "Preview",
    "ScalarTracker",
    "Tracker",
    "Trackers",
    "preview_files",
    "read_journal",
]

# Each public name and the module it comes from, imported when the name is first used.
_HOMES = {
    "AbstractRunTracker": "dew.tracking._base",
    "AbstractTracker": "dew.tracking._base",
    "Trackers": "dew.tracking._fanout",
    "Journal": "dew.tracking._journal",
    "read_journal": "dew.tracking._journal",
    "InMemoryTracker": "dew.tracking._memory",
    "Preview": "dew.tracking._preview",
    "preview_files": "dew.tracking._preview",
    "ScalarTracker": "dew.tracking._protocol",
    "Tracker": "dew.tracking._protocol",
    "LocalTracker": "dew.tracking.local",
    "MLflowTracker": "dew.tracking.mlflow",
    "TensorBoardTracker": "dew.tracking.tensorboard",
    "WandbTracker": "dew.tracking.wandb",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
