"""The sweep driver: `sweep` trains one trial per point a search proposes, through the ledger."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from dew._directions import canonical_direction
from dew._processes import agreed_phase as _phase
from dew._processes import broadcast_json, is_multiprocess, is_process_zero
from dew.config import RunConfig, override
from dew.config.sweep._ledger import MOST_TRIALS, _EntryError, read_entry
from dew.config.sweep._ledger_file import _Ledger
from dew.config.sweep._optuna import OptunaSearch
from dew.config.sweep._pruning import training
from dew.config.sweep._search import Search, SearchRun, SweepStateError, Trial, random_search
from dew.config.sweep._space import _checked_space, _is_int, _is_real
from dew.naming import Split, metric_tag
from dew.telemetry.records import TrialFinished, decode_json_value, encode_json_value
from dew.tracking import ScalarTracker
from dew.tracking._protocol import takes_artifacts

VALUE_TAG = metric_tag("sweep", Split.VALIDATION, "value")
"""The tag each trial's score is logged under, at the trial's index: `sweep/validation/value`."""
TRIAL_FINISHED = "trial_finished"


def _score(value: Any, index: int) -> float:
    if hasattr(value, "shape") and hasattr(value, "item") and value.shape == ():
        value = value.item()
    if not _is_real(value):
        raise TypeError(
            f"train returned {value!r} of type {type(value).__name__} for trial {index}; it "
            "must return the trial's score as a float."
        )
    return float(value)


def _canonical(point: Mapping[str, Any]) -> dict[str, Any]:
    """A point as the ledger stores it, so a fresh trial and its replay look the same."""
    return decode_json_value(json.loads(json.dumps(encode_json_value(dict(point)))))


def _with_pruner(search: Search, pruner: Any) -> Search:
    """`search` with `sweep(pruner=...)` in it: an `optuna_search` given one pruner, once."""
    if pruner is None or pruner == "none":
        return search
    if not isinstance(search, OptunaSearch):
        raise ValueError(
            f"pruner={pruner!r} needs search=optuna_search (an Optuna pruner decides from the "
            f"scores the study's other trials reported), got the {search.name} search."
        )
    if search.pruner is not None and search.pruner != "none" and search.pruner is not pruner:
        raise ValueError(
            f"pruner={pruner!r} and optuna_search(pruner={search.pruner!r}) both name a "
            "pruner; give it once."
        )
    return dataclasses.replace(search, pruner=pruner)


def sweep(
    config: RunConfig,
    space: Mapping[str, Any],
    *,
    train: Callable[[RunConfig], float],
    trials: int,
    ledger: str | os.PathLike[str],
    tracker: ScalarTracker | None = None,
    search: Search = random_search,
    direction: str = "minimize",
    pruner: Any = None,
) -> list[Trial]:
    """Train one trial per point of `space` and return the ledger's finished trials.

    **Arguments:**

    - `config`: the base run; it must set `trainer.name`. Trial `i` is `config` with its
      point applied (`dew.config.override`) and `trainer.name` set to `"<name>/trial-<i>"`.
    - `space`: dotted path to a list of choices, a `Uniform` or an `IntUniform`. Every path
      and value is applied to `config` before any training, so an undeclared path raises.
    - `train`: trains one trial's `RunConfig` and returns its score (a float; NaN and
      infinities are kept as data).
    - `trials`: the trial budget (indices `0 .. trials - 1`; grid search stops earlier when
      the grid is smaller).
    - `ledger`: the JSON-lines file recording the sweep. A rerun continues where the last call
      stopped and never retrains a finished trial; a ledger for another space or search is
      refused. Its folder also gets `<ledger>.lock` (the lock processes sharing it take).
    - `tracker`: receives each trial this call finishes, after it is in the ledger: its
      score as `VALUE_TAG` (`sweep/validation/value`) at step `index`, and its
      `TrialFinished` record as artifact `"trial_finished"` at step `index` (not a
      tracker that takes scalars only, `dew.tracking.ScalarTracker`).
    - `search`: `random_search` (default), `grid_search`, `optuna_search` or another `Search`.
    - `direction`: `"minimize"` (default) or `"maximize"` the score (`"min"`, `"max"` read
      as them): the ledger records it (`dew runs` shows a sweep's best trial by it) and
      refuses a rerun with the other. `dew sweep` passes the direction its `--metric`
      declares (`Metric.direction`) unless `--direction` is given (decision 0064).
    - `pruner`: `"median"`, `"hyperband"`, an `optuna.pruners` pruner, or `None` / `"none"`
      (default: no pruning), as `dew sweep --pruner`: the same as passing it to
      `optuna_search(pruner=...)`, so it needs `search=optuna_search` (an Optuna pruner
      decides from the other trials' reported scores, which only an Optuna study keeps).

    **Returns:** the ledger's finished trials in index order (with a shared ledger, other
    workers' trials too), each with `overrides` and `value` (and the pruned ones with
    `pruned=True`).

    **Pruning.** With `search=optuna_search(pruner=...)`, `train` reports its validation
    score at each evaluation event through `pruning_stopper(metric)`, the early stopper it
    passes to `RunConfig.train(early_stopper=...)` (or `Trainer.fit`): each score goes to
    the Optuna trial (`trial.report`), and when the pruner prunes the trial the fit stops
    there as early stopping stops it (checkpoint saved) and `train` returns its score. The
    ledger records the trial as pruned, with the scores it reported, and Optuna is told
    `TrialState.PRUNED`; a rerun never retrains it, and an in-memory study is told every
    trial's reported scores again from the ledger (decision 0055). Not under
    `jax.distributed` (a `ValueError`).

    **Resuming.** Before a trial trains, the ledger records it as running; once `train`
    returns, as finished (each one line appended to the ledger and fsynced), then the search
    is told and the tracker gets it. A rerun first retrains, at
    the same index and point, each running trial whose process is gone (killed, or `train`
    raised), so its own checkpoints resume it; finished trials are neither retrained nor
    reported again. A trial killed after its ledger write but before its report is not
    reported. Processes on one machine may share a ledger (POSIX locks on `<ledger>.lock`
    tell a live trial from a dead one); one process runs one sweep per ledger at a time.

    **Several processes.** Under `jax.distributed` every process calls `sweep` alike and
    every process trains every trial, together: process zero alone opens the ledger and the
    search (an Optuna storage included), claims each trial and shares its index and point
    with the others (`broadcast_json`), records the score its own `train` returned and
    reports to `tracker` (the other processes' `tracker` and scores are unused). A failure
    on one process while choosing, training or recording a trial raises on all of them;
    every process returns process zero's list.

    **Raises** `SweepStateError` (a `RuntimeError`) naming the indices when the search has
    nothing more to propose but an index it handed out (`SearchRun.unfinished`) is neither
    finished nor trained by a live process: a sweep never ends as if complete with an index
    missing.
    """
    name = config.trainer.name
    if not name:
        raise ValueError(
            f"sweep needs config.trainer.name (got {name!r}): trials run as "
            "'<trainer.name>/trial-<index>', and trials sharing one name would resume from "
            "each other's checkpoints. Set TrainerConfig(name=...)."
        )
    if not _is_int(trials) or trials < 1:
        raise ValueError(f"trials must be an integer >= 1, got {trials!r}.")
    if trials > MOST_TRIALS:
        raise ValueError(
            f"trials must be at most 2**63 - 1 (trial i holds byte i + 1 of the ledger's lock "
            f"file, whose offsets are 64-bit), got {trials!r}."
        )
    if not isinstance(search, Search):
        raise TypeError(
            f"search must be a Search (random_search, grid_search, optuna_search), got {search!r}."
        )
    if not callable(train):
        raise TypeError(f"train must be a callable taking a RunConfig, got {train!r}.")
    canonical = canonical_direction(direction)
    if canonical is None:
        raise ValueError(
            f"direction must be 'minimize' or 'maximize', got {direction!r} ('min' and 'max' "
            "are read as them)."
        )
    direction = canonical
    search = _with_pruner(search, pruner)
    normalized = _checked_space(config, space)
    search.check(normalized)
    if is_multiprocess() and getattr(search, "pruner", None) not in (None, "none"):
        raise ValueError(
            "a sweep with a pruner runs in one process per trial: the pruner's decision is "
            "made where the Optuna trial is, on process zero alone; run it without "
            "jax.distributed (several sweep workers instead), or without the pruner."
        )

    if is_multiprocess() and not is_process_zero():
        return _follow(config, name, train)
    with contextlib.ExitStack() as stack:
        with _phase("opening the sweep's ledger and search"):
            book = stack.enter_context(
                _Ledger(ledger, normalized, search.name, config.to_dict(), direction, trials)
            )
            with book.locked():
                book.clean()
                state = book.load()
                resume = [
                    (index, point)
                    for index, point in sorted(state.running.items())
                    if index < trials and book.claim(index)
                ]
                run = search.start(
                    normalized,
                    trials=trials,
                    finished=[trial for _, trial in sorted(state.finished.items())],
                    running=resume,
                    **(
                        {"owner": book.owner, "live": lambda index: _held(book, index)}
                        if isinstance(search, OptunaSearch)
                        else {}
                    ),
                )
                stack.callback(run.close)
                book.begin()  # the space and search recorded before anything trains
        _run_trials(config, name, book, run, resume, train, tracker, direction)
        with _phase("finishing the sweep"), book.locked():
            finished = book.load().finished
            _check_complete(book, run, finished)
        done = [trial for _, trial in sorted(finished.items())]
        if is_multiprocess():  # every process returns the same trials
            broadcast_json([_trial_json(trial) for trial in done])
        return done


def _trial_json(trial: Trial) -> dict[str, Any]:
    return encode_json_value(
        {"index": trial.index, "overrides": trial.overrides, "value": trial.value}
    )


def _follow(config: RunConfig, name: str, train: Callable[[RunConfig], float]) -> list[Trial]:
    """A process other than zero: train each trial process zero shares, until it shares
    `None`; return the trials process zero's ledger holds."""
    with _phase("opening the sweep's ledger and search"):
        pass
    while True:
        with _phase("choosing the next trial"):
            pass
        proposal = broadcast_json(None)
        if proposal is None:
            break
        index, point = proposal["index"], decode_json_value(proposal["overrides"])
        with _phase(f"training trial {index}"):
            train(override(config, {**point, "trainer.name": f"{name}/trial-{index}"}))
        for phase in ("recording", "reporting"):
            with _phase(f"{phase} trial {index}"):
                pass
    with _phase("finishing the sweep"):
        pass
    return [
        Trial(entry["index"], entry["overrides"], float(entry["value"]))
        for entry in decode_json_value(broadcast_json(None))
    ]


def _held(book: _Ledger, index: int) -> bool:
    """Whether a live process holds trial `index`'s claim (not this one: a process's own
    claim is granted it again, and released here)."""
    if book.claim(index):
        book.release(index)
        return False
    return True


def _check_complete(book: _Ledger, run: SearchRun, finished: Mapping[int, Trial]) -> None:
    """Under the lock: fail naming the indices the search handed out but nobody finished,
    unless a live process still trains them (it holds their claim)."""
    missing = [index for index in run.unfinished(frozenset(finished)) if not _held(book, index)]
    if missing:
        raise SweepStateError(
            f"the sweep of ledger {str(book.path)!r} ended with trials {missing} unfinished "
            "and no live process training them; run the sweep again to train them."
        )


def _run_trials(
    config: RunConfig,
    name: str,
    book: _Ledger,
    run: SearchRun,
    resume: list[tuple[int, dict[str, Any]]],
    train: Callable[[RunConfig], float],
    tracker: ScalarTracker | None,
    direction: str = "minimize",
) -> None:
    # A tracker that takes scalars only gets the value alone; a non-tracker is refused now.
    records = tracker if tracker is not None and takes_artifacts(tracker) else None
    pending = iter(resume)
    proposals = itertools.chain(pending, iter(lambda: _next(book, run), None))
    while True:
        with _phase("choosing the next trial"):
            proposal = next(proposals, None)
        if is_multiprocess():  # the others train what process zero claimed
            shared = None if proposal is None else {"index": proposal[0], "overrides": proposal[1]}
            broadcast_json(None if shared is None else encode_json_value(shared))
        if proposal is None:
            return
        index, point = proposal
        try:
            with _phase(f"training trial {index}"), training(run, index, direction) as reports:
                run_config = override(config, {**point, "trainer.name": f"{name}/trial-{index}"})
                value = _score(train(run_config), index)
            with _phase(f"recording trial {index}"):
                pruned = reports.pruned_at is not None
                trial = Trial(index, point, value, pruned=pruned, reports=reports.reports)
                with book.locked():
                    book.load()
                    book.finish(trial)
        finally:
            book.release(index)
        with _phase(f"reporting trial {index}"):
            run.tell(trial)
            if tracker is not None:
                tracker.log_metrics({VALUE_TAG: trial.value}, step=index)
            if records is not None:
                record = TrialFinished(trial=index, overrides=trial.overrides, value=trial.value)
                records.log_artifact(TRIAL_FINISHED, record, step=index)


def _next(book: _Ledger, run: SearchRun) -> tuple[int, dict[str, Any]] | None:
    """The next trial, claimed and recorded as running: asked for under the lock, or, for a
    run that `reserves`, reserved and claimed under the lock, drawn outside it, and
    recorded under it again (decision 0056)."""
    if not run.reserves:
        with book.locked():
            state = book.load()
            proposal = run.ask(state.taken())
            if proposal is None:
                return None
            index, point = _checked(book, *proposal)
            if index in state.finished or index in state.running or not book.claim(index):
                raise SweepStateError(f"the search proposed trial {index}, which is already taken.")
            book.start(index, point)
            return index, point
    with book.locked():
        reserved = run.reserve(book.load().taken(), book.claim, book.release)
    if reserved is None:
        return None
    # The claim is held from here to the trial's end: to a process reopening the ledger
    # meanwhile, the trial created but not yet recorded is this live process's, no orphan.
    try:
        point = run.draw(reserved)
        with book.locked():
            state = book.load()
            index, point = _checked(book, reserved, point)
            if index != reserved or index in state.finished or index in state.running:
                raise SweepStateError(f"the search proposed trial {index}, which is already taken.")
            book.start(index, point)
    except BaseException:
        book.release(reserved)
        raise
    return index, point


def _checked(book: _Ledger, index: Any, point: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """A proposal as the ledger would read it back; one it would refuse is refused before it
    is written."""
    try:
        entry = encode_json_value({"index": index, "overrides": dict(point)})
        trial = read_entry(
            entry, "the proposal", space=book.fields, budget=book.trials, finished=False
        )
    except _EntryError as error:
        raise ValueError(
            f"the search proposed {dict(point)!r} for trial {index!r}: {error}."
        ) from None
    return trial.index, _canonical(trial.overrides)
