"""Scoring a configured run: the metrics its objective declares, and `dew eval`'s pass over
a run folder's latest checkpoint."""

import os
import pathlib
import warnings
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax

from dew._domains import evaluation_key, run_key
from dew._processes import is_process_zero
from dew.checkpoints import Checkpointer
from dew.checkpoints._location import is_remote
from dew.config._config import RunConfig
from dew.config._recipe import DATA_CACHE, build_objective, run_folder
from dew.evaluation import Evaluation, evaluate
from dew.metrics import Metric
from dew.objectives.base import SkipsMetrics
from dew.steps import TrainState, generation_params

__all__ = ["default_metrics", "evaluate_run", "objective_shapes"]


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
) -> Evaluation:
    """Score a run folder's checkpoint at `step` (default: the latest) on its configured
    validation data.

    The run is rebuilt from its `run.json`; its objective scores the checkpoint's
    params with `metrics` (default: the objective's `default_metrics()`) and the key
    of the evaluation event at the checkpoint's step, as the Trainer would. A default
    metric the objective leaves out for want of something (FID without pytorch-fid's
    weights) is named in one `UserWarning` line, `fid skipped: no weights at ...`, as
    `dew eval` prints it; the scores then lack it. A folder
    without run.json or checkpoints, a damaged checkpoint, or a dataset without
    validation data raises, naming the folder; a `step` with no checkpoint raises naming
    the steps there are.
    """
    folder = pathlib.Path(run_dir)
    config = RunConfig.from_run_record(folder / "run.json")
    seed = jax.random.key(config.trainer.seed)
    objective = build_objective(config, None, seed)
    key = run_key(seed)
    template = TrainState.create(
        objective,
        config.optim.build(config.trainer.steps),
        key=key,
        ema=getattr(objective, "ema_decay", None) is not None,
    )
    checkpoints: Any = folder / "checkpoints"
    if is_remote(config.trainer.checkpoint_dir) and config.trainer.name is not None:
        checkpoints, _ = run_folder(config, config.trainer.name)  # the run's remote store
    elif not checkpoints.is_dir():
        raise FileNotFoundError(f"{folder} has no checkpoints folder to evaluate.")
    try:
        with Checkpointer(checkpoints) as saved:
            state, _ = saved.restore(template, step)
    except (OSError, ValueError, KeyError) as error:  # orbax's KeyError: a damaged checkpoint
        which = "the latest checkpoint" if step is None else f"the step-{step} checkpoint"
        raise ValueError(f"cannot restore {which} under {checkpoints}: {_detail(error)}") from error
    data = config.data.build(  # a text run's token cache is read from the run folder
        batch_size=config.trainer.batch_size,
        seed=config.trainer.seed,
        cache_dir=folder / DATA_CACHE,
    )
    if data.val is None:
        raise ValueError(f"the run's dataset {config.data.name!r} has no validation data.")
    step = int(state.step)  # the checkpoint's own
    return evaluate(
        objective,
        generation_params(objective, state),
        data.val,  # evaluate reads this process's partition
        metrics=_default_metrics(objective) if metrics is None else metrics,
        key=evaluation_key(key, step),  # the Trainer's event key at `step`
        step=step,
    )


def _default_metrics(objective: Any) -> tuple[Metric, ...]:
    """`objective.default_metrics()`, each one it skips named in a warning (on process zero,
    which prints for a multi-process run)."""
    if isinstance(objective, SkipsMetrics) and is_process_zero():
        for name, why in objective.skipped_metrics().items():
            warnings.warn(f"{name} skipped: {why}", UserWarning, stacklevel=3)
    return tuple(objective.default_metrics())


def _detail(error: BaseException) -> str:
    """What went wrong, on one line: an OSError's path and reason, a KeyError's key."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{os.fsdecode(error.filename)}: {error.strerror}"
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    return str(error) or type(error).__name__
