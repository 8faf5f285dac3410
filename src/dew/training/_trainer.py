"""`Trainer.fit`: the loop that drives the pure step functions, asking its policies what to
do at each step (decision 0066)."""

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Unpack

import jax
import numpy as np
import optax
from jaxtyping import PRNGKeyArray

from dew._accumulate import check_accumulate
from dew._checks import explanation
from dew._compiled_calls import partitioned
from dew._loop import Callback, EarlyStopping, LoopEngine, check_callbacks, with_history
from dew._nonfinite import raises_on_nonfinite
from dew._precision import check_precision
from dew._processes import is_multiprocess
from dew.checkpoints._location import checkpoint_location
from dew.data import Dataset, Partition
from dew.events import TrackerEventSink
from dew.metrics import Metric, MetricSet
from dew.naming import Split, check_path_segment
from dew.objectives.base import Objective, ReportsSampling, check_batch_keys
from dew.steps import EMPTY_HISTORY, LearningRate, TrainState
from dew.tracking import ScalarTracker
from dew.tracking._protocol import takes_artifacts
from dew.training._batches import _draw_block, _opened, _stack, checked_block, data_origin
from dew.training._cadence import check_cadence
from dew.training._compiled_step import (
    Telemetry,
    by_where_batches_lie,
    compiled_steps,
    output_names,
    state_leaves,
    state_of,
)
from dew.training._evaluation_event import evaluates, evaluation_event
from dew.training._fit_options import FitOptions, fit_options
from dew.training._optimizer_telemetry import checked_learning_rate, optimizer_telemetry
from dew.training._placement import ParamSharding, Placement, fit_setup, placed_by
from dew.training._policies._checkpointing import Checkpointing
from dew.training._policies._evaluation import Evaluation
from dew.training._policies._nonfinite_guard import NonFiniteGuard
from dew.training._policies._train_window import TrainingReport
from dew.training._profile_window import ProfileWindowTracer
from dew.training._resume import closed_after_interrupt, last_completed, starting_state
from dew.training._sampling import sampling_record
from dew.training._throughput import Throughput, compute_dtype, step_flops
from dew.training._window import WindowedCalls, beside, check_train_reduction

__all__ = ["Trainer"]


class Trainer:
    """Train an objective with an optax optimizer, evaluating and reporting on a cadence.

    **Arguments:**

    - `objective`: what to train (its `name` is the default stage).
    - `optimizer`: an optax `GradientTransformation` over the objective's params.
    - `key`: the run key; step keys and evaluation keys derive from it.
    - `stage`: the first segment of every metric tag and preview name (default: the
      objective's name); a path segment (`dew.naming.check_path_segment`).
    - `checkpoint_dir`: where `fit` saves checkpoints (orbax-checkpoint) and resumes from
      (at the latest intact checkpoint): a local folder, a `file:///absolute/path` URI or a
      `gs://bucket/folder` URI; another URI raises `ValueError` here.
    - `mesh`, `strategy`: a sharding preset (docs/training.md, "Sharding presets"):
      `strategy` `"data"` (the default), `"fsdp"` or `"fsdp+tensor"` over `mesh`, a
      `jax.sharding.Mesh` of every device with axes `"data"` (and `"model"`); `None`:
      the data mesh (`dew.distributed.data_mesh()`), refused by `"fsdp+tensor"`.
    - `param_sharding`: the escape hatch (strategy `"data"` only): a callable `(path,
      leaf) -> jax.sharding.Sharding` called once per fit for every array leaf of the
      params (a sharding that does not divide it is refused); the EMA params and the
      optimizer state's params-shaped parts follow it (docs/training.md, "Sharding
      presets"; `None`: a full copy on every device).
    - `learning_rate`: the float or optax schedule of the optimizer, for `fit(...,
      log_optimizer=True)` to log (`None`: read from an `optax.inject_hyperparams` state).
    - `precision`: the policy the compiled step and the fit's evaluations compute under:
      `"float32"` (the default), `"mixed_bfloat16"` or `"bfloat16"`, the params and
      optimizer state float32 under each (docs/training.md, "Precision").
    """

    def __init__(
        self,
        objective: Objective,
        optimizer: optax.GradientTransformation,
        key: PRNGKeyArray,
        *,
        stage: str | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        param_sharding: ParamSharding | None = None,
        learning_rate: LearningRate | None = None,
        mesh: jax.sharding.Mesh | None = None,
        strategy: str = "data",
        precision: str = "float32",
    ) -> None:
        self.objective = objective
        self.optimizer = optimizer
        self.key = key
        # a path segment: a preview's folders are named after it (`dew.naming.preview_name`)
        self.stage = check_path_segment("stage", objective.name if stage is None else stage)
        if checkpoint_dir is not None and not os.fspath(checkpoint_dir):
            raise ValueError("checkpoint_dir must be None or a non-empty path, got ''.")
        self.checkpoint_dir = None
        if checkpoint_dir is not None:  # a URI orbax cannot write to is refused here
            self.checkpoint_dir = checkpoint_location(os.fspath(checkpoint_dir))
        self.param_sharding, self.strategy = placed_by(param_sharding, mesh, strategy)
        self.learning_rate = checked_learning_rate(learning_rate)
        self.precision = check_precision(precision)
        self._objective_leaves, self._objective_def, self._static = partitioned(objective)
        self._compiled: dict[tuple[Telemetry, int, str], Any] = {}
        self._names: dict[Any, tuple[str, ...]] = {}

    def fit(
        self,
        data: Dataset,
        steps: int,
        *,
        log_every: int,
        eval_every: int | None = None,
        checkpoint_every: int | None = None,
        metrics: Sequence[Metric] = (),
        tracker: ScalarTracker | None = None,
        callbacks: Sequence[Callback] = (),
        state: TrainState | None = None,
        **options: Unpack[FitOptions],
    ) -> TrainState:
        """Train to `steps` optimizer steps and return the final state.

        The loop draws a batch, runs the compiled step, and asks its policies what to do
        at that step: the training report (`log_every`), the non-finite guard
        (`on_nonfinite`), early stopping (`early_stopper`), evaluation (`eval_every`),
        checkpoints (`checkpoint_every`), then `callbacks` (`dew.training.Callback`
        objects, in order: custom behaviour every N steps; docs/training.md, "Callbacks").
        Past the cadences, `metrics`, `tracker`, `callbacks` and `state`, the keywords are
        options (`dew.training.FitOptions`); an unknown one raises `TypeError`.

        - The training metrics are reported every `log_every` steps (`step_end`
          events, tags `<stage>/train/<metric>`): with `train_reduction="mean"` (the
          default) each is its mean over the window of steps since the last log step
          (since the fit's first step for the first log step, a resumed fit's too),
          summed on the device inside the compiled step; `"last"` reports the log
          step's own values. Between log steps they stay on the device.
        - `log_optimizer=True` adds the training metrics `learning_rate` (the rate the
          log step's update applied: the window's last value), `grad_norm` and
          `update_norm` (global L2 norms of the gradients and of the updates: window
          means). The rate comes from the Trainer's `learning_rate` or an
          `optax.inject_hyperparams` optimizer state; without either, and for an
          objective whose aux already names one of these, `fit` raises a `ValueError`.
        - `log_throughput=True` adds the training metrics `examples_per_second`,
          `tokens_per_second` (an objective that counts its tokens:
          `dew.objectives.base.CountsTokens`) and, on a device whose peak FLOP/s dew
          knows, `mfu`, over the steps since the last log step (docs/training.md,
          "Throughput and MFU"): worked out on the host at the log step, nothing per step.
        - Evaluation runs every `eval_every` steps only when `data.val` and
          `eval_every` are given and there is something to do: `metrics` to score
          (`validation_end` events, `<stage>/validation/<metric>`) or a preview; and
          once more at the fit's last step (`steps`, or an early stop) when the cadence
          missed it, unless `final_eval=False`. Something to do every `eval_every`
          steps with no `data.val` raises a `ValueError`.
        - Previews (`tracker.log_artifact("<stage>/validation/samples", ...)`, the
          preview name `dew.naming.preview_name(stage, "validation", "samples")`, a
          `dew.tracking.Preview` with `data.classes` and `data.tokenizer`) only with
          `preview=True` and a tracker that takes artifacts; the base preview reuses the
          first scoring artifact. An objective with no metrics (diffusion) still previews.
        - EMA: when the objective declares an `ema_decay`, the state carries
          `ema_params`, updated in the compiled step after every optimizer step, and
          validation scores and previews with them (`dew.steps.generation_params`).
        - The tracker is borrowed, never closed. One whose `log_artifact` is missing
          or takes no `step` (`dew.tracking.ScalarTracker`) gets the metrics alone and
          turns no preview on; one without `log_metrics(values, *, step)` raises a
          `TypeError` before any work. Any other receives `FitStarted`,
          `CheckpointRequested`, `ProfileWindow` and `FitEnded` (`completed`,
          `failed` with the error, or `interrupted`), and from an objective that
          generates what it is scored on (`ReportsSampling`: diffusion) its
          `SamplingProtocol` once at the start and with every scored evaluation.
        - Checkpoints (needs the Trainer's `checkpoint_dir`): a save is submitted
          every `checkpoint_every` steps and at the end, asynchronously
          (`CheckpointRequested` means submitted, not durable); `fit` waits for every
          save before it returns or raises (a failed save raises an `OSError` naming
          the directory when the disk is full or read-only). When the directory already
          holds a checkpoint, `fit` resumes from the newest intact one: its state,
          metric history and early-stopping state. A step-indexed `data.train` (one
          with `batch_at(step, partition)`: `dew.data.StepBatches`) is read from the
          restored step's batch on; an iterator of batches is opened again and the
          batches the saved run had consumed are drawn and discarded (replayed), so
          the data order continues where it was. A fit given `state=` reads a
          step-indexed source from `state.step`'s batch, an iterator from its start. A
          damaged newer step is passed over with a
          `dew.checkpoints.DamagedCheckpointWarning` (`Checkpointer.restore`); when no
          step is intact, `fit` raises naming the directory. A larger `steps` than the
          saved fit's continues the run to it; a checkpoint past `steps` raises. Ctrl-C
          saves the last completed step, then raises `FitInterrupted` (a
          `KeyboardInterrupt`).
        - `profile`: a `dew.profiling.Profile` window traced with `jax.profiler`; the
          `ProfileWindow` record is reported once the trace has stopped.
        - `steps_per_call` (fused mode, opt-in): run this many steps in one compiled
          call (a `lax.scan` over that many stacked batches) between the points where
          the loop must look: `log_every`, `eval_every` and `checkpoint_every` must be
          multiples of it. It saves the per-step dispatch of small models; a profile
          window then traces whole calls.
        - `accumulate` (an integer >= 1 dividing every batch's rows): each step sums the
          gradients, loss and aux of that many micro-batches of its batch, weighted by their
          loss weights, in the compiled step, then updates once (`train_step(accumulate=)`).
        - `on_nonfinite`: `"raise"` (the default) stops the fit with a `ValueError`
          naming the step and the value when the training loss is NaN or infinite at
          a log step, or, before a checkpoint save or the return of the final state,
          when that step's loss or params are. `FitEnded` is then `failed` and no
          checkpoint of that state is written, so the last good checkpoint is the one
          a new fit resumes from. Other steps are not looked at (they pay no device
          fetch); with `train_reduction="mean"` a log step looks at the window's
          mean loss, which a NaN or infinity at any step of the window makes non-finite.
          `"continue"` trains on. (Keras calls this rule
          `TerminateOnNaN`.)
        - Under `jax.distributed` every process calls `fit` alike: each reads its own
          `Partition` of the data, each step trains on one global batch (every
          process's rows) with one compiled step over global arrays, and the returned
          params are the same on every process. Only process zero reports to its
          tracker and prints; `event_sinks` run on every process; checkpoints are
          saved and restored by every process together (docs/training.md,
          "Multi-process training").
        - `progress` prints one line per log and evaluation event (an evaluation's
          line adds its batch and record counts and its event key) and, when
          standard error is a terminal, shows a progress bar (step, loss, steps/s)
          over the fit and over each evaluation pass.
        """
        given = fit_options(options)
        spc = given.steps_per_call
        check_cadence(steps, log_every, eval_every, checkpoint_every, spc, self.checkpoint_dir)
        callbacks = check_callbacks(callbacks, spc)
        raising = raises_on_nonfinite(given.on_nonfinite)
        mean = check_train_reduction(given.train_reduction)
        telemetry = optimizer_telemetry(
            self.objective, self.optimizer, self.learning_rate, given.log_optimizer
        )
        kind = (telemetry, check_accumulate(given.accumulate), self.precision)
        metric_set = MetricSet(metrics)
        artifacts = tracker is not None and takes_artifacts(tracker)  # refuses a non-tracker
        placement, previewing, tracker, progress = fit_setup(
            self.optimizer,
            self.param_sharding,
            self.strategy,
            given.preview and artifacts,
            tracker,
            given.progress,
        )
        evaluating = evaluates(data, eval_every, metric_set, previewing)
        sinks = [*given.event_sinks, *([TrackerEventSink(tracker)] if tracker is not None else [])]
        # A tracker that takes scalars only gets no records, no previews.
        records = tracker if tracker is not None and takes_artifacts(tracker) else None
        checkpoints = None
        if self.checkpoint_dir is not None:
            from dew.checkpoints import Checkpointer

            checkpoints = Checkpointer(self.checkpoint_dir)
        try:
            state, data_start, stopping = starting_state(
                self.objective,
                self.optimizer,
                self.key,
                checkpoints,
                self.checkpoint_dir,
                steps,
                state,
                placement,
                given.early_stopper,
            )
            # The jitted step sees the empty history only, so a growing history never
            # changes its static fields (and never recompiles it).
            history, start = state.metric_history, int(state.step)
            stepping = self._stepping(with_history(state, EMPTY_HISTORY), placement, kind, mean)
            stepping.origin = data_origin(data.train, start, data_start)
            guard = NonFiniteGuard(raising, start, stepping.calls)
            resumed = data_start is not None  # restored from a checkpoint
            checkpointing = Checkpointing(
                checkpoints, checkpoint_every, stepping.origin, guard, resumed=resumed
            )
            event = functools.partial(
                evaluation_event,
                self.objective,
                self.key,
                data,
                metric_set,
                records,
                previewing,
                precision=self.precision,
            )
            sampling = None
            if isinstance(self.objective, ReportsSampling):  # its protocol, once per fit
                sampling = functools.partial(sampling_record, self.objective, metric_set)
            evaluation = Evaluation(
                eval_every if evaluating else None, given.final_eval and evaluating, event, sampling
            )
            stopper = given.early_stopper
            throughput = self._throughput(stepping, given.log_throughput)
            policies = [
                TrainingReport(log_every, stepping.calls, stepping.unsynced, throughput),
                guard,
                *([EarlyStopping(stopper)] if stopper is not None else []),
                evaluation,
                checkpointing,
                *callbacks,
            ]
            loop = LoopEngine(
                stage=self.stage,
                current=stepping.current,
                history=history,
                sinks=sinks,
                tracker=records,
                stopping=stopping,
                progress=progress,
                total=steps,
                initial=min(start, steps),
                start=start,
                policies=policies,
                metric_directions=metric_set.directions,  # recorded in FitStarted (decision 0064)
                precision=self.precision,  # recorded in FitStarted (decision 0078)
            )
            window = ProfileWindowTracer(given.profile, loop)
            return self._loop(loop, stepping, data, steps, spc, window, checkpointing)
        finally:
            if checkpoints is not None:  # every submitted save is durable before fit returns
                closed_after_interrupt(checkpoints)

    def _loop(
        self,
        loop: LoopEngine,
        stepping: "_Stepping",
        data: Dataset,
        steps: int,
        steps_per_call: int,
        window: ProfileWindowTracer,
        checkpointing: Checkpointing,
    ) -> TrainState:
        """Draw a batch, run the compiled step, ask the policies whose cadence falls on the
        step (`LoopEngine.at_step`); until `steps`, or a policy stops the loop."""
        step = loop.start  # the last completed step
        draw, placement = stepping.draw, stepping.placement
        # The batches drawn since the window was last fetched: a check inside the
        # compiled step fails asynchronously, so its error may surface a few calls later.
        unsynced = stepping.unsynced
        completed = lambda: last_completed(stepping.current(), step)  # noqa: E731
        with loop.reporting_fit(start=step, steps=steps, completed=completed):
            loop.begin()
            try:
                batches: Iterator[Any] = iter(())  # a finished run draws no batch
                if step < steps and not loop.stop:
                    agreed = placement if placement is not None and is_multiprocess() else None
                    batches = _opened(
                        data.train, Partition.current(), step, stepping.origin, agreed
                    )
                while step < steps and not loop.stop:
                    aligned = step % steps_per_call == 0 and step + steps_per_call <= steps
                    block = steps_per_call if aligned else 1
                    drawn = draw(batches, step, block, steps, data.batch)
                    unsynced.extend(drawn)
                    window.before(step + 1)
                    with loop.deferred(block):  # a Ctrl-C lands between steps, not inside
                        stepping.run(drawn)
                        step += block
                    loop.step = step
                    loop.advance(block)
                    window.after(step, stepping.leaves, block)
                    if step >= loop.due:  # some policy's cadence falls on this step
                        loop.at_step(step)
                jax.block_until_ready(stepping.leaves)  # the last steps' failure surfaces here
            except KeyboardInterrupt:
                raise checkpointing.interrupted(step, loop) from None
            except Exception as error:
                explained = explanation(self.objective, unsynced, error)
                if explained is None:  # the batches are fine: a real error, unchanged
                    raise
                raise explained from None
            finally:
                window.close(stepping.leaves)
            loop.end()  # the final checkpoint, the guard's check of the state returned
        return loop.state()

    def _throughput(self, stepping: "_Stepping", log_throughput: object) -> Throughput | None:
        """The fit's throughput meter (`log_throughput=True`), else `None`."""
        if not isinstance(log_throughput, bool):
            raise TypeError(f"log_throughput must be True or False, got {log_throughput!r}.")
        if not log_throughput:
            return None
        placed = stepping.placement
        return Throughput(
            self.objective,
            dtype=compute_dtype(self._objective_leaves, self.precision),
            flops=stepping.flops,
            processes=jax.process_count() if is_multiprocess() else 1,
            devices=1 if placed is None else placed.mesh.devices.size,
        )

    def _output_names(
        self, step_kind: tuple[Telemetry, int, str], state_def: Any, leaves: list[Any], batch: Any
    ) -> tuple[str, ...]:
        """The training metrics' names, traced once per Trainer and kind of batch (a fit
        resumed or continued with `state=` pays no second trace), after the batch's keys
        are checked against the objective's (one line naming a missing one, not a
        `KeyError` from inside the trace)."""
        shapes = tuple(
            (np.shape(leaf), str(getattr(leaf, "dtype", type(leaf).__name__)))
            for leaf in jax.tree.leaves(batch)
        )
        key = (step_kind, state_def, jax.tree.structure(batch), shapes)
        if key not in self._names:
            check_batch_keys(self.objective, batch, Split.TRAIN)
            compiled = (self._objective_def, self._static, self.optimizer, step_kind[0])
            self._names[key] = output_names(
                *compiled, leaves, batch, self._objective_leaves, state_def, *step_kind[1:]
            )
        return self._names[key]

    def _stepping(
        self,
        state: TrainState,
        placement: Placement | None,
        kind: tuple[Telemetry, int, str],
        mean: bool,
    ) -> "_Stepping":
        """The compiled calls of this fit and the state they step, as leaves: compiled once
        per Trainer and kind (telemetry, accumulation, precision), even with unhashable
        statics, placed on the devices of every process when `placement` says so."""
        leaves, state_def = state_leaves(state)  # its keys as raw key data
        compiled = (self._objective_def, self._static, self.optimizer)
        if kind not in self._compiled:
            self._compiled[kind] = compiled_steps(*compiled, None, *kind)
        step_call, fused_call = self._compiled[kind]
        objective_leaves, place_window = self._objective_leaves, beside(leaves)
        place_block: Any = _stack
        draw: Callable[..., list[Any]] = functools.partial(checked_block, self.objective)
        if placement is not None:  # placed on its devices (checked in the step) ...
            draw = _draw_block
        if placement is not None and is_multiprocess():  # ... or drawn and agreed by all
            draw = functools.partial(placement.draw, self.objective)
        if placement is not None:  # one compiled step for every process, over global arrays
            step_call, fused_call, objective_leaves, place_block = placement.compiled_steps(
                self._objective_def, self._static, leaves, objective_leaves, *kind
            )
            place_window = placement.replicated
        calls = WindowedCalls(
            step_call,
            fused_call,
            objective_leaves,
            state_def,
            mean=mean,
            names_of=functools.partial(self._output_names, kind, state_def),
            place=place_window,
        )
        return _Stepping(calls, draw, place_block, placement, leaves, state_def)


@dataclasses.dataclass
class _Stepping:
    """What a fit's loop steps: the compiled calls with their window (`calls`), how it
    draws and stacks batches, and the state as leaves (`leaves`, replaced by each call)."""

    calls: WindowedCalls
    draw: Callable[..., list[Any]]
    place_block: Callable[[list[Any]], Any]
    placement: Placement | None
    leaves: list[Any]
    state_def: Any
    unsynced: list[Any] = dataclasses.field(default_factory=list)
    origin: int = 0  # the step its training batches count from (`data_origin`)

    def current(self) -> TrainState:
        """The state now (the history empty: the loop keeps it)."""
        return state_of(self.state_def, self.leaves)

    def flops(self, batch: Any) -> float:
        """The FLOPs of one compiled step (its single-step call) on a batch shaped like
        `batch`, one process's share of a global batch under `jax.distributed`, counted by
        XLA's cost analysis (`step_flops`) without compiling or running anything."""
        processes = jax.process_count() if is_multiprocess() else 1

        def shaped(leaf: Any) -> jax.ShapeDtypeStruct:
            shape = np.shape(leaf)
            if shape:
                shape = (shape[0] * processes, *shape[1:])
            dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
            return jax.ShapeDtypeStruct(shape, dtype)

        calls = self.calls
        assert calls.names is not None  # a window was reported: its names were found
        window = jax.ShapeDtypeStruct((3, len(calls.names) + 1), np.float32)
        args = (self.leaves, window, jax.tree.map(shaped, batch), calls.objective_leaves)
        return step_flops(by_where_batches_lie(calls.step_call), *args, self.state_def)

    def run(self, drawn: list[Any]) -> None:
        """One compiled call over the drawn batches: one step, or a fused block."""
        if len(drawn) == 1:
            batch = drawn[0] if self.placement is None else self.placement.batch(drawn[0])
            self.leaves = self.calls.step(self.leaves, batch)
        else:
            self.leaves = self.calls.fused(self.leaves, self.place_block(drawn), drawn[0])
