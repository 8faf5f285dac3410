"""`Trainer.fit`'s options: the keywords past its cadences, metrics, tracker, callbacks and
state, each with its default (decision 0066)."""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from dew._early_stopping import EarlyStopper
from dew.events import EventSink
from dew.profiling import Profile

__all__ = ["FitOptions", "Options", "fit_options"]


class FitOptions(TypedDict, total=False):
    """The options `Trainer.fit` takes as keywords besides its cadences (`log_every`,
    `eval_every`, `checkpoint_every`), `metrics`, `tracker`, `callbacks` and `state`;
    `Trainer.fit`'s docstring says what each does."""

    preview: bool
    progress: bool
    final_eval: bool
    early_stopper: EarlyStopper | None
    event_sinks: Sequence[EventSink]
    profile: Profile | None
    steps_per_call: int
    on_nonfinite: str
    train_reduction: str
    log_optimizer: bool
    accumulate: int
    log_throughput: bool


@dataclasses.dataclass(frozen=True)
class Options:
    """A fit's options, every one given or defaulted; each is checked where the fit uses
    it (the errors name the keyword), so the fields take any value here."""

    preview: Any = False
    progress: Any = True
    final_eval: Any = True
    early_stopper: Any = None
    event_sinks: Any = ()
    profile: Any = None
    steps_per_call: Any = 1
    on_nonfinite: Any = "raise"
    train_reduction: Any = "mean"
    log_optimizer: Any = False
    accumulate: Any = 1
    log_throughput: Any = False


_NAMES = tuple(field.name for field in dataclasses.fields(Options))


def fit_options(given: Mapping[str, Any]) -> Options:
    """The options of one `fit` call; an unknown keyword is a `TypeError` naming it and
    the options `fit` takes (as Python names an unexpected keyword argument)."""
    for name in given:
        if name not in _NAMES:
            raise TypeError(
                f"Trainer.fit() got an unexpected keyword argument {name!r}; besides data, "
                "steps, log_every, eval_every, checkpoint_every, metrics, tracker, callbacks "
                f"and state it takes {', '.join(_NAMES)}."
            )
    return Options(**given)
