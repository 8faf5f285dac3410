"""The trainer, the callback protocol its loop asks, and the names the dew guide imports from
`dew.training`: the trackers."""

from dew._interrupts import FitInterrupted as FitInterrupted
from dew._loop import Callback as Callback
from dew._loop import Loop as Loop
from dew._loop import counts_line as counts_line
from dew._loop import verbose_console as verbose_console
from dew._nonfinite import NonFiniteTrainingError as NonFiniteTrainingError
from dew.tracking import InMemoryTracker as InMemoryTracker
from dew.tracking import LocalTracker as LocalTracker
from dew.tracking import MLflowTracker as MLflowTracker
from dew.tracking import TensorBoardTracker as TensorBoardTracker
from dew.tracking import Trackers as Trackers
from dew.tracking import WandbTracker as WandbTracker
from dew.training._fit_options import FitOptions as FitOptions
from dew.training._trainer import Trainer as Trainer
from dew.training._trainer import key_text as key_text

__all__ = [
    "Callback",
    "FitInterrupted",
    "FitOptions",
    "InMemoryTracker",
    "LocalTracker",
    "Loop",
    "MLflowTracker",
    "NonFiniteTrainingError",
    "TensorBoardTracker",
    "Trackers",
    "Trainer",
    "WandbTracker",
    "counts_line",
    "key_text",
    "verbose_console",
]
