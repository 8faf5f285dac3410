"""The early-stopping policy: an `EarlyStopper` consulted with each report of its split."""

from collections.abc import Mapping

from dew._early_stopping import EarlyStopper
from dew._loop._callback import Loop
from dew.events import BEST_MODEL, EARLY_STOP, Decision
from dew.naming import Split

__all__ = ["EarlyStopping"]


class EarlyStopping:
    """Consult `stopper` with the values of every report of its split (`on_evaluation`),
    emit its `best_model` and `early_stop` decisions, and stop the loop when it says so.
    Its state is the loop's `stopping` (saved in checkpoints and restored with them): a fit
    resumed from a stopped run stops before its first step."""

    every = None
    final = False

    def __init__(self, stopper: EarlyStopper) -> None:
        self.stopper = stopper

    def on_fit_start(self, loop: Loop) -> None:
        if loop.stopping is None:
            loop.stopping = self.stopper.init()
        if loop.stopping.stop:  # a stopped run, resumed: nothing to train
            loop.stop = True

    def on_step(self, step: int, loop: Loop) -> None:
        pass

    def on_evaluation(
        self, step: int, split: Split, values: Mapping[str, float], loop: Loop
    ) -> None:
        if self.update(loop, split, step, values):
            loop.stop = True

    def on_fit_end(self, loop: Loop) -> None:
        pass

    def update(self, loop: Loop, split: Split, step: int, values: Mapping[str, float]) -> bool:
        """Update the loop's stopping state with `split`'s values; emit the decisions;
        `True`: stop.

        A split the stopper does not watch, or a report with no values, decides nothing;
        values that lack the monitored metric are an error.
        """
        stopper = self.stopper
        if stopper.source != split or not values:
            return False
        metric = stopper.monitored_metric_name()
        if metric not in values:
            raise ValueError(
                f"the early stopper monitors {metric!r} on the {split.value} split, but "
                f"the {split.value} metrics are {sorted(values)}."
            )
        if loop.stopping is None:
            loop.stopping = stopper.init()
        loop.stopping = stopper.update(loop.stopping, values[metric], step=step)
        decision = Decision(metric, float(values[metric]))
        if loop.stopping.improved:
            loop.emit(BEST_MODEL, split, step, decision=decision)
        if loop.stopping.stop:
            loop.emit(EARLY_STOP, split, step, decision=decision)
        return loop.stopping.stop
