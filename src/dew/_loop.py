"""The loop engine both runners share: reporting, history, early stopping, progress, records.

`Trainer.fit` (one event per optimizer step on a cadence) and `run_supervised` (one
event per epoch) drive their own compiled steps, and hand everything they observe to
one `LoopEngine`: it appends to the metric history under the tags a tracker receives,
emits `TrainingEvent`s to the sinks, asks the early stopper, prints a line and draws
the progress bar, and reports `FitStarted` / `FitEnded` to a tracker. A runner thus
differs from the other only in what a step is, never in how a run is observed.
"""

import contextlib
import contextvars
import sys
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence

from tqdm.auto import tqdm

from dew._early_stopping import EarlyStopper, EarlyStoppingState
from dew._interrupts import InterruptLatch
from dew._processes import is_multiprocess, is_process_zero
from dew.events import BEST_MODEL, EARLY_STOP, Decision, EventSink, TrainingEvent
from dew.naming import Split, metric_tag
from dew.steps import MetricHistory, TrainState
from dew.telemetry.records import FitEnded, FitStarted, Record
from dew.tracking import ScalarTracker
from dew.tracking._protocol import same_failure, set_notes

__all__ = ["COMPILING_NOTICE", "LoopEngine", "verbose_console", "with_history"]

COMPILING_NOTICE = "interrupting after compilation..."
"""What a Ctrl-C during a compiled call's first dispatch (its compilation) prints at once."""

_VERBOSE = contextvars.ContextVar("dew_verbose_console", default=False)


@contextlib.contextmanager
def verbose_console(verbose: bool = True) -> Iterator[None]:
    """Within this block, a loop that prints (`progress=True`) also prints the lines that
    say nothing in a one-process run with even shards (an evaluation's batch and record
    counts and its event key); `dew train --verbose` sets it."""
    token = _VERBOSE.set(verbose)
    try:
        yield
    finally:
        _VERBOSE.reset(token)


def counts_line(batches: int, records: int, uneven_shards: bool, key: str) -> str:
    """An evaluation's pass counts and event key, as `dew train` and `dew eval` print them."""
    return (
        f"evaluation/coordinated_batches {batches}  evaluation/records {records}  "
        f"evaluation/uneven_shards {uneven_shards}  event key {key}"
    )


def telling(uneven_shards: bool) -> bool:
    """Whether an evaluation's counts line is worth printing: its shards were uneven, the
    run has several processes, or `verbose_console` asks for it."""
    return bool(uneven_shards) or is_multiprocess() or _VERBOSE.get()


def with_history(state: TrainState, history: MetricHistory) -> TrainState:
    """`state` with its (static) metric history replaced."""
    return TrainState(
        state.step, state.params, state.opt_state, state.key, state.ema_params, history
    )


class LoopEngine:
    """Observe one run of a loop.

    - `stage`: the first segment of every tag.
    - `current`: returns the run's state now (its history is ignored).
    - `sinks`: event sinks; `tracker`: borrowed, receives records (a runner that
      reports metrics to it passes a `TrackerEventSink` among the sinks).
    - `early_stopper`, `stopping`: the stopper and its state so far (`None`: fresh).
    - `metric_directions`: the direction each metric declares, by bare name: recorded in
      `FitStarted`, and read by an early stopper without a `mode` (decision 0064).
    - `progress`: print one line per report; draw a bar (over `total` units of
      `unit`, from `initial`) when standard error is a terminal.
    """

    def __init__(
        self,
        *,
        stage: str,
        current: Callable[[], TrainState],
        history: MetricHistory,
        sinks: Sequence[EventSink] = (),
        tracker: ScalarTracker | None = None,
        early_stopper: EarlyStopper | None = None,
        stopping: EarlyStoppingState | None = None,
        progress: bool = False,
        total: int | None = None,
        initial: int = 0,
        unit: str = "step",
        metric_directions: Mapping[str, str | None] | None = None,
    ) -> None:
        self.stage = stage
        self.current = current
        self.history = history
        self.sinks = tuple(sinks)
        self.tracker = tracker
        self.metric_directions = dict(metric_directions or {})
        if early_stopper is not None and early_stopper.mode is None:
            early_stopper = early_stopper.directed(self.metric_directions)
        self.early_stopper = early_stopper
        if early_stopper is not None and stopping is None:
            stopping = early_stopper.init()
        self.stopping = stopping
        self.progress = progress
        self.postfix: dict[str, str] = {}  # the bar's: the latest loss and validation values
        self._latch = InterruptLatch()
        self._dispatched: set[Hashable] = set()  # the compiled calls dispatched so far
        self.bar = tqdm(
            total=total,
            initial=initial,
            unit=unit,
            disable=not (progress and sys.stderr.isatty()),
            file=sys.stderr,
            dynamic_ncols=True,
        )

    # -- observation ---------------------------------------------------------------------

    def state(self) -> TrainState:
        """The current state with the history reported so far."""
        return with_history(self.current(), self.history)

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
        """Record `values` (bare names) at `step`: history, printed line, then the event."""
        tags = {metric_tag(self.stage, split, metric): value for metric, value in values.items()}
        self.history = self.history.with_values(tags, step)
        if split is Split.VALIDATION:
            self.postfix.update(
                {f"val_{metric}": f"{value:.4f}" for metric, value in values.items()}
            )
        elif "loss" in values and split is Split.TRAIN:
            self.postfix = {**self.postfix, "loss": f"{values['loss']:.4f}"}
        if self.postfix:
            self.bar.set_postfix(self.postfix, refresh=False)
        if self.progress:
            shown = "  ".join(f"{tag} {value:.4f}" for tag, value in tags.items())
            self.print(f"step {step}  {shown}{note}")
        self.emit(name, split, step, values)

    def update_early_stopping(self, split: Split, step: int, values: Mapping[str, float]) -> bool:
        """Update the early stopper with `split`'s values; emit its decisions; `True`: stop.

        A split the stopper does not watch, or a report with no values, decides
        nothing; values that lack the monitored metric are an error.
        """
        stopper = self.early_stopper
        if stopper is None or stopper.source != split or not values:
            return False
        metric = stopper.monitored_metric_name()
        if metric not in values:
            raise ValueError(
                f"the early stopper monitors {metric!r} on the {split.value} split, but "
                f"the {split.value} metrics are {sorted(values)}."
            )
        assert self.stopping is not None
        self.stopping = stopper.update(self.stopping, values[metric], step=step)
        decision = Decision(metric, float(values[metric]))
        if self.stopping.improved:
            self.emit(BEST_MODEL, split, step, decision=decision)
        if self.stopping.stop:
            self.emit(EARLY_STOP, split, step, decision=decision)
        return self.stopping.stop

    def counts_note(
        self, batches: int, records: int, uneven_shards: bool, key: str | Callable[[], str]
    ) -> str:
        """An evaluation's counts (`counts_line`) as a note under its values, or `""` when
        they say nothing (`telling`). `key` is the event key's text, or what makes it (a
        fetch of the key from the device, made only for a note that is shown)."""
        if not telling(uneven_shards):
            return ""
        text = key() if callable(key) else key
        return f"\n  {counts_line(batches, records, uneven_shards, text)}"

    def print(self, line: str) -> None:
        """Print a line (above the progress bar when one is drawn)."""
        if self.bar.disable:
            print(line)
        else:
            self.bar.write(line)

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
        self.bar.update(units)

    # -- records ---------------------------------------------------------------------------

    def record(self, name: str, record: Record, step: int | None) -> None:
        """Report a typed record to the tracker, if any."""
        if self.tracker is not None:
            self.tracker.log_artifact(name, record, step=step)

    @contextlib.contextmanager
    def reporting_fit(
        self, *, start: int, steps: int, completed: Callable[[], int]
    ) -> Iterator["LoopEngine"]:
        """Report `FitStarted`, then `FitEnded`: `completed` when the body returns,
        `interrupted` on KeyboardInterrupt and `failed` (with the error) on any other
        exception, which is re-raised. `completed()` gives the last completed step.

        The fit's own error always surfaces: when reporting `FitEnded` fails too, that
        failure is attached to it as a note. When reporting `FitStarted` fails (one
        tracker of several, say), `FitEnded("failed")` is still reported, so every
        tracker that took the start also sees the end, and the reporting error is raised.
        """
        try:
            started = FitStarted(self.stage, start, steps, self.metric_directions)
            self.record("fit_started", started, start)
        except Exception as error:
            self.bar.close()
            ended = FitEnded(
                "failed",
                start,
                error=f"reporting FitStarted failed: {type(error).__name__}: {error}",
            )
            self._record_ending(ended, error)
            raise
        try:
            with self._latch:
                yield self
        except KeyboardInterrupt as error:
            done = completed()
            self._record_ending(FitEnded("interrupted", done), error)
            raise
        except Exception as error:
            done = completed()
            ended = FitEnded("failed", done, error=f"{type(error).__name__}: {error}")
            self._record_ending(ended, error)
            raise
        finally:
            self.bar.close()
        done = completed()
        self.record("fit_ended", FitEnded("completed", done), done)

    def _record_ending(self, ended: FitEnded, error: BaseException) -> None:
        """Report `ended` while `error` is in flight; a reporting failure becomes a note
        on `error` and never replaces it."""
        try:
            self.record("fit_ended", ended, ended.step)
        except Exception as report_error:
            if same_failure(report_error, error):  # the same failure again: nothing new to tell
                return
            note = (
                f"Reporting FitEnded({ended.status!r}) to the tracker also failed: "
                f"{type(report_error).__name__}: {report_error}"
            )
            set_notes(error, "FitEnded report", [note])
