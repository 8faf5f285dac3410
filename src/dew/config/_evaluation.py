"""Scoring a configured run: the metrics its objective declares, and `dew eval`'s pass over
a run folder's latest checkpoint."""

import itertools
import os
import warnings
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np

from dew._domains import evaluation_key, run_key
from dew._integers import check_integer
from dew._plugins import import_modules
from dew._processes import is_process_zero
from dew._run_folder import RunFolder
from dew.config._config import RunConfig
from dew.config._load import load_run
from dew.config._recipe import build_objective
from dew.data import Batches, Dataset, InOrder, StepBatches
from dew.data._indexed import Subset
from dew.evaluation import Evaluation, evaluate
from dew.metrics import Metric
from dew.naming import Split
from dew.objectives.base import AbstractObjective, SkipsMetrics

__all__ = ["default_metrics", "evaluate_run", "objective_shapes", "split_batches"]


def objective_shapes(config: RunConfig) -> Any:
    """The configured objective built on the model's shapes only (no parameter is
    initialised): enough to ask what it declares (its name, `ema_decay`, default metrics).

    ```python
    >>> from dew.config import builtin
    >>> objective = objective_shapes(builtin("tiny_jepa"))
    >>> objective.name, objective.ema_decay, len(objective.default_metrics())
    ('jepa', 0.99, 2)

    ```
    """
    import_modules(config.trainer.imports, named_by="trainer.imports")
    return eqx.filter_eval_shape(build_objective, config, None, jax.random.key(0))


def default_metrics(config: RunConfig) -> tuple[Metric, ...]:
    """The metrics the configured objective declares (`Objective.default_metrics`): what
    `dew train`, `dew sweep` and `dew eval` score a run with. The objective is built on
    the model's shapes only, so no parameter is initialised; a metric's own resources are
    loaded here (FID's weights), so call it once. Those it skips for want of something are
    `objective_shapes(config).skipped_metrics()`, which the commands print."""
    return tuple(objective_shapes(config).default_metrics())


def evaluate_run(
    run_dir: str | os.PathLike[str],
    *,
    metrics: Sequence[Metric] | None = None,
    step: int | None = None,
    split: Split | str = Split.VALIDATION,
    batches: int | None = None,
) -> Evaluation:
    """Score a run folder's checkpoint at `step` (default: the latest) on its configured
    data: the validation split (default), or the training split (`split="train"`) in one
    pass (`split_batches`); `batches` scores only the split's first `batches` batches.

    The run is loaded by `load_run` (its parameters alone: the EMA ones where its
    objective declares an `ema_decay`); its objective scores them with `metrics`
    (default: the objective's `default_metrics()`) and the key of the evaluation event at
    the checkpoint's step, under the run's `trainer.precision`, as the Trainer would. A default
    metric the objective leaves out for want of something (FID without pytorch-fid's
    weights) is named in one `UserWarning` line, `fid skipped: no weights at ...`, as
    `dew eval` prints it; the scores then lack it. A folder
    without run.json or checkpoints, a damaged checkpoint, or a dataset without
    validation data raises, naming the folder; a `step` with no checkpoint raises naming
    the steps there are. The modules the run's `trainer.imports` names are imported first.
    """
    split = _split(split)
    if batches is not None:
        batches = check_integer("evaluate_run: batches", batches, minimum=1)
    loaded = load_run(run_dir, step=step)  # the params alone, the weights the run scores with
    config = loaded.config
    data = config.data.build(  # a text run's token cache is read from the run folder
        batch_size=config.trainer.batch_size,
        seed=config.trainer.seed,
        cache_dir=RunFolder(loaded.folder).data_cache,
    )
    chosen = split_batches(data, split, batches=batches, source=config.data.name)
    objective = loaded.objective
    return evaluate(
        objective,
        loaded.params,
        chosen,  # evaluate reads this process's partition
        metrics=_default_metrics(objective) if metrics is None else metrics,
        # the Trainer's event key at the checkpoint's step
        key=evaluation_key(run_key(jax.random.key(config.trainer.seed)), loaded.step),
        step=loaded.step,
        precision=config.trainer.precision,  # as the run's own evaluations scored
    )


def _split(value: object) -> Split:
    try:
        return Split(value)
    except ValueError:
        raise ValueError(
            f"split must be {Split.VALIDATION.value!r} or {Split.TRAIN.value!r}, got {value!r}."
        ) from None


def split_batches(
    data: Dataset, split: Split | str, *, batches: int | None = None, source: str = "the dataset"
) -> Batches:
    """One pass over a split of `data`, as `dew eval --split` scores it.

    - `"validation"`: `data.val`, as every evaluation event reads it.
    - `"train"`: every training row once, in row order (`InOrder` over a step-indexed
      source's rows, `data.train.rows`), each process its strided share: the rows the run
      trains on rather than the order it drew them in, so the score depends on no seed, step
      or process count. A stream (`Dataset(train=callable)`) has neither rows to read in
      order nor an end: it needs `batches`, and gives its first `batches` batches.
    - `batches`: only the pass's first `batches` x `batch` rows (`batch` the rows of one
      process's batch) where the split has rows, whatever the process count; a stream's
      first `batches` batches in each process.

    `source` names the dataset in errors.

    **Raises:** `ValueError` for a split without data (no validation data; a training
    stream without `batches`) or a split that is neither.
    """
    split = _split(split)
    if split is Split.VALIDATION:
        if data.val is None:
            raise ValueError(
                f"the run's dataset {source!r} has no validation data (score the training split "
                "with --split train, or give the dataset a val_fraction)."
            )
        chosen: Batches = data.val
    elif isinstance(data.train, StepBatches):
        chosen = InOrder(data.train.rows, data.train.batch)
    elif batches is None:
        raise ValueError(
            f"the run's dataset {source!r} trains on a stream (its Dataset.train is an "
            "iterator, not rows read by step), which has no end: score its first N batches "
            "with --batches N (batches=N)."
        )
    else:
        chosen = data.train
    if batches is None:
        return chosen
    if isinstance(chosen, InOrder):
        first = np.arange(min(len(chosen.rows), batches * chosen.batch), dtype=np.int64)
        return InOrder(Subset(chosen.rows, first, "first rows"), chosen.batch)
    stream = chosen
    return lambda partition: itertools.islice(stream(partition), batches)


def _default_metrics(built: Any) -> tuple[Metric, ...]:
    """`objective.default_metrics()`, each one it skips named in a warning (on process zero,
    which prints for a multi-process run)."""
    objective: AbstractObjective = built
    if isinstance(objective, SkipsMetrics) and is_process_zero():
        for name, why in objective.skipped_metrics().items():
            warnings.warn(f"{name} skipped: {why}", UserWarning, stacklevel=3)
    return tuple(objective.default_metrics())
