"""The policy protocol a loop asks at each step (`Callback`), and the view of the loop every
policy is handed (`Loop`): one shape for what a run has done so far.

`Trainer.fit` is a short loop (draw a batch, run the compiled step) that asks a list of
policies what to do: the training window's reports, the non-finite guard, early stopping,
evaluation, checkpoints, the profile window, then the user's own callbacks (decision 0066).
Each policy is one object with four hooks and a cadence, and talks to the loop only through
`Loop`: no policy reaches into the trainer.
"""

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dew.naming import Split

if TYPE_CHECKING:
    from dew._early_stopping import EarlyStoppingState
    from dew.steps import MetricHistory, TrainState
    from dew.telemetry.records import Record
    from dew.tracking import Tracker

__all__ = ["HOOKS", "Callback", "Loop"]

HOOKS = ("on_fit_start", "on_step", "on_evaluation", "on_fit_end")
"""The methods a callback has (each may do nothing)."""


@runtime_checkable
class Loop(Protocol):
    """What a callback sees of the fit that calls it.

    - `stage`: the first segment of every metric tag; `start`: the step the fit started
      at (a resumed fit's saved step); `steps`: the step it trains to; `step`: the last
      completed step; `precision`: the fit's precision policy (`Trainer(precision=...)`).
    - `stop`: set it to `True` to end the fit after this step (the step's remaining
      callbacks still run, then the fit saves its final checkpoint, as after an early stop).
    - `state()`: the `TrainState` now, with the metric history reported so far
      (`history`). Fetching its arrays waits for the device.
    - `report(name, split, step, values)`: report metrics (bare names) as the fit's own
      are: into the history, the printed line, the event sinks and the tracker, and to
      every callback's `on_evaluation`.
    - `print(line)`: print above the progress bar; `progress` says whether the fit prints.
    - `record(name, record, step)`: a typed record for the tracker (when it takes them).
    """

    stage: str
    start: int
    steps: int | None
    step: int
    precision: str
    stop: bool
    progress: bool
    history: "MetricHistory"
    stopping: "EarlyStoppingState | None"
    tracker: "Tracker | None"

    def state(self) -> "TrainState":
        """The `TrainState` now, with the metric history reported so far."""
        ...

    def current(self) -> "TrainState":
        """The `TrainState` now, its history left empty (the loop keeps the history)."""
        ...

    def report(
        self, name: str, split: Split, step: int, values: Mapping[str, float], *, note: str = ""
    ) -> None:
        """Report metrics (bare names) as the fit's own are (`note`: a line printed after)."""
        ...

    def emit(
        self,
        name: str,
        split: Split,
        step: int,
        values: Mapping[str, float] | None = None,
        decision: Any = None,
    ) -> None:
        """Send one `TrainingEvent` to the fit's event sinks."""
        ...

    def print(self, line: str) -> None:
        """Print `line` above the progress bar (when the fit prints)."""
        ...

    def record(self, name: str, record: "Record", step: int | None) -> None:
        """Log a typed record to the tracker, when it takes records."""
        ...

    def counts_note(
        self, batches: int, records: int, uneven_shards: bool, key: str | Callable[[], str]
    ) -> str:
        """The counts line an evaluation prints under its metrics."""
        ...


class Callback:
    """Custom behaviour in `Trainer.fit`, called by the loop as its own policies are
    (`fit(..., callbacks=[...])`, or `trainer.callbacks = ["module:Name"]` in a run
    configuration). Subclass it and override the hooks you need; each gets the `Loop`.

    - `every` (class or instance attribute, default 1): `on_step` runs after every step
      that is a multiple of it (`None`: never). In fused mode (`steps_per_call=k`) it must
      be a multiple of `k`.
    - `final` (default `False`): also run `on_step` at the fit's last step (its `steps`,
      or the step an early stop or a `loop.stop` ended it at) when `every` misses it.
    - `on_fit_start(loop)`: once, after the fit has restored its state, before any step.
    - `on_step(step, loop)`: after the step's own policies (the training report at a log
      step, evaluation, checkpoint), in the order the callbacks were given.
    - `on_evaluation(step, split, values, loop)`: after each report of metrics: the
      training window's at a log step (`Split.TRAIN`), each evaluation's scores
      (`Split.VALIDATION`), and what callbacks report themselves.
    - `on_fit_end(loop)`: once, when the fit has trained to its end (or stopped early)
      and saved its last checkpoint; not after an error or Ctrl-C.

    ```python
    >>> from dew.training import Callback
    >>> class EveryThird(Callback):
    ...     every = 3
    ...     def on_step(self, step, loop):
    ...         loop.print(f"step {step} of {loop.steps}")
    >>> EveryThird().every, EveryThird().final
    (3, False)

    ```
    """

    every: int | None = 1
    final: bool = False

    def on_fit_start(self, loop: Loop) -> None:
        """Before the fit's first step."""

    def on_step(self, step: int, loop: Loop) -> None:
        """After `step`, when `step` is a multiple of `every` (or the last, with `final`)."""

    def on_evaluation(
        self, step: int, split: Split, values: Mapping[str, float], loop: Loop
    ) -> None:
        """After metrics `values` (bare names) of `split` were reported at `step`."""

    def on_fit_end(self, loop: Loop) -> None:
        """After the fit's last step and its last checkpoint."""
