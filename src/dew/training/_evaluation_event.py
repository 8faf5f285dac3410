"""One evaluation event of `Trainer.fit`: the validation pass, its preview and its report."""

import sys
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
from jaxtyping import PRNGKeyArray
from tqdm.auto import tqdm

from dew import _domains
from dew._loop import Loop
from dew._pass import preview_on_process_zero, run_pass
from dew.data import Dataset, Partition, _lazily
from dew.events import VALIDATION_END
from dew.metrics import MetricSet
from dew.naming import Split, preview_name
from dew.objectives.base import Objective, ReportsSampling
from dew.steps import generation_params
from dew.tracking import Preview, Tracker
from dew.training._sampling import sampling_record

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
    objective: Objective,
    run_key: PRNGKeyArray,
    data: Dataset,
    metric_set: MetricSet,
    tracker: Tracker | None,
    preview: bool,
    loop: Loop,
    step: int,
    *,
    precision: str = "float32",
) -> None:
    """One evaluation event at `step` of the fit whose key is `run_key`: the validation
    pass (scored under the fit's `precision`), its preview, and its report (which the
    loop's policies see: an early stopper on the validation split decides there)."""
    state = loop.current()
    progress = loop.progress
    event_key = _domains.evaluation_key(run_key, step)
    if data.val is None:  # `evaluates` refuses such a fit before it starts
        raise ValueError("an evaluation event needs validation data (data.val).")
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
    params = generation_params(objective, state)  # EMA params where declared
    sampling = isinstance(objective, ReportsSampling)
    result = run_pass(
        objective,
        params,
        batches,
        metric_set,
        event_key,
        keep_first_artifact=previewing,
        conditioning=objective.conditioning_values if sampling else None,
        precision=precision,
    )
    if previewing and result.first_batch is not None:
        preview_key = _domains.preview_key(event_key)
        # every process takes part in generating it; process zero gets it to log
        artifact = preview_on_process_zero(
            objective, params, result.first_batch, preview_key, result.first_artifact
        )
        if tracker is not None and artifact is not None:
            name = preview_name(loop.stage, Split.VALIDATION, PREVIEW_NAME)
            # with what names its rows: the data's class names and tokenizer
            shown = Preview(artifact, classes=data.classes, tokenizer=data.tokenizer)
            tracker.log_artifact(name, shown, step=step)
    scores = result.scores
    counts = loop.counts_note(
        result.batches, result.records, result.uneven_shards, lambda: key_text(event_key)
    )
    if scores and sampling:  # it generated: report how
        record = sampling_record(objective, metric_set, result, key_text(event_key))
        loop.record(SAMPLING_RECORD, record, step)
    if not scores:
        if progress:
            empty = not result.batches
            what = "empty validation pass" if empty else "previewed (no metrics to score)"
            loop.print(f"step {step}  {what}{counts}")
        return
    loop.report(VALIDATION_END, Split.VALIDATION, step, scores, note=counts)
