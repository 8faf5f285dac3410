"""The trainer and the callback protocol its loop asks.

The dew guide imports the trackers from here too: `LocalTracker`, `TensorBoardTracker`,
`MLflowTracker`, `WandbTracker`, `InMemoryTracker` and `Trackers` are `dew.tracking`'s
(decision 0086), documented there.
"""

from dew._interrupts import FitInterrupted as FitInterrupted
from dew._loop import Callback as Callback
from dew._loop import Loop as Loop
from dew._nonfinite import NonFiniteTrainingError as NonFiniteTrainingError
from dew.tracking import InMemoryTracker as InMemoryTracker
from dew.tracking import LocalTracker as LocalTracker
from dew.tracking import MLflowTracker as MLflowTracker
from dew.tracking import TensorBoardTracker as TensorBoardTracker
from dew.tracking import Trackers as Trackers
from dew.tracking import WandbTracker as WandbTracker
from dew.training._fit_options import FitOptions as FitOptions
from dew.training._trainer import Trainer as Trainer

# The trackers above are importable here for the guide; their home is dew.tracking.
__all__ = [
    "Callback",
    "FitInterrupted",
    "FitOptions",
    "Loop",
    "NonFiniteTrainingError",
    "Trainer",
]
