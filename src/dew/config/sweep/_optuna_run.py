"""An Optuna search's run (`OptunaSearch.start`): the study opened and reconciled with the
ledger, each trial reserved and claimed, drawn, reported to and told."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from dew.config.sweep._search import SearchRun, SweepStateError, Trial
from dew.config.sweep._space import Choice, Space, Uniform
from dew.config.sweep._storage import open_study, shown_url, storage_errors

_HPO_HINT = 'pip install "dew-ml[hpo]"'
OWNER_ATTR = "dew.ledger"
"""The Optuna user attribute naming the ledger (`host:absolute path`) a trial was asked for."""


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as error:
        raise ImportError(
            f"optuna_search needs Optuna, which is not installed: {_HPO_HINT}", name="optuna"
        ) from error
    return optuna


def _locked_samplers(optuna: Any) -> tuple[type, ...]:
    """Optuna's samplers whose choice depends on the points the study's running trials hold
    (they avoid them), so they draw under the ledger's lock (optuna#2039)."""
    names = ("GridSampler", "BruteForceSampler")
    return tuple(getattr(optuna.samplers, name) for name in names if hasattr(optuna.samplers, name))


def _pruner(optuna: Any, pruner: Any) -> Any:
    """The Optuna pruner `pruner` names (`None` and `"none"`: Optuna's `NopPruner`, not its
    default `MedianPruner`), or `pruner` itself."""
    if pruner is None or pruner == "none":
        return optuna.pruners.NopPruner()
    if pruner == "median":
        return optuna.pruners.MedianPruner()
    if pruner == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return pruner


class _OptunaRun(SearchRun):
    def __init__(
        self,
        search: Any,
        space: Space,
        trials: int,
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
        owner: str | None,
        live: Callable[[int], bool] | None = None,
    ) -> None:
        optuna = self.optuna = _import_optuna()
        self.owner = owner
        self.live = live
        self.prunes = search.pruner not in (None, "none") and not isinstance(
            search.pruner, optuna.pruners.NopPruner
        )
        self._asked: dict[int, Any] = {}  # trial number -> its optuna.trial.Trial, to report
        self._reserved: dict[int, Any] = {}  # trial number -> its Trial, reserved, not drawn
        self.orphans: list[int] = []
        distributions = optuna.distributions
        self.distributions = {}
        for path, spec in space.items():
            if isinstance(spec, Choice):
                self.distributions[path] = distributions.CategoricalDistribution(spec.values)
            elif isinstance(spec, Uniform):
                self.distributions[path] = distributions.FloatDistribution(
                    spec.low, spec.high, log=spec.log
                )
            else:
                self.distributions[path] = distributions.IntDistribution(
                    spec.low, spec.high, log=spec.log
                )
        self.trials = trials
        self.storage = search.storage
        self.study = open_study(optuna, search, _pruner(optuna, search.pruner))
        # An in-memory study is one process's own: nothing to gain outside the lock.
        self.reserves = search.storage is not None and not isinstance(
            self.study.sampler, _locked_samplers(optuna)
        )
        with storage_errors(search.storage, opening=True):
            self._open(search, finished, running)

    def _open(
        self,
        search: Any,
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
    ) -> None:
        if self.study.direction.name.lower() != search.direction:
            raise ValueError(
                f"Optuna study {self.study.study_name!r} exists with direction "
                f"{self.study.direction.name.lower()!r}, but optuna_search asks to "
                f"{search.direction!r}."
            )
        where = f"study {self.study.study_name!r}"
        if search.storage is not None:
            where += f" of storage {shown_url(search.storage)}"
        existing = {trial.number: trial for trial in self.study.get_trials(deepcopy=False)}
        if existing:
            self._reconcile(existing, finished, running, where)
            self._adopt_orphans(existing, finished, running)
        else:
            self._replay(finished, running)

    def _frozen(
        self,
        state: Any,
        params: Mapping[str, Any],
        value: float | None,
        reports: Mapping[int, float] | None = None,
    ) -> Any:
        return self.optuna.trial.create_trial(
            state=state,
            value=value,
            params=dict(params),
            distributions=self.distributions,
            intermediate_values=dict(reports or {}),
        )

    def _replay(
        self, finished: Sequence[Trial], running: Sequence[tuple[int, dict[str, Any]]]
    ) -> None:
        """Tell an empty study the ledger's trials under the ledger's indices: finished ones
        as complete (failed for NaN, pruned when pruned, with the scores they reported: the
        pruner's intermediate values), the ones to retrain as running, gaps as failed."""
        states = self.optuna.trial.TrialState
        entries: dict[int, tuple[Any, Mapping[str, Any], float | None, Mapping[int, float]]]
        entries = {}
        for trial in finished:
            if trial.pruned:
                entry = (states.PRUNED, trial.overrides, None, trial.reports)
            elif math.isnan(trial.value):
                entry = (states.FAIL, trial.overrides, None, trial.reports)
            else:
                entry = (states.COMPLETE, trial.overrides, trial.value, trial.reports)
            entries[trial.index] = entry
        for index, point in running:
            entries[index] = (states.RUNNING, point, None, {})
        for index in range(max(entries, default=-1) + 1):
            if index in entries:
                self.study.add_trial(self._frozen(*entries[index]))
            else:  # a number no finished or resumable trial holds
                self.study.add_trial(self.optuna.trial.create_trial(state=states.FAIL))

    def _reconcile(
        self,
        existing: Mapping[int, Any],
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
        where: str,
    ) -> None:
        """Check the ledger's trials against a persistent study and tell it the finished
        trials it still holds as running (a worker stopped between ledger and study)."""
        pairs = [(trial.index, trial.overrides) for trial in finished] + list(running)
        for index, point in pairs:
            trial = existing.get(index)
            if trial is None or dict(trial.params) != dict(point):
                held = "no such trial" if trial is None else f"params {dict(trial.params)!r}"
                raise ValueError(
                    f"the ledger's trial {index} trained {dict(point)!r}, but Optuna {where} "
                    f"has {held}: the ledger was written for another study."
                )
        for trial in finished:
            if existing[trial.index].state == self.optuna.trial.TrialState.RUNNING:
                self._tell(trial)

    def _owned(self, trial: Any) -> bool:
        return self.owner is not None and trial.user_attrs.get(OWNER_ATTR) == self.owner

    def _adopt_orphans(
        self,
        existing: Mapping[int, Any],
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
    ) -> None:
        """Trials this ledger's processes created that are still running in the study but
        are in neither part of the ledger, and whose index no live process holds (`live`):
        a process died between creating one and recording it. (A process creates a trial and
        claims its index under the ledger's lock, which the caller holds, then may draw its
        point outside the lock before recording it under the lock again: while it draws, it
        holds the claim.) Those inside the budget are asked for again (first, at their
        number, with the parameters the study already holds); the others are put back as
        waiting (`_park`)."""
        recorded = {trial.index for trial in finished} | {index for index, _ in running}
        for number, trial in sorted(existing.items()):
            if (
                trial.state != self.optuna.trial.TrialState.RUNNING
                or number in recorded
                or not self._owned(trial)
                or (self.live is not None and self.live(number))
            ):
                continue
            if number < self.trials:
                self.orphans.append(number)
            else:
                self._park(trial._trial_id)

    def _park(self, trial_id: int) -> None:
        """Put a trial at or past the budget back as waiting (Optuna's enqueued state), not
        failed: it never trained, and a sweep with a larger budget takes it at its number
        (`_waiting`) instead of finding its index spent."""
        states = self.optuna.trial.TrialState
        self.study._storage.set_trial_state_values(trial_id, state=states.WAITING)

    def _waiting(
        self,
        trials: Sequence[Any],
        taken: Set[int],
        claim: Callable[[int], bool] = lambda index: True,
        release: Callable[[int], None] = lambda index: None,
    ) -> Any:
        """A waiting trial of `trials` (the study's) inside the budget (one a worker put back,
        or one enqueued with `study.enqueue_trial`), its index claimed (`claim`; skipped
        when a live process holds it), taken race-free as Optuna's `study.ask` takes one
        and marked as this ledger's; None when there is none."""
        storage = self.study._storage
        states = self.optuna.trial.TrialState
        for trial in trials:
            if (
                trial.state != states.WAITING
                or trial.number >= self.trials
                or trial.number in taken
                or not claim(trial.number)
            ):
                continue
            try:
                took = storage.set_trial_state_values(trial._trial_id, state=states.RUNNING)
            except self.optuna.exceptions.UpdateFinishedTrialError:
                took = False
            if not took:  # another worker took it first
                release(trial.number)
                continue
            if self.owner is not None:
                storage.set_trial_user_attr(trial._trial_id, OWNER_ATTR, self.owner)
            return self.optuna.trial.Trial(self.study, trial._trial_id)
        return None

    def _suggest(self, trial: Any) -> dict[str, Any]:
        """Every path's value in `trial`: the one it holds, or the sampler's draw."""
        distributions = self.optuna.distributions
        point = {}
        for path, spec in self.distributions.items():
            if isinstance(spec, distributions.CategoricalDistribution):
                point[path] = trial.suggest_categorical(path, spec.choices)
            elif isinstance(spec, distributions.FloatDistribution):
                point[path] = trial.suggest_float(path, spec.low, spec.high, log=spec.log)
            else:
                point[path] = trial.suggest_int(path, spec.low, spec.high, log=spec.log)
        return point

    def _create(self) -> Any:
        """`study.ask()`, except that the trial is created already carrying its owner, in
        the storage's one insert: a process killed at any moment after leaves a trial a
        rerun can tell as its own."""
        storage, study_id = self.study._storage, self.study._study_id
        template = self.optuna.trial.create_trial(
            state=self.optuna.trial.TrialState.RUNNING,
            user_attrs={} if self.owner is None else {OWNER_ATTR: self.owner},
        )
        trial_id = storage.create_new_trial(study_id, template_trial=template)
        return self.optuna.trial.Trial(self.study, trial_id)

    def ask(self, taken: Set[int]) -> tuple[int, dict[str, Any]] | None:
        with storage_errors(self.storage):
            return self._ask(taken)

    def _ask(self, taken: Set[int]) -> tuple[int, dict[str, Any]] | None:
        """The whole ask under the caller's lock: `_reserve` with no claims to take (the
        caller claims the index), then the sampler's draw."""
        index = self._reserve(taken, lambda index: True, lambda index: None)
        return None if index is None else self._asking(self._reserved.pop(index))

    def _refuse(self, trial: Any) -> None:
        self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        raise SweepStateError(
            f"Optuna gave trial number {trial.number}, which the ledger already holds: "
            "processes sharing a ledger must share an Optuna storage "
            "(optuna_search(storage=..., study_name=...))."
        )

    def reserve(
        self, taken: Set[int], claim: Callable[[int], bool], release: Callable[[int], None]
    ) -> int | None:
        with storage_errors(self.storage):
            return self._reserve(taken, claim, release)

    def _reserve(
        self, taken: Set[int], claim: Callable[[int], bool], release: Callable[[int], None]
    ) -> int | None:
        """`_ask` without the sampler's draw, each trial's index claimed: an orphan, a
        waiting trial or a new one (an orphan or a waiting trial whose index a live process
        holds is skipped)."""
        storage, study_id = self.study._storage, self.study._study_id
        while self.orphans:
            number = self.orphans.pop(0)
            if number in taken or not claim(number):
                continue
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            self._reserved[number] = self.optuna.trial.Trial(self.study, trial_id)
            return number
        # One read of the study per ask, as Optuna's own `study.ask` makes (with an RDB
        # storage each read is a query of every unfinished trial and its five tables).
        trials = storage.get_all_trials(study_id, deepcopy=False)
        trial = self._waiting(trials, taken, claim, release)
        if trial is None:
            if len(trials) >= self.trials:
                return None
            trial = self._create()
            if trial.number >= self.trials:  # another worker took the last number first
                self._park(trial._trial_id)
                return None
            if trial.number in taken or not claim(trial.number):
                self._refuse(trial)
        self._reserved[trial.number] = trial
        return trial.number

    def draw(self, index: int) -> dict[str, Any]:
        with storage_errors(self.storage):
            return self._asking(self._reserved.pop(index))[1]

    def _asking(self, trial: Any) -> tuple[int, dict[str, Any]]:
        """`trial`'s number and point, the trial kept to report to."""
        self._asked[trial.number] = trial
        return trial.number, self._suggest(trial)

    def unfinished(self, finished: Set[int]) -> list[int]:
        """The trials inside the budget this ledger's processes created that are still
        running in the study and absent from `finished`."""
        with storage_errors(self.storage):
            trials = self.study.get_trials(deepcopy=False)
        return [
            trial.number
            for trial in trials
            if trial.number < self.trials
            and trial.number not in finished
            and trial.state == self.optuna.trial.TrialState.RUNNING
            and self._owned(trial)
        ]

    def report(self, index: int, step: int, value: float) -> bool:
        """Report trial `index`'s score at `step` to its Optuna trial (`trial.report`) and
        return the pruner's `trial.should_prune()`; nothing without a pruner."""
        if not self.prunes:
            return False
        with storage_errors(self.storage):
            trial = self._asked.get(index)
            if trial is None:
                storage, study_id = self.study._storage, self.study._study_id
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, index)
                trial = self._asked[index] = self.optuna.trial.Trial(self.study, trial_id)
            if step not in trial._cached_frozen_trial.intermediate_values:
                trial.report(float(value), step)  # a resumed fit's repeated step: kept once
            return bool(trial.should_prune())

    def tell(self, trial: Trial) -> None:
        with storage_errors(self.storage):
            self._tell(trial)
        self._asked.pop(trial.index, None)

    def _tell(self, trial: Trial) -> None:
        # Optuna's GridSampler calls `study.stop()` when it tells the grid's last trial, which
        # outside `study.optimize` raises (after the trial is stored); a sweep stops by its
        # budget, so the request is taken as `optimize` takes it and left unread.
        local = self.study._thread_local
        looping, local.in_optimize_loop = local.in_optimize_loop, True
        try:
            self._tell_study(trial)
        finally:
            local.in_optimize_loop = looping

    def _tell_study(self, trial: Trial) -> None:
        if trial.pruned:
            state = self.optuna.trial.TrialState.PRUNED
            self.study.tell(trial.index, state=state, skip_if_finished=True)
        elif math.isnan(trial.value):
            state = self.optuna.trial.TrialState.FAIL
            self.study.tell(trial.index, state=state, skip_if_finished=True)
        else:
            self.study.tell(trial.index, trial.value, skip_if_finished=True)
