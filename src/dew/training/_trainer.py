"""`Trainer.fit`: the loop that drives the pure step functions."""

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np
import optax
from jaxtyping import PRNGKeyArray

from dew._checks import batch_error, failed_check
from dew._early_stopping import EarlyStopper, EarlyStoppingState
from dew._finite_params import check_params
from dew._interrupts import FitInterrupted
from dew._loop import LoopEngine, with_history
from dew._nonfinite import check_loss, raises_on_nonfinite
from dew._processes import is_multiprocess
from dew.checkpoints._location import checkpoint_location
from dew.data import Dataset, Partition
from dew.events import STEP_END, EventSink, TrackerEventSink
from dew.metrics import Metric, MetricSet
from dew.naming import Split, check_path_segment
from dew.objectives.base import Objective, ReportsSampling, check_batch_keys
from dew.profiling import Profile
from dew.steps import EMPTY_HISTORY, LearningRate, TrainState
from dew.telemetry.records import CheckpointRequested
from dew.tracking import ScalarTracker
from dew.tracking._protocol import takes_artifacts
from dew.training._batches import _draw_block, _opened, _stack, checked_block, data_origin
from dew.training._cadence import check_cadence
from dew.training._compiled_step import (
    Telemetry,
    compiled_steps,
    output_names,
    state_leaves,
    state_of,
)
from dew.training._evaluation_event import (
    SAMPLING_RECORD,
    evaluates,
    evaluation_event,
    key_text,
)
from dew.training._optimizer_telemetry import checked_learning_rate, optimizer_telemetry
from dew.training._placement import ParamSharding, Placement, fit_setup, placed_by
from dew.training._profile_window import ProfileWindowTracer
from dew.training._resume import closed_after_interrupt, last_completed, starting_state
from dew.training._sampling import sampling_record
from dew.training._window import WindowedCalls, beside, check_train_reduction

__all__ = ["Trainer", "key_text"]


class Trainer:
    """Train an objective with an optax optimizer, evaluating and reporting on a cadence.

    **Arguments:**

    - `objective`: what to train (its `name` is the default stage).
    - `optimizer`: an optax `GradientTransformation` over the objective's params.
    - `key`: the run key; step keys and evaluation keys derive from it.
    - `stage`: the first segment of every metric tag and preview name (default: the
      objective's name); a path segment (`dew.naming.check_path_segment`).
    - `checkpoint_dir`: where `fit` saves checkpoints (orbax-checkpoint) and resumes
      from: a fit started again with the same directory continues at its latest intact
      checkpoint. A local folder, a `file:///absolute/path` URI naming one, or a
      `gs://bucket/folder` URI; another URI raises `ValueError` here.
    - `mesh`, `strategy`: a sharding preset (docs/training.md, "Sharding presets"):
      `strategy` `"data"` (the default), `"fsdp"` or `"fsdp+tensor"` over `mesh`, a
      `jax.sharding.Mesh` of every device with axes `"data"` (and `"model"`); `None`:
      the data mesh (`dew.distributed.data_mesh()`), refused by `"fsdp+tensor"`.
    - `param_sharding`: the escape hatch (strategy `"data"` only): a callable `(path,
      leaf) -> jax.sharding.Sharding` over the mesh's devices, called once per fit for
      every array leaf of the params (`path` as `jax.tree_util.tree_flatten_with_path`
      gives it) and dividing its shape (else `fit` raises a `ValueError` naming the
      param); the EMA params and the optimizer state's params-shaped parts
      (`optax.tree_map_params`) follow it, everything else is replicated, and the
      compiled step keeps those shardings (`None`: a full copy on every device).
    - `learning_rate`: the float or optax schedule the optimizer was built with, for
      `fit(..., log_optimizer=True)` to log (`None`: read from an
      `optax.inject_hyperparams` state).
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
        arrays, static = eqx.partition(objective, eqx.is_array)
        self._objective_leaves, objective_def = jax.tree.flatten(arrays)
        self._objective_def, self._static = objective_def, static
        self._compiled: dict[Telemetry, Any] = {}
        self._names: dict[Any, tuple[str, ...]] = {}

    def fit(
        self,
        data: Dataset,
        steps: int,
        *,
        log_every: int,
        eval_every: int | None = None,
        metrics: Sequence[Metric] = (),
        tracker: ScalarTracker | None = None,
        event_sinks: Sequence[EventSink] = (),
        preview: bool = False,
        early_stopper: EarlyStopper | None = None,
        checkpoint_every: int | None = None,
        profile: Profile | None = None,
        state: TrainState | None = None,
        progress: bool = True,
        steps_per_call: int = 1,
        on_nonfinite: str = "raise",
        final_eval: bool = True,
        train_reduction: str = "mean",
        log_optimizer: bool = False,
    ) -> TrainState:
        """Train to `steps` optimizer steps and return the final state.

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
        check_cadence(
            steps, log_every, eval_every, checkpoint_every, steps_per_call, self.checkpoint_dir
        )
        raising = raises_on_nonfinite(on_nonfinite)
        mean = check_train_reduction(train_reduction)
        telemetry = optimizer_telemetry(self, log_optimizer)
        metric_set = MetricSet(metrics)
        artifacts = tracker is not None and takes_artifacts(tracker)  # refuses a non-tracker
        placement, previewing, tracker, progress = fit_setup(
            self, preview and artifacts, tracker, progress
        )
        evaluating = evaluates(data, eval_every, metric_set, previewing)
        sinks = [*event_sinks, *([TrackerEventSink(tracker)] if tracker is not None else [])]
        if not artifacts:  # a tracker that takes scalars only gets no records, no previews
            tracker = None

        checkpoints = None
        if self.checkpoint_dir is not None:
            from dew.checkpoints import Checkpointer

            checkpoints = Checkpointer(self.checkpoint_dir)
        try:
            state, data_start, stopping = starting_state(
                self, checkpoints, steps, state, placement, early_stopper
            )
            return self._run(
                data,
                steps,
                state,
                log_every=log_every,
                eval_every=eval_every if evaluating else None,
                metric_set=metric_set,
                tracker=tracker,
                sinks=sinks,
                preview=previewing,
                early_stopper=early_stopper,
                stopping=stopping,
                checkpoints=checkpoints,
                checkpoint_every=checkpoint_every,
                data_start=data_start,
                profile=profile,
                progress=progress,
                steps_per_call=steps_per_call,
                raising=raising,
                placement=placement,
                final_eval=final_eval,
                mean=mean,
                telemetry=telemetry,
            )
        finally:
            if checkpoints is not None:  # every submitted save is durable before fit returns
                closed_after_interrupt(checkpoints)

    def _initial_state(self) -> TrainState:
        """The state before the first step, with EMA params when the objective keeps them."""
        ema = self.objective.ema_decay is not None
        return TrainState.create(self.objective, self.optimizer, key=self.key, ema=ema)

    def _output_names(
        self, telemetry: Telemetry, state_def: Any, leaves: list[Any], batch: Any
    ) -> tuple[str, ...]:
        """The training metrics' names, traced once per Trainer and kind of batch (a fit
        resumed or continued with `state=` pays no second trace), after the batch's keys
        are checked against the objective's (one line naming a missing one, not a
        `KeyError` from inside the trace)."""
        shapes = tuple(
            (np.shape(leaf), str(getattr(leaf, "dtype", type(leaf).__name__)))
            for leaf in jax.tree.leaves(batch)
        )
        key = (telemetry, state_def, jax.tree.structure(batch), shapes)
        if key not in self._names:
            check_batch_keys(self.objective, batch, Split.TRAIN)
            compiled = (self._objective_def, self._static, self.optimizer)
            self._names[key] = output_names(
                *compiled, telemetry, leaves, batch, self._objective_leaves, state_def
            )
        return self._names[key]

    def _run(
        self,
        data: Dataset,
        steps: int,
        state: TrainState,
        *,
        log_every: int,
        eval_every: int | None,
        metric_set: MetricSet,
        tracker: ScalarTracker | None,
        sinks: list[EventSink],
        preview: bool,
        early_stopper: EarlyStopper | None,
        stopping: EarlyStoppingState | None,
        checkpoints: Any,
        checkpoint_every: int | None,
        data_start: int | None,
        profile: Profile | None,
        progress: bool,
        steps_per_call: int,
        raising: bool,
        placement: Placement | None,
        final_eval: bool,
        mean: bool,
        telemetry: Telemetry,
    ) -> TrainState:
        # The jitted step sees the empty history only, so a growing history never
        # changes its static fields (and never recompiles it).
        history = state.metric_history
        state = with_history(state, EMPTY_HISTORY)
        start = int(state.step)
        resumed = data_start is not None  # restored from a checkpoint
        data_start = data_origin(data.train, start, data_start)
        leaves, state_def = state_leaves(state)  # its keys as raw key data
        compiled = (self._objective_def, self._static, self.optimizer)
        if telemetry not in self._compiled:  # once per Trainer, even with unhashable statics
            self._compiled[telemetry] = compiled_steps(*compiled, telemetry=telemetry)
        step_call, fused_call = self._compiled[telemetry]
        objective_leaves, place_window = self._objective_leaves, beside(leaves)
        place_block: Any = _stack
        draw: Callable[..., list[Any]] = functools.partial(checked_block, self.objective)
        if placement is not None:  # placed on its devices (checked in the step) ...
            draw = _draw_block
        if placement is not None and is_multiprocess():  # ... or drawn and agreed by all
            draw = functools.partial(placement.draw, self.objective)
        if placement is not None:  # one compiled step for every process, over global arrays
            step_call, fused_call, objective_leaves, place_block = placement.compiled_steps(
                self._objective_def, self._static, leaves, objective_leaves, telemetry
            )
            place_window = placement.replicated
        calls = WindowedCalls(
            step_call,
            fused_call,
            objective_leaves,
            state_def,
            mean=mean,
            names_of=functools.partial(self._output_names, telemetry, state_def),
            place=place_window,
        )

        def current() -> TrainState:
            return state_of(state_def, leaves)

        engine = LoopEngine(
            stage=self.stage,
            current=current,
            history=history,
            sinks=sinks,
            tracker=tracker,
            early_stopper=early_stopper,
            stopping=stopping,
            progress=progress,
            total=steps,
            initial=min(start, steps),
            unit="step",
            metric_directions=metric_set.directions,  # recorded in FitStarted (decision 0064)
        )
        saved_step = start if checkpoints is not None and start > 0 else None
        saving = saved_step  # the step of the last save begun (a Ctrl-C may cut it short)
        if progress and resumed:
            engine.print(f"resuming at step {start} from {checkpoints.directory}")

        seen = start  # the last step whose training loss was looked at
        verified = start  # the last step whose loss and params were checked before a save

        def look(step: int, values: dict[str, float]) -> None:
            nonlocal seen
            if raising:
                note = f" (finite at step {seen}, the last step looked at)" if seen > start else ""
                check_loss(values["loss"], step, note=note)
            seen = step

        def verify(step: int) -> None:
            """Before `step`'s state is saved or returned: its loss and params are finite."""
            nonlocal verified
            if not raising or verified == step:
                return
            loss = calls.loss()  # the last step's (fetched when no log step has)
            if loss is None:  # no step ran in this fit
                return
            if seen != step:  # a checkpoint step that is not a log step fetches the loss
                look(step, {"loss": loss})
            state = engine.current()
            check_params((state.params, state.ema_params), step, loss=loss)
            verified = step

        def checkpoint(step: int) -> None:
            nonlocal saved_step, saving
            verify(step)
            saving = step
            extra: dict[str, Any] = {"data_start": data_start}
            if engine.stopping is not None:
                extra["early_stopping"] = dataclasses.asdict(engine.stopping)
            checkpoints.save(step, engine.state(), extra)
            saved_step = step
            engine.record(
                "checkpoint_requested",
                CheckpointRequested(step=step, directory=checkpoints.directory),
                step,
            )

        def interrupted() -> FitInterrupted:
            """Ctrl-C: save the last completed step (one process: several cannot agree on
            a step without a collective that may hang), then say where a new fit resumes."""
            if checkpoints is None or saving == step or is_multiprocess() or step == 0:
                return FitInterrupted(step, None if saving != saved_step else saved_step)
            try:
                checkpoint(step)
            except KeyboardInterrupt:  # a second Ctrl-C: leave without this save
                return FitInterrupted(step, None)
            return FitInterrupted(step, step)

        window = ProfileWindowTracer(profile, engine)
        step = start  # the last completed step
        done_before = engine.stopping is not None and engine.stopping.stop
        # The batches drawn since the window was last fetched: a check inside the
        # compiled step fails asynchronously, so its error may surface a few calls later.
        unsynced: list[Any] = []
        with engine.reporting_fit(
            start=start, steps=steps, completed=lambda: last_completed(current(), step)
        ):
            if isinstance(self.objective, ReportsSampling):  # its protocol, once per fit
                engine.record(SAMPLING_RECORD, sampling_record(self.objective, metric_set), start)
            try:
                if step < steps and not done_before:  # a finished run draws no batch
                    agreed = placement if placement is not None and is_multiprocess() else None
                    batches = _opened(data.train, Partition.current(), start, data_start, agreed)
                while step < steps and not done_before:
                    aligned = step % steps_per_call == 0 and step + steps_per_call <= steps
                    block = steps_per_call if aligned else 1
                    drawn = draw(batches, step, block, steps, data.batch)
                    unsynced.extend(drawn)
                    window.before(step + 1)
                    with engine.deferred(block):  # a Ctrl-C lands between steps, not inside
                        if block == 1:
                            batch = drawn[0] if placement is None else placement.batch(drawn[0])
                            leaves = calls.step(leaves, batch)
                        else:
                            leaves = calls.fused(leaves, place_block(drawn), drawn[0])
                        step += block
                    engine.advance(block)
                    window.after(step, leaves, block)
                    stop = False
                    if step % log_every == 0:
                        values = calls.values()  # the window's, then emptied
                        unsynced.clear()
                        engine.report(STEP_END, Split.TRAIN, step, values)
                        look(step, values)  # a non-finite loss is reported, then raises
                        stop = engine.update_early_stopping(Split.TRAIN, step, values)
                    last = final_eval and (step >= steps or stop)  # the cadence may miss it
                    if eval_every is not None and (step % eval_every == 0 or last):
                        stop = (
                            evaluation_event(
                                self, engine, data, metric_set, step, tracker, preview, progress
                            )
                            or stop
                        )
                    if checkpoint_every is not None and step % checkpoint_every == 0:
                        checkpoint(step)
                    if stop:
                        break
                jax.block_until_ready(leaves)  # a failure of the last steps surfaces here
            except KeyboardInterrupt:
                raise interrupted() from None
            except Exception as error:
                explained = batch_error(self.objective, unsynced) or failed_check(error)
                if explained is None:  # the batches are fine: a real error, unchanged
                    raise
                raise explained from None
            finally:
                window.close(leaves)
            if checkpoints is not None and saved_step != int(current().step):
                checkpoint(int(current().step))
            if checkpoints is not None:  # a failed save ends the fit as failed, not completed
                checkpoints.wait()
            verify(step)  # the state fit returns is checked like a saved one
        return engine.state()
