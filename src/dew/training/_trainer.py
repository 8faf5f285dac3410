"""`Trainer.fit`: the loop that drives the pure step functions."""

import numbers
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import optax
from jaxtyping import PRNGKeyArray
from tqdm.auto import tqdm

from dew.data import Dataset, Partition
from dew.evaluation import PREVIEW_DOMAIN, run_pass
from dew.events import BEST_MODEL, EARLY_STOP, Decision, EventSink, TrackerEventSink, TrainingEvent
from dew.metrics import Metric, MetricSet
from dew.naming import Split, check_name, metric_tag
from dew.objectives.base import Objective
from dew.steps import EMPTY_HISTORY, MetricHistory, TrainState, train_step
from dew.supervised import EarlyStopper
from dew.telemetry.records import FitEnded, FitStarted
from dew.tracking import Tracker

__all__ = ["Trainer"]

TRAIN_DOMAIN = 0x7A1
PREVIEW_NAME = "samples"


def _positive(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        allowed = "None or an integer >= 1" if optional else "an integer >= 1"
        raise ValueError(f"{name} must be {allowed}, got {value!r}.")


class Trainer:
    """Train an objective with an optax optimizer, evaluating and reporting on a cadence.

    **Arguments:**

    - `objective`: what to train (its `name` is the default stage).
    - `optimizer`: an optax `GradientTransformation` over the objective's params.
    - `key`: the run key; step keys and evaluation keys derive from it.
    - `stage`: the first segment of every metric tag (default: the objective's name).
    - `name`: the run's name (used by recipes).
    """

    def __init__(
        self,
        objective: Objective,
        optimizer: optax.GradientTransformation,
        key: PRNGKeyArray,
        *,
        stage: str | None = None,
        name: str | None = None,
    ) -> None:
        self.objective = objective
        self.optimizer = optimizer
        self.key = key
        self.stage = check_name("stage", objective.name if stage is None else stage)
        self.name = name
        arrays, static = eqx.partition(objective, eqx.is_array)
        self._objective_leaves, objective_def = jax.tree.flatten(arrays)

        def step(state_leaves: list, batch: Any, objective_leaves: list, state_def: Any):
            objective = eqx.combine(jax.tree.unflatten(objective_def, objective_leaves), static)
            state = jax.tree.unflatten(state_def, state_leaves)
            key = jax.random.fold_in(jax.random.fold_in(state.key, TRAIN_DOMAIN), state.step)
            next_state, outputs = train_step(objective, optimizer, state, batch, key)
            return jax.tree.leaves(next_state), outputs

        # The objective is partitioned and flattened once, and the state travels as a flat
        # list of leaves with its buffers donated: a step pays no Python-level pytree
        # flattening and adds no copies the hand-written loop lacks.
        self._step = jax.jit(step, donate_argnums=0, static_argnums=3)

    def fit(
        self,
        data: Dataset,
        steps: int,
        *,
        log_every: int,
        eval_every: int | None = None,
        metrics: Sequence[Metric] = (),
        tracker: Tracker | None = None,
        event_sinks: Sequence[EventSink] = (),
        preview: bool = False,
        early_stopper: EarlyStopper | None = None,
        state: TrainState | None = None,
        progress: bool = True,
    ) -> TrainState:
        """Train to `steps` optimizer steps and return the final state.

        - The training metrics of the step are reported every `log_every` steps
          (`step_end` events, tags `<stage>/train/<metric>`); between log steps they
          stay on the device.
        - Evaluation runs every `eval_every` steps only when `data.val`, `eval_every`
          and `metrics` are all given (`validation_end` events,
          `<stage>/validation/<metric>`).
        - Previews (`tracker.log_artifact("samples", ...)`) only with `preview=True`
          and a tracker; the base preview reuses the first scoring artifact.
        - The tracker is borrowed, never closed. It receives `FitStarted` and
          `FitEnded` (`completed`, `failed` with the error, or `interrupted`).
        - `progress` prints one line per log and evaluation event, and, when standard
          error is a terminal, shows a progress bar (step, loss, steps/s) over the fit
          and over each evaluation pass.
        """
        _positive("steps", steps)
        _positive("log_every", log_every)
        _positive("eval_every", eval_every, optional=True)
        metric_set = MetricSet(metrics)
        evaluating = data.val is not None and eval_every is not None and bool(metrics)
        sinks = [*event_sinks, *([TrackerEventSink(tracker)] if tracker is not None else [])]
        if state is None:
            state = TrainState.create(self.objective, self.optimizer, key=self.key)
        else:  # the step donates its input: never let fit delete the caller's arrays
            state = jax.tree.map(lambda leaf: leaf.copy() if eqx.is_array(leaf) else leaf, state)
        history = state.metric_history
        # The jitted step sees the empty history only, so a growing history never
        # changes its static fields (and never recompiles it).
        state = _with_history(state, EMPTY_HISTORY)
        start = int(state.step)
        leaves, state_def = jax.tree.flatten(state)

        def current() -> TrainState:
            return jax.tree.unflatten(state_def, leaves)

        stopping = early_stopper.init() if early_stopper is not None else None
        if tracker is not None:
            tracker.log_artifact(
                "fit_started",
                FitStarted(stage=self.stage, start_step=start, steps=steps),
                step=start,
            )
        batches = iter(data.train(Partition.current()))

        def emit(name, split, step, values=None, decision=None):
            if not sinks:
                return
            event = TrainingEvent(
                name,
                self.stage,
                split,
                step,
                _with_history(current(), history),
                values or {},
                decision,
            )
            for sink in sinks:
                sink.on_event(event)

        def judge(split, step, values):
            nonlocal stopping
            if early_stopper is None or early_stopper.source != split:
                return False
            metric = early_stopper.monitored_metric_name()
            if metric not in values:
                raise ValueError(
                    f"the early stopper monitors {metric!r} on the {split.value} split, but "
                    f"the {split.value} metrics are {sorted(values)}."
                )
            stopping = early_stopper.update(stopping, values[metric], step=step)
            decision = Decision(metric, float(values[metric]))
            if stopping.improved:
                emit(BEST_MODEL, split, step, decision=decision)
            if stopping.stop:
                emit(EARLY_STOP, split, step, decision=decision)
            return stopping.stop

        bar = tqdm(
            total=steps,
            initial=start,
            unit="step",
            disable=not (progress and sys.stderr.isatty()),
            file=sys.stderr,
            dynamic_ncols=True,
        )
        step = start
        try:
            for step in range(start + 1, steps + 1):
                try:
                    batch = next(batches)
                except StopIteration:
                    raise ValueError(
                        f"Dataset.train ran out of batches at step {step} of {steps}; "
                        "make it yield at least one batch per step (e.g. itertools.cycle)."
                    ) from None
                leaves, outputs = self._step(leaves, batch, self._objective_leaves, state_def)
                bar.update()
                stop = False
                if step % log_every == 0:
                    values = {name: float(value) for name, value in jax.device_get(outputs).items()}
                    history = history.with_values(_tags(self.stage, Split.TRAIN, values), step)
                    bar.set_postfix(loss=f"{values['loss']:.4f}", refresh=False)
                    if progress:
                        _print(self.stage, Split.TRAIN, step, values, bar)
                    emit("step_end", Split.TRAIN, step, values)
                    stop = judge(Split.TRAIN, step, values)
                if evaluating and step % eval_every == 0:
                    scores = self._evaluate(
                        current(), data, metric_set, step, tracker, preview, progress
                    )
                    if scores:
                        tags = _tags(self.stage, Split.VALIDATION, scores)
                        history = history.with_values(tags, step)
                        if progress:
                            _print(self.stage, Split.VALIDATION, step, scores, bar)
                        emit("validation_end", Split.VALIDATION, step, scores)
                        stop = judge(Split.VALIDATION, step, scores) or stop
                if stop:
                    break
        except KeyboardInterrupt:
            if tracker is not None:
                done = _completed(current(), step)
                tracker.log_artifact("fit_ended", FitEnded("interrupted", done), step=done)
            raise
        except Exception as error:
            if tracker is not None:
                done = _completed(current(), step)
                message = f"{type(error).__name__}: {error}"
                tracker.log_artifact(
                    "fit_ended", FitEnded("failed", done, error=message), step=done
                )
            raise
        finally:
            bar.close()
        final = _with_history(current(), history)
        if tracker is not None:
            tracker.log_artifact("fit_ended", FitEnded("completed", int(final.step)), step=step)
        return final

    def _evaluate(
        self,
        state: TrainState,
        data: Dataset,
        metric_set: MetricSet,
        step: int,
        tracker: Tracker | None,
        preview: bool,
        progress: bool,
    ) -> dict[str, float]:
        event_key = jax.random.fold_in(self.key, step)
        batches: Iterable[Any] = data.val(Partition.current())
        if progress and sys.stderr.isatty():
            batches = tqdm(
                batches,
                desc=f"evaluation at step {step}",
                unit="batch",
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
            )
        scores, _, _, first_artifact, first_batch = run_pass(
            self.objective, state.params, batches, metric_set, event_key
        )
        if preview and tracker is not None and first_batch is not None:
            preview_key = jax.random.fold_in(event_key, PREVIEW_DOMAIN)
            artifact = self.objective.preview(
                state.params, first_batch, preview_key, scored=first_artifact
            )
            tracker.log_artifact(PREVIEW_NAME, artifact, step=step)
        return scores


def _completed(state: TrainState, step: int) -> int:
    """The last completed step (a failed step's state may already be donated)."""
    try:
        return int(state.step)
    except RuntimeError:
        return max(step - 1, 0)


def _with_history(state: TrainState, history: MetricHistory) -> TrainState:
    return TrainState(
        state.step, state.params, state.opt_state, state.key, state.ema_params, history
    )


def _tags(stage: str, split: Split, values: dict[str, float]) -> dict[str, float]:
    return {metric_tag(stage, split, name): value for name, value in values.items()}


def _print(stage: str, split: Split, step: int, values: dict[str, float], bar: Any) -> None:
    shown = "  ".join(f"{tag} {value:.4f}" for tag, value in _tags(stage, split, values).items())
    line = f"step {step}  {shown}"
    if bar.disable:
        print(line)
    else:
        bar.write(line)  # above the bar, which redraws below it
