"""The loop both runners share: one object holding what a run has done so far, handed to
every policy the loop asks.

`Trainer.fit` (one event per optimizer step on a cadence) and `run_supervised` (one event per
epoch) drive their own compiled steps, and hand everything they observe to one `LoopEngine`:
the run's state in one shape (its step, the metric history under the tags a tracker
receives, the early stopper's state, whether to stop) and the reporting path (`report`
appends to the history, shows the line, emits `TrainingEvent`s to the sinks, then tells every
policy through `on_evaluation`). Each job is its own module: the console and progress bar
(`_console`), early stopping (`_stopping`), the lifecycle records (`_lifecycle`), the policy
protocol and the view a policy gets (`_callback`); the Ctrl-C latch is `dew._interrupts`'.
A runner thus differs from the other only in what a step is, never in how a run is observed.
"""

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

from dew._early_stopping import EarlyStopper, EarlyStoppingState
from dew._interrupts import InterruptLatch
from dew._loop._callback import HOOKS, Callback, Loop
from dew._loop._console import Console, counts_line, telling, verbose_console
from dew._loop._lifecycle import reporting_fit
from dew._loop._stopping import EarlyStopping
from dew._processes import is_process_zero
from dew.events import Decision, EventSink, TrainingEvent
from dew.naming import Split, metric_tag
from dew.steps import MetricHistory, TrainState
from dew.telemetry.records import Record
from dew.tracking import Tracker

__all__ = [
    "COMPILING_NOTICE",
    "HOOKS",
    "Callback",
    "EarlyStopping",
    "Loop",
    "LoopEngine",
    "check_callbacks",
    "counts_line",
    "telling",
    "verbose_console",
    "with_history",
]

COMPILING_NOTICE = "interrupting after compilation..."
"""What a Ctrl-C during a compiled call's first dispatch (its compilation) prints at once."""


def with_history(state: TrainState, history: MetricHistory) -> TrainState:
    """`state` with its (static) metric history replaced."""
    return TrainState(
        state.step, state.params, state.opt_state, state.key, state.ema_params, history
    )


class LoopEngine:
    """One run of a loop, and the policies it asks.

    - `stage`: the first segment of every tag.
    - `current`: returns the run's state now (its history is ignored).
    - `sinks`: event sinks; `tracker`: borrowed, receives records (a runner that
      reports metrics to it passes a `TrackerEventSink` among the sinks).
    - `early_stopper`, `stopping`: a stopper whose state starts here (`update_early_stopping`
      consults it), and the stopping state so far (`None`: fresh). A loop of policies
      passes an `EarlyStopping` policy among `policies` instead.
    - `progress`: print one line per report; draw a bar (over `total` units of
      `unit`, from `initial`) when standard error is a terminal.
    - `start`: the step the run starts at (default `initial`); `total` is the step it
      runs to (`steps`).
    - `policies`: what `start`, `at_step`, `report` and `end` ask, in order (each
      with the hooks of `Callback` and its `every` and `final`).
    """

    def __init__(
        self,
        *,
        stage: str,
        current: Callable[[], TrainState],
        history: MetricHistory,
        sinks: Sequence[EventSink] = (),
        tracker: Tracker | None = None,
        early_stopper: EarlyStopper | None = None,
        stopping: EarlyStoppingState | None = None,
        progress: bool = False,
        total: int | None = None,
        initial: int = 0,
        start: int | None = None,
        unit: str = "step",
        policies: Sequence[Any] = (),
        metric_directions: Mapping[str, str | None] | None = None,
        precision: str = "float32",
    ) -> None:
        self.stage = stage
        self.current = current
        self.history = history
        self.sinks = tuple(sinks)
        self.tracker = tracker
        self.metric_directions = dict(metric_directions or {})
        self.precision = precision  # the fit's precision policy, recorded in FitStarted
        if early_stopper is not None and early_stopper.mode is None:
            early_stopper = early_stopper.directed(self.metric_directions)
        self.early_stopper = early_stopper
        if early_stopper is not None and stopping is None:
            stopping = early_stopper.init()
        self.stopping = stopping
        self.start = self.step = initial if start is None else start
        self.steps = total
        self.stop = False
        self.progress = progress
        self.console = Console(progress, total=total, initial=initial, unit=unit)
        self.policies = tuple(policies)
        self.due = initial + 1  # the next step some policy's cadence falls on
        self._latch = InterruptLatch()
        self._dispatched: set[Hashable] = set()  # the compiled calls dispatched so far

    # -- the state --------------------------------------------------------------------------

    def state(self) -> TrainState:
        """The current state with the history reported so far."""
        return with_history(self.current(), self.history)

    # -- reporting --------------------------------------------------------------------------

    def emit(
        self,
        name: str,
        split: Split,
        step: int,
        values: Mapping[str, float] | None = None,
        decision: Decision | None = None,
    ) -> None:
        """Send one event to every sink (no work at all without sinks)."""
        if not self.sinks:
            return
        event = TrainingEvent(
            name, self.stage, split, step, self.state(), dict(values or {}), decision
        )
        for sink in self.sinks:
            sink.on_event(event)

    def report(
        self,
        name: str,
        split: Split,
        step: int,
        values: Mapping[str, float],
        *,
        note: str = "",
    ) -> None:
        """Record `values` (bare names) at `step`: history, console, the event, then every
        policy's `on_evaluation`."""
        tags = {metric_tag(self.stage, split, metric): value for metric, value in values.items()}
        self.history = self.history.with_values(tags, step)
        self.console.reported(split, step, tags, values, note)
        self.emit(name, split, step, values)
        for policy in self.policies:
            policy.on_evaluation(step, split, values, self)

    def record(self, name: str, record: Record, step: int | None) -> None:
        """Report a typed record to the tracker, if any."""
        if self.tracker is not None:
            self.tracker.log_artifact(name, record, step=step)

    def print(self, line: str) -> None:
        """Print a line (above the progress bar when one is drawn)."""
        self.console.print(line)

    def counts_note(
        self, batches: int, records: int, uneven_shards: bool, key: str | Callable[[], str]
    ) -> str:
        """An evaluation's counts as a note under its values (`Console.counts_note`)."""
        return self.console.counts_note(batches, records, uneven_shards, key)

    @property
    def bar(self) -> Any:
        """The progress bar (`Console.bar`)."""
        return self.console.bar

    @property
    def postfix(self) -> dict[str, str]:
        """The bar's postfix: the latest loss and validation values."""
        return self.console.postfix

    def update_early_stopping(self, split: Split, step: int, values: Mapping[str, float]) -> bool:
        """Consult the loop's `early_stopper` with `split`'s values (`EarlyStopping.update`);
        `True`: stop. `run_supervised` asks it once an epoch, after both reports."""
        if self.early_stopper is None:
            return False
        return EarlyStopping(self.early_stopper).update(self, split, step, values)

    # -- asking the policies ----------------------------------------------------------------

    def begin(self) -> None:
        """Every policy's `on_fit_start`; then the first step a cadence falls on."""
        for policy in self.policies:
            policy.on_fit_start(self)
        self.due = self._next_due(self.step)

    def at_step(self, step: int) -> None:
        """Ask every policy whose cadence falls on `step` (or that runs at the last step,
        which `step` is when it reaches `steps` or a policy stopped the loop)."""
        self.step = step
        last = self.steps is not None and step >= self.steps
        for policy in self.policies:
            every = policy.every
            if (every is not None and step % every == 0) or (policy.final and (last or self.stop)):
                policy.on_step(step, self)
        self.due = self._next_due(step)

    def end(self) -> None:
        """Every policy's `on_fit_end`, in order."""
        for policy in self.policies:
            policy.on_fit_end(self)

    def _next_due(self, step: int) -> int:
        """The next step after `step` that some policy's cadence falls on (the last step
        when none does sooner: policies with `final` run there)."""
        due = self.steps if self.steps is not None else step + 1
        for policy in self.policies:
            if policy.every is not None:
                due = min(due, (step // policy.every + 1) * policy.every)
        return due

    # -- Ctrl-C and the lifecycle -----------------------------------------------------------

    def deferred(self, call: Hashable = None) -> contextlib.AbstractContextManager[None]:
        """Hold a Ctrl-C back while inside (a compiled step's dispatch); raise it on leaving.
        The first dispatch of each `call` (a kind of compiled call) compiles it: a Ctrl-C
        held there says at once, on process zero, that the fit stops after compilation."""
        first = call not in self._dispatched
        self._dispatched.add(call)
        notice = COMPILING_NOTICE if first and is_process_zero() else None
        return self._latch.deferred(notice)

    def advance(self, units: int = 1) -> None:
        """Move the progress bar; raise a Ctrl-C that arrived during the step and was lost."""
        self._latch.check()
        self.console.bar.update(units)

    @contextlib.contextmanager
    def reporting_fit(
        self, *, start: int, steps: int, completed: Callable[[], int]
    ) -> Iterator["LoopEngine"]:
        """`FitStarted`, then `FitEnded` however the body ends (`_lifecycle.reporting_fit`),
        with the Ctrl-C latch held inside and the progress bar closed after."""
        with (
            reporting_fit(
                self,
                start=start,
                steps=steps,
                completed=completed,
                close=self.console.bar.close,
                directions=self.metric_directions,
            ),
            self._latch,
        ):
            yield self


def check_callbacks(callbacks: object, steps_per_call: int = 1) -> tuple[Any, ...]:
    """`callbacks` as a tuple of objects with every hook of `Callback` and a valid `every`
    and `final`; a one-line `TypeError` or `ValueError` naming the first bad one."""
    if isinstance(callbacks, str) or not isinstance(callbacks, Sequence):
        raise TypeError(
            f"callbacks must be a list of dew.training.Callback objects, got {callbacks!r}."
        )
    for index, callback in enumerate(callbacks):
        missing = [hook for hook in HOOKS if not callable(getattr(callback, hook, None))]
        missing += [name for name in ("every", "final") if not hasattr(callback, name)]
        if isinstance(callback, type) or missing:
            raise TypeError(
                f"callbacks[{index}] is {callback!r}, which is not a callback: an object with "
                f"the methods {', '.join(HOOKS)} and the attributes every and final "
                "(subclass dew.training.Callback; pass an instance, not the class)."
            )
        every = callback.every
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int) or every < 1
        ):
            raise ValueError(
                f"callbacks[{index}].every is {every!r}; it must be None or an integer >= 1."
            )
        if every is not None and every % steps_per_call:
            raise ValueError(
                f"callbacks[{index}].every={every} is not a multiple of steps_per_call="
                f"{steps_per_call}: a fused call runs whole blocks of steps, so the loop can "
                "only look at their ends."
            )
        if not isinstance(callback.final, bool):
            raise TypeError(
                f"callbacks[{index}].final is {callback.final!r}; it must be True or False."
            )
    return tuple(callbacks)
