"""The training recipe behind `RunConfig.train`: one run folder per named run.

Layout of a run named `name` with `trainer.checkpoint_dir = root` (every file's name and
reading are `dew._run_folder`'s):

- `root/name/run.lock`: the lock the run holds while it trains (`dew._lock`), so a second
  run of the same folder is refused, naming the holder's PID;
- `root/name/run.json`: the `RunRecord` (the resolved configuration, local paths absolute,
  and the package versions), written when the run first starts and never overwritten while
  the run has completed a step: a run that never did (its first attempt failed) starts over
  with another configuration, its old record kept as `run.json.previous` (decision 0031).
  A run's identity is its configuration, not where its folder is: `trainer.checkpoint_dir`
  and `trainer.name` are no part of the comparison, nor is `trainer.log_throughput`, which
  says what the log steps report (`dew.config._identity`);
- `root/name/data.json` (and `tokenizer.json` or `tokenizer.model`, a copy of the data's
  tokenizer file): the data's class names, tokenizer and row shapes (`dew._data_record`);
- `root/name/checkpoints/<step>/`: orbax checkpoints; a run started again resumes here,
  to its new `trainer.steps` when that is larger (the step budget is no part of a run's
  identity: a `step_budget` line in records.jsonl notes the change; decision 0020);
- `root/name/scalars.jsonl`, `records.jsonl`, `params.json`: the `LocalTracker` journals;
- `root/name/data-cache/`: a caching source's cache (`text`'s tokens).

When `root` is a `file:///absolute/path` URI, the run folder is under the folder it names.
When it is a remote store's (`gs://bucket/runs`), the checkpoints go there and the local
tracker writes under `runs/<name>` in the working directory; the recipe prints both, whatever
`progress` says. `TrainerConfig` refuses a URI of another scheme before anything is written
(decision 0030).

Everything that can be checked is checked before anything is written: the optimizer, the
objective, the data, and one training batch through the objective's host checks.

Under `jax.distributed` every process trains (each reads its own `Partition`, so
`trainer.batch_size` is the rows of one process's batch and the global batch is the process
count times that); process zero alone locks the folder, checks and writes run.json, creates
the folders and the trackers and prints, and the checkpoints are written by every process
together. Each of those phases ends with every process agreeing on its outcome, so a failure
on process zero (a tracker that cannot open) is one error on every process.
"""

import contextlib
import dataclasses
import functools
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax

from dew._checks import _as_called
from dew._data_record import write_data_record
from dew._domains import model_key, objective_key, run_key
from dew._early_stopping import EarlyStopper
from dew._lock import folder_lock
from dew._plugins import import_modules, plugin_distributions, resolve_target
from dew._processes import agreed_phase, is_process_zero
from dew._run_folder import STEP_BUDGET, Extension, RunFolder, run_folder
from dew.checkpoints._location import is_remote
from dew.config._fields import _thaw
from dew.config._identity import LOCATION, REGISTRATIONS, REPORTING, absolute_paths, comparable
from dew.config._sections import TrainerConfig
from dew.data import Dataset, Partition
from dew.data.tokenizers import check_vocabulary
from dew.metrics import Metric
from dew.naming import Split
from dew.objectives.base import Objective, check_batch_keys
from dew.steps import TrainState
from dew.telemetry.records import RunRecord, package_versions
from dew.tracking import LocalTracker, Tracker, Trackers
from dew.training import Trainer

if TYPE_CHECKING:
    from dew.config._config import RunConfig

__all__ = ["run_folder", "train_run"]

SECTIONS = ("model", "data", "optim", "trainer", "objective")


def _record(config: "RunConfig", paths: dict[str, str] | None = None) -> RunRecord:
    """The run's record: one field per section, under the section's name, the local paths
    as given (`paths`), and the package versions, the `dew.plugins` distributions loaded
    included."""
    packages = {**package_versions(), **plugin_distributions()}
    return RunRecord(**config.to_dict(), paths=paths or {}, packages=packages)


# trainer fields a rerun of the same run may change (accumulate: the same updates, less
# memory; strategy: a checkpoint restores under another sharding preset)
_NOT_IDENTITY = ("steps", "on_nonfinite", "accumulate", "strategy")


class _AnotherRunError(ValueError):
    """A run folder's run.json records another configuration: `differing` names the
    sections that differ."""

    def __init__(self, message: str, differing: list[str]) -> None:
        super().__init__(message)
        self.differing = differing


def _check_same_run(folder: pathlib.Path, record: RunRecord) -> dict[str, Any] | None:
    """A run folder's existing run.json must describe the same run: the same configuration
    but for `trainer.steps` (the step budget is no part of a run's identity: a larger one
    extends the run), `trainer.on_nonfinite` (a run that stopped on a divergence resumes with
    `on_nonfinite="continue"`), `trainer.accumulate` (the same updates in less memory),
    `trainer.strategy` (a checkpoint restores under another sharding preset), where the
    folder is (`LOCATION`), the modules that register its names (`REGISTRATIONS`) and
    whether its log steps report throughput (`REPORTING`), local paths compared absolute.
    Returns the saved record (`None`: a new run); another configuration raises
    `_AnotherRunError` naming the sections that differ."""
    run = RunFolder(folder)
    path = run.run_record
    if not path.exists():
        return None
    saved = run.record()
    # A trainer field added since the record was written reads as its default there.
    defaults = {
        field.name: _thaw(field.default)
        for field in dataclasses.fields(TrainerConfig)
        if field.init
    }
    if isinstance(saved.get("trainer"), dict):
        saved = {**saved, "trainer": {**defaults, **saved["trainer"]}}
    fresh = record.to_dict()
    ignoring = (*LOCATION, *REGISTRATIONS, *REPORTING, *_NOT_IDENTITY)
    before = comparable({field: saved.get(field, {}) for field in SECTIONS}, ignoring=ignoring)
    now = comparable({field: fresh.get(field, {}) for field in SECTIONS}, ignoring=ignoring)
    differing = [field for field in SECTIONS if before[field] != now[field]]
    if differing:
        raise _AnotherRunError(
            f"{path} records another configuration (sections that differ: "
            f"{', '.join(differing)}), and a run's run.json is never overwritten once it has "
            "completed a step: give this run another trainer.name (or name=), or remove that "
            "folder to start it over.",
            differing,
        )
    return saved


def _completed_a_step(folder: pathlib.Path, checkpoints: str) -> bool:
    """Whether the run in `folder` has completed a step: a checkpoint, or a training step in
    its journal (an unreadable journal counts as one: nothing is started over on a guess)."""
    from dew.checkpoints._orbax import orbax
    from dew.tracking._summary import summarize

    stored = is_remote(checkpoints) or pathlib.Path(checkpoints).is_dir()
    if stored and orbax().utils.checkpoint_steps(checkpoints):
        return True
    if not RunFolder(folder).scalars.exists():
        return False
    try:  # its summary, and the lines past it (decision 0046)
        return bool(summarize(folder).last)
    except (OSError, ValueError):
        return True


def _start_over(folder: pathlib.Path, differing: list[str], progress: bool) -> None:
    """A run that never completed a step, asked for another configuration: its run.json and
    params.json move aside (`*.previous`; records.jsonl keeps every record), so the new
    configuration is recorded afresh."""
    run = RunFolder(folder)
    for path in (run.run_record, run.params):
        if path.exists():
            os.replace(path, run.previous(path))
    if progress:
        print(
            f"{folder}: its run.json recorded another configuration (sections that differ: "
            f"{', '.join(differing)}) and the run never completed a step, so it starts over "
            f"with this one (the old record is now {run.previous(run.run_record).name})"
        )


def _step_budget(
    folder: pathlib.Path, checkpoints: str, saved: dict[str, Any] | None, steps: int
) -> Extension | None:
    """An existing run asked for another step total: the note the journal keeps of it
    (`None`: a new run, or the same total). A total below the run's latest checkpoint
    raises, naming both."""
    if saved is None:
        return None
    from dew.checkpoints._orbax import orbax

    # The finished steps, read from the folder by this process alone (a CheckpointManager
    # would wait for the other processes of a multi-process run).
    latest = max(orbax().utils.checkpoint_steps(checkpoints), default=None)
    if latest is not None and latest > steps:
        raise ValueError(
            f"the run at {folder} is at step {latest} (its latest checkpoint), past "
            f"trainer.steps={steps} (--steps): a run is extended, never shortened; train it "
            f"to {latest} steps or more (it continues from step {latest}), or give this run "
            "another trainer.name."
        )
    started = RunFolder(folder).fit_started()  # the total of the latest fit, else run.json's
    previous = started[-1].steps if started else saved["trainer"].get("steps")
    if previous == steps:
        return None
    return Extension(from_step=latest or 0, steps=steps, previous_steps=previous)


def build_objective(
    config: "RunConfig", objective: Objective | str | Callable[..., Objective] | None, seed: Any
) -> Objective:
    model = config.model.build(key=model_key(seed))
    # A builder that names `key` (JEPA's, for its predictor) gets its own.
    defaults: dict[str, Any] = {"key": objective_key(seed)}
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
    early_stopper: EarlyStopper | None = None,
    callbacks: Sequence[Any] = (),
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
    # The record holds the resolved configuration: the name the run trains under included,
    # local paths absolute (run.json keeps them as given too, for display).
    config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, name=name))
    config, given = absolute_paths(config)
    settings = config.trainer
    checkpoints, folder = run_folder(config, name)
    record = _record(config, given)
    seed = jax.random.key(settings.seed)
    with agreed_phase("checking the configuration"):  # before anything is written
        import_modules(settings.imports, named_by="trainer.imports")
        early_stopper = _early_stopper(settings, early_stopper)
        callbacks = (*configured_callbacks(settings), *callbacks)
        optimizer = config.optim.build(settings.steps)
        built = build_objective(config, objective, seed)
        if data is None:
            data = config.data.build(
                batch_size=settings.batch_size,
                seed=settings.seed,
                cache_dir=RunFolder(folder).data_cache,
            )
        _check_vocabulary(config, built, data)
        first = _check_first_batch(built, data)
    writing = is_process_zero()  # the other processes of a multi-process run write nothing
    with contextlib.ExitStack() as held:
        budget = None
        with agreed_phase("checking the run folder"):
            if writing:
                budget = _claim(held, folder, checkpoints, record, settings.steps, progress)
        trainer = Trainer(
            built,
            optimizer,
            key=run_key(seed),
            checkpoint_dir=checkpoints if is_remote(checkpoints) else os.fspath(checkpoints),
            # the schedule the optimizer was built with, over this fit's total (decision 0020)
            learning_rate=config.optim.learning_rate_schedule(settings.steps),
            strategy=settings.strategy,  # on the data mesh: one device's fit is unchanged
            precision=settings.precision,
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
            accumulate=settings.accumulate,
            on_nonfinite=settings.on_nonfinite,
            log_optimizer=settings.log_optimizer,
            log_throughput=settings.log_throughput,
            early_stopper=early_stopper,
            callbacks=callbacks,
        )
        if not writing:  # no local tracker, run.json or journals here; `tracker` is the caller's
            with agreed_phase("opening the trackers"):
                pass
            return fit(tracker=tracker)
        if is_remote(checkpoints):  # said whatever `progress` is: the files are in two places
            print(f"checkpoints at {checkpoints}; local tracking at {folder.absolute()}")
        # The trackers open at their first report, here: a tracker that cannot open fails
        # every process at this phase, not process zero alone inside the fit's collectives.
        with agreed_phase("opening the trackers"):
            local = held.enter_context(LocalTracker(folder))
            reporting = local if tracker is None else Trackers(local, tracker)
            reporting.log_artifact("run_record", record)  # the local one writes run.json if absent
            if budget is not None:  # run.json keeps the first total; the journal, each change
                reporting.log_artifact(STEP_BUDGET, budget._asdict(), step=budget.from_step)
            reporting.log_params({"config": config.to_dict()})
            write_data_record(folder, data, first)  # what using the model needs of the data
        return fit(tracker=reporting)


def _early_stopper(settings: TrainerConfig, given: EarlyStopper | None) -> EarlyStopper | None:
    """The stopper `[trainer.early_stopping]` declares, or the one `RunConfig.train` was
    given (a sweep's pruning stopper); both at once is an error, since a fit consults one."""
    table = dict(settings.early_stopping)
    if not table:
        return given
    if given is not None:
        raise ValueError(
            "RunConfig.train was given early_stopper= and the configuration declares "
            f"trainer.early_stopping {table}; a fit consults one stopper: remove one "
            "(a sweep with a pruner trains configurations without trainer.early_stopping)."
        )
    if "split" in table:
        table["source"] = table.pop("split")
    return EarlyStopper(**table)


def configured_callbacks(settings: TrainerConfig) -> tuple[Any, ...]:
    """The callbacks `trainer.callbacks` names (`"module:Name"`), each imported and, when
    it names a class, made with no arguments; `Trainer.fit` checks what they are."""
    made = []
    for index, target in enumerate(settings.callbacks):
        where = f"trainer.callbacks[{index}]"
        found = resolve_target(target, named_by=where)
        if isinstance(found, type):
            try:
                found = found()
            except TypeError as error:
                raise TypeError(
                    f"{where} names the class {target!r}, which dew makes with no arguments: "
                    f"{error}; give its arguments defaults, or name an instance."
                ) from None
        made.append(found)
    return tuple(made)


def _claim(
    held: contextlib.ExitStack,
    folder: pathlib.Path,
    checkpoints: str,
    record: RunRecord,
    steps: int,
    progress: bool,
) -> Extension | None:
    """Process zero's part before the run trains: lock the run folder for as long as `held`
    lasts (before anything else is written in it), check its run.json against `record`
    (starting over a run that never completed a step), create the checkpoint folder, and
    return the step-budget note (`_step_budget`)."""
    folder.mkdir(parents=True, exist_ok=True)
    held.enter_context(folder_lock(folder))
    try:
        saved = _check_same_run(folder, record)
    except _AnotherRunError as error:
        if _completed_a_step(folder, checkpoints):
            raise
        _start_over(folder, error.differing, progress)  # its first attempt failed
        saved = None
    budget = _step_budget(folder, checkpoints, saved, steps)
    if not is_remote(checkpoints):  # a file where a folder goes fails here, not in orbax's threads
        pathlib.Path(checkpoints).mkdir(parents=True, exist_ok=True)
    return budget


def _check_first_batch(objective: Objective, data: Dataset) -> Mapping[str, Any] | None:
    """The first training batch through the objective's host checks (`check_batch_keys`,
    then `check_batch`): data
    whose batches lack what the objective reads fails before anything is written (a
    `ValueError` naming what is missing). A source with no batch is left to the fit.
    Returns the batch (`None`: no batch)."""
    batches = iter(data.train(Partition.current()))
    try:
        batch = next(batches, None)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    if batch is None:
        return None
    try:
        check_batch_keys(objective, batch, Split.TRAIN)  # one line naming what is missing
        objective.check_batch(_as_called(batch))  # the types the compiled step reads
    except KeyError as error:  # a batch without what the objective reads: the user's input
        text = str(error.args[0]) if error.args else repr(error)
        raise ValueError(
            f"the data's first training batch does not fit the {objective.name!r} objective: {text}"
        ) from error
    return batch
