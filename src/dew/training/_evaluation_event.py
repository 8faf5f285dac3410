"""One evaluation event of `Trainer.fit`: the validation pass, its preview and its report."""

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jaxtyping import PRNGKeyArray
from tqdm.auto import tqdm

from dew import _domains
from dew._loop import LoopEngine
from dew._pass import preview_on_process_zero
from dew.data import Dataset, Partition, _lazily
from dew.evaluation import run_pass
from dew.events import VALIDATION_END
from dew.metrics import MetricSet
from dew.naming import Split, preview_name
from dew.objectives.base import ReportsSampling
from dew.steps import generation_params
from dew.tracking import Preview, ScalarTracker
from dew.training._sampling import sampling_record

if TYPE_CHECKING:
    from dew.training._trainer import Trainer

__all__ = ["PREVIEW_NAME", "SAMPLING_RECORD", "evaluates", "evaluation_event", "key_text"]

PREVIEW_NAME = "samples"
SAMPLING_RECORD = "sampling_protocol"


def key_text(key: PRNGKeyArray) -> str:
    """A key's raw data as one hex string (how the trainer prints an event key)."""
    return "".join(f"{int(word):08x}" for word in np.ravel(jax.random.key_data(key)))


def evaluates(
    data: Dataset, eval_every: int | None, metric_set: MetricSet, previewing: bool
) -> bool:
    """Whether a fit evaluates: `eval_every` is given and there is something to do (metrics
    to score, or a preview). `metrics` alone, without `eval_every`, does nothing.

    **Raises:** `ValueError` when there is something to do every `eval_every` steps but
    `data.val` is `None`: nothing would be evaluated, and nothing would say so."""
    if eval_every is None or not (metric_set.metrics or previewing):
        return False
    if data.val is None:
        asked = f"metrics {', '.join(metric_set.names)}" if metric_set.metrics else "previews"
        raise ValueError(
            f"eval_every={eval_every} asks for {asked} every {eval_every} steps, but the "
            "Dataset has no validation data (Dataset.val is None; a built-in dataset with "
            "val_fraction=0): give it validation data, or leave eval_every unset "
            "(trainer.eval_every in a RunConfig)."
        )
    return True


def evaluation_event(
    trainer: "Trainer",
    engine: LoopEngine,
    data: Dataset,
    metric_set: MetricSet,
    step: int,
    tracker: ScalarTracker | None,
    preview: bool,
    progress: bool,
) -> bool:
    """One evaluation event at `step`; returns whether the early stopper says stop."""
    state = engine.current()
    event_key = _domains.evaluation_key(trainer.key, step)
    batches: Iterable[Any] = _lazily(data.val, Partition.current())
    if progress and sys.stderr.isatty():
        batches = tqdm(
            batches,
            desc=f"evaluation at step {step}",
            unit="batch",
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )
    previewing = preview  # fit decided it: process zero's tracker and preview=True
    params = generation_params(trainer.objective, state)  # EMA params where declared
    sampling = isinstance(trainer.objective, ReportsSampling)
    result = run_pass(
        trainer.objective,
        params,
        batches,
        metric_set,
        event_key,
        keep_first_artifact=previewing,
        conditioning=trainer.objective.conditioning_values if sampling else None,
    )
    if previewing and result.first_batch is not None:
        preview_key = _domains.preview_key(event_key)
        # every process takes part in generating it; process zero gets it to log
        artifact = preview_on_process_zero(
            trainer.objective, params, result.first_batch, preview_key, result.first_artifact
        )
        if tracker is not None and artifact is not None:
            name = preview_name(engine.stage, Split.VALIDATION, PREVIEW_NAME)
            # with what names its rows: the data's class names and tokenizer
            shown = Preview(artifact, classes=data.classes, tokenizer=data.tokenizer)
            tracker.log_artifact(name, shown, step=step)
    scores = result.scores
    counts = engine.counts_note(
        result.batches, result.records, result.uneven_shards, lambda: key_text(event_key)
    )
    if scores and sampling:  # it generated: report how
        record = sampling_record(trainer.objective, metric_set, result, key_text(event_key))
        engine.record(SAMPLING_RECORD, record, step)
    if not scores:
        if progress:
            empty = not result.batches
            what = "empty validation pass" if empty else "previewed (no metrics to score)"
            engine.print(f"step {step}  {what}{counts}")
        return False
    engine.report(VALIDATION_END, Split.VALIDATION, step, scores, note=counts)
    return engine.update_early_stopping(Split.VALIDATION, step, scores)
