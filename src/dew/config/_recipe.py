"""The training recipe behind `RunConfig.train`: one run folder per named run.

Layout of a run named `name` with `trainer.checkpoint_dir = root`:

- `root/name/run.json`: the `RunRecord` (the resolved configuration and the package
  versions), written when the run first starts and never overwritten;
- `root/name/checkpoints/<step>/`: orbax checkpoints; a run started again resumes here,
  to its new `trainer.steps` when that is larger (the step budget is no part of a run's
  identity: a `step_budget` line in records.jsonl notes the change; decision 0020);
- `root/name/scalars.jsonl`, `records.jsonl`, `params.json`: the `LocalTracker` journals.

When `root` is a URI (`gs://bucket/runs`), the checkpoints go there and the local
tracker writes under `runs/<name>` in the working directory; the recipe prints that path.

Under `jax.distributed` every process trains (each reads its own `Partition`, so
`trainer.batch_size` is the rows of one process's batch and the global batch is the process
count times that); process zero alone checks and writes run.json, creates the folders and
the trackers and prints, and the checkpoints are written by every process together.
"""

import dataclasses
import functools
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax

from dew._domains import MODEL_DOMAIN, OBJECTIVE_DOMAIN, RUN_DOMAIN
from dew._json import read_json
from dew._processes import agree_process_phase, is_multiprocess, is_process_zero
from dew.config._sections import TrainerConfig
from dew.data import Dataset
from dew.data.tokenizers import check_vocabulary
from dew.metrics import Metric
from dew.objectives.base import Objective
from dew.steps import TrainState
from dew.telemetry.records import RunRecord
from dew.tracking import LocalTracker, Tracker, Trackers
from dew.training import Trainer

if TYPE_CHECKING:
    from dew.config._config import RunConfig

__all__ = ["run_folder", "train_run"]

LOCAL_ROOT = "runs"
DATA_CACHE = "data-cache"
"""The folder in a run folder where a source that caches (`text`'s tokens) keeps its cache,
unless the configuration names a `cache_dir`."""
STEP_BUDGET = "step_budget"
"""The journal artifact noting a run continued to another step total (decision 0020)."""


def is_uri(path: str) -> bool:
    """Whether `path` names a remote store (`scheme://...`) rather than a local folder."""
    return "://" in path


def run_folder(config: "RunConfig", name: str) -> tuple[str, pathlib.Path]:
    """Where a run named `name` keeps its checkpoints, and its local folder (journals
    and run.json)."""
    root = config.trainer.checkpoint_dir
    if is_uri(root):
        return f"{root.rstrip('/')}/{name}/checkpoints", pathlib.Path(LOCAL_ROOT) / name
    folder = pathlib.Path(root) / name
    return str(folder / "checkpoints"), folder


def _record(config: "RunConfig") -> RunRecord:
    return RunRecord(**config.to_dict())  # one field per section, under the section's name


def _read_run_record(path: pathlib.Path) -> dict[str, Any]:
    """The `run_record` mapping in a run folder's run.json, its sections under `RunConfig`'s
    names (a run.json written before `optimizer` became `optim` reads as `optim`); errors
    name the file."""
    saved = read_json(path, "run.json (a RunRecord's JSON)")
    if not isinstance(saved, dict) or saved.get("type") != "run_record":
        kind = saved.get("type") if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{path} holds a {kind!r} record, not a run_record.")
    old = {key: new for key, new in RunRecord.renamed.items() if key in saved and new not in saved}
    saved = {old.get(key, key): value for key, value in saved.items()}
    missing = [key for key in ("model", "data", "optim", "trainer") if key not in saved]
    if missing:
        raise ValueError(f"{path} is not a whole run_record: it lacks {', '.join(missing)}.")
    return saved


def _check_same_run(folder: pathlib.Path, record: RunRecord) -> dict[str, Any] | None:
    """A run folder's existing run.json must describe the same configuration, but for
    `trainer.steps`: the step budget is no part of a run's identity (a larger one extends
    the run). Returns the saved record (`None`: a new run)."""
    path = folder / "run.json"
    if not path.exists():
        return None
    saved = _read_run_record(path)
    # A trainer field added since the record was written reads as its default there.
    defaults = {
        field.name: field.default for field in dataclasses.fields(TrainerConfig) if field.init
    }
    if isinstance(saved.get("trainer"), dict):
        saved = {**saved, "trainer": {**defaults, **saved["trainer"]}}
    fresh = record.to_dict()

    def identity(section: str, plain: dict[str, Any]) -> Any:
        value = plain.get(section, {})
        if section == "trainer" and isinstance(value, dict):
            return {key: item for key, item in value.items() if key != "steps"}
        return value

    differing = [
        field
        for field in ("model", "data", "optim", "trainer", "objective")
        if identity(field, saved) != identity(field, fresh)
    ]
    if differing:
        raise ValueError(
            f"{path} records another configuration (sections that differ: "
            f"{', '.join(differing)}), and a run's run.json is never overwritten: give this "
            "run another trainer.name (or name=), or remove that folder to start it over."
        )
    return saved


def _step_budget(
    folder: pathlib.Path, checkpoints: str, saved: dict[str, Any] | None, steps: int
) -> dict[str, int] | None:
    """An existing run asked for another step total: the note the journal keeps of it
    (`None`: a new run, or the same total). A total below the run's latest checkpoint
    raises, naming both."""
    if saved is None:
        return None
    from dew.checkpoints import _orbax
    from dew.tracking import read_journal

    # The finished steps, read from the folder by this process alone (a CheckpointManager
    # would wait for the other processes of a multi-process run).
    latest = max(_orbax().utils.checkpoint_steps(checkpoints), default=None)
    if latest is not None and latest > steps:
        raise ValueError(
            f"the run at {folder} is at step {latest} (its latest checkpoint), past "
            f"trainer.steps={steps} (--steps): a run is extended, never shortened; train it "
            f"to {latest} steps or more (it continues from step {latest}), or give this run "
            "another trainer.name."
        )
    previous = saved["trainer"].get("steps")  # the total of the latest fit, else run.json's
    if (folder / "records.jsonl").exists():
        for _, _, entry in read_journal(folder).records:
            if entry.type == "fit_started":
                previous = entry.steps
    if previous == steps:
        return None
    return {"from_step": latest or 0, "steps": steps, "previous_steps": previous}


def build_objective(
    config: "RunConfig", objective: Objective | str | Callable[..., Objective] | None, key: Any
) -> Objective:
    model = config.model.build(key=key)
    # A builder that names `key` (JEPA's, for its predictor) gets one from the model key.
    defaults: dict[str, Any] = {"key": jax.random.fold_in(key, OBJECTIVE_DOMAIN)}
    if "seq_len" in config.data.kwargs:
        defaults["seq_len"] = config.data.kwargs["seq_len"]
    if objective is None:
        return config.objective.build(model, **defaults)
    if isinstance(objective, str):
        return dataclasses.replace(config.objective, name=objective).build(model, **defaults)
    if isinstance(objective, Objective):
        if hasattr(objective, "model"):  # train what the run records: the configured model
            return eqx.tree_at(lambda o: o.model, objective, model)
        return objective
    if callable(objective):
        built = objective(model)
        if not isinstance(built, Objective):
            raise TypeError(
                f"the objective factory returned {type(built).__name__}; it must return a "
                "dew Objective built on the model it is given."
            )
        return built
    raise TypeError(
        "objective must be None (config.objective), a registered objective name, an "
        f"Objective or a callable model -> Objective, got {type(objective).__name__}."
    )


def _check_vocabulary(config: "RunConfig", objective: Objective, data: Dataset) -> None:
    """A model whose vocabulary cannot embed the data's tokenizer's IDs is refused before
    training, naming both sizes."""
    model_vocab = getattr(getattr(objective, "model", None), "vocab_size", None)
    if data.tokenizer is not None and isinstance(model_vocab, int):
        check_vocabulary(model_vocab, data.tokenizer, model=f"the model {config.model.name!r}")


def train_run(
    config: "RunConfig",
    objective: Objective | str | Callable[..., Objective] | None = None,
    data: Dataset | None = None,
    *,
    name: str | None = None,
    metrics: Sequence[Metric] = (),
    tracker: Tracker | None = None,
    preview: bool | None = None,
    progress: bool = True,
) -> TrainState:
    """Train `config` as the run `name` (default `config.trainer.name`); see
    `RunConfig.train`."""
    if preview is not None and not isinstance(preview, bool):
        raise TypeError(f"RunConfig.train's preview must be None, True or False, got {preview!r}.")
    name = config.trainer.name if name is None else name
    if name is None:
        raise ValueError(
            "RunConfig.train needs a run name, which names its folder and its checkpoints: "
            "pass name=... or set trainer.name."
        )
    # The record holds the resolved configuration: the name the run trains under included.
    config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, name=name))
    settings = config.trainer
    checkpoints, folder = run_folder(config, name)
    record = _record(config)
    writing = is_process_zero()  # the other processes of a multi-process run write nothing
    budget = None
    if writing:
        try:
            budget = _step_budget(
                folder, checkpoints, _check_same_run(folder, record), settings.steps
            )
            # A file where a folder goes fails here, before training, not in orbax's threads.
            for needed in (folder, *(() if is_uri(checkpoints) else (pathlib.Path(checkpoints),))):
                needed.mkdir(parents=True, exist_ok=True)
        except Exception as error:
            if is_multiprocess():
                agree_process_phase("checking the run folder", error)
            raise
    if is_multiprocess():
        agree_process_phase("checking the run folder", True)
    seed = jax.random.key(settings.seed)
    built = build_objective(config, objective, jax.random.fold_in(seed, MODEL_DOMAIN))
    if data is None:
        data = config.data.build(
            batch_size=settings.batch_size, seed=settings.seed, cache_dir=folder / DATA_CACHE
        )
    _check_vocabulary(config, built, data)
    trainer = Trainer(
        built,
        config.optim.build(settings.steps),
        key=jax.random.fold_in(seed, RUN_DOMAIN),
        checkpoint_dir=checkpoints if is_uri(checkpoints) else os.fspath(checkpoints),
        # the schedule the optimizer was built with, over this fit's total (decision 0020)
        learning_rate=config.optim.learning_rate_schedule(settings.steps),
    )
    fit = functools.partial(
        trainer.fit,
        data,
        settings.steps,
        log_every=settings.log_every,
        eval_every=settings.eval_every,
        metrics=metrics,
        checkpoint_every=settings.checkpoint_every,
        preview=settings.preview if preview is None else preview,
        progress=progress,
        train_reduction=settings.train_reduction,
        log_optimizer=settings.log_optimizer,
    )
    if not writing:  # no local tracker, run.json or journals here; `tracker` is the caller's
        return fit(tracker=tracker)
    if is_uri(checkpoints) and progress:
        print(f"checkpoints at {checkpoints}; local tracking at {folder.absolute()}")
    with LocalTracker(folder) as local:
        reporting = local if tracker is None else Trackers(local, tracker)
        reporting.log_artifact("run_record", record)  # the local one writes run.json if absent
        if budget is not None:  # run.json keeps the first total; the journal, each change
            reporting.log_artifact(STEP_BUDGET, budget, step=budget["from_step"])
        reporting.log_params({"config": config.to_dict()})
        return fit(tracker=reporting)


def run_record_sections(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The configuration sections a run folder's run.json records, as
    `RunConfig.from_dict` reads them (`path`: the folder or the file)."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "run.json"
    if not path.exists():
        raise FileNotFoundError(f"no run.json at {str(path)!r}: is this a run folder?")
    saved = _read_run_record(path)
    plain = {section: saved[section] for section in ("model", "data", "optim", "trainer")}
    if saved.get("objective"):
        plain["objective"] = saved["objective"]
    total = _latest_total(path.parent)
    if total is not None and isinstance(plain["trainer"], dict):  # an extended run's total
        plain["trainer"] = {**plain["trainer"], "steps": total}
    return plain


def _latest_total(folder: pathlib.Path) -> int | None:
    """The step total of the latest fit a run folder's journal records (`None`: no journal,
    or one that cannot be read: run.json's total stands)."""
    from dew.tracking import read_journal

    if not (folder / "records.jsonl").exists():
        return None
    try:
        records = read_journal(folder).records
    except (OSError, ValueError):
        return None
    totals = [entry.steps for _, _, entry in records if entry.type == "fit_started"]
    return totals[-1] if totals else None
