"""The Optuna search backend (extra `hpo`): a sampler asked for each trial's point, a study
shared through an RDB storage by the workers of one sweep."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from dew._directions import check_direction
from dew.config.sweep._optuna_run import _import_optuna, _OptunaRun
from dew.config.sweep._search import Search, SearchRun, Trial
from dew.config.sweep._space import Choice, Space
from dew.config.sweep._storage import shown_url

_OPTUNA_CHOICE = (type(None), bool, int, float, str)
PRUNERS = ("median", "hyperband", "none")
"""The pruners `optuna_search(pruner=...)` and `dew sweep --pruner` take by name."""


@dataclasses.dataclass(frozen=True, eq=False)
class OptunaSearch(Search):
    """Ask an Optuna sampler for each trial's point and tell it every finished trial (extra
    `hpo`: `pip install "dew-ml[hpo]"`).

    Trial indices are Optuna's trial numbers. `storage=None` keeps the study in memory:
    each sweep call creates one and first tells it the ledger's trials. With an RDB storage
    URL (`"sqlite:///study.db"`, `"postgresql://..."`) and a `study_name`, the study
    persists, and several worker processes running the same sweep call split its trials:
    the storage hands out each trial number once, and a worker that draws a number at or
    beyond the budget puts it back as waiting (Optuna's enqueued state, not failed: a sweep
    with a larger budget trains it) and stops. Workers started together on a fresh storage
    create the study once between them (`dew.config.sweep._storage.open_study`). Workers
    may share one ledger path on one machine (writes are locked), or keep one ledger each.
    Each trial is created carrying its ledger's name (user attribute `OWNER_ATTR`), so a
    rerun trains at its number a trial a killed worker created but never recorded, and never
    takes another ledger's trial. With a storage, a worker creates (or takes) its trial and
    claims its index under the shared ledger's lock, but the sampler draws the point outside
    it, so workers sharing a ledger sample at once (decision 0056); except Optuna's
    `GridSampler` and `BruteForceSampler`, whose choice depends on the points the other
    running trials hold (optuna#2039: concurrent workers draw the same grid point), which
    sample under the lock, so one shared ledger never trains a grid point twice.

    - `sampler`: an Optuna sampler (`None`: Optuna's default, TPE).
    - `direction`: `"minimize"` (default) or `"maximize"` the trial values (`"min"`,
      `"max"` read as them).
    - `pruner`: `None` or `"none"` (default: no pruning), `"median"` (Optuna's
      `MedianPruner()`), `"hyperband"` (`HyperbandPruner()`) or an `optuna.pruners`
      pruner. With a pruner, each trial reports its validation score at every evaluation
      event (`dew.config.sweep.pruning_stopper`, which `dew sweep` passes to
      `RunConfig.train`), and a trial the pruner stops ends there, its checkpoint kept,
      recorded in the ledger as pruned and told to Optuna as `TrialState.PRUNED`
      (decision 0055). The pruner is no part of the study's storage: a rerun passes it again.

    Choices must be None, bool, int, float or str (Optuna's categorical values). A NaN score
    is told to Optuna as a failed trial; the ledger keeps it as NaN.
    """

    storage: Any = None
    study_name: str | None = None
    sampler: Any = None
    direction: str = "minimize"
    pruner: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "direction", check_direction(self.direction, "direction"))
        if isinstance(self.pruner, str) and self.pruner not in PRUNERS:
            raise ValueError(
                f"pruner {self.pruner!r} is not one of {', '.join(map(repr, PRUNERS))} (or an "
                "optuna.pruners pruner)."
            )
        if self.storage is not None and not self.study_name:
            raise ValueError(
                f"optuna_search(storage={shown_url(self.storage)!r}) needs study_name=..., so "
                "reruns and other workers find the same study."
            )

    def __call__(
        self,
        *,
        storage: Any = None,
        study_name: str | None = None,
        sampler: Any = None,
        direction: str = "minimize",
        pruner: Any = None,
    ) -> OptunaSearch:
        """This search with a storage, study name, sampler, direction or pruner."""
        return OptunaSearch(storage, study_name, sampler, direction, pruner)

    @property
    def name(self) -> str:
        return "optuna"

    def check(self, space: Space) -> None:
        optuna = _import_optuna()
        if not isinstance(self.pruner, str | None | optuna.pruners.BasePruner):
            raise TypeError(
                f"pruner must be one of {', '.join(map(repr, PRUNERS))}, None or an "
                f"optuna.pruners pruner, got {self.pruner!r}."
            )
        for path, spec in space.items():
            if isinstance(spec, Choice):
                for value in spec.values:
                    if not isinstance(value, _OPTUNA_CHOICE):
                        raise ValueError(
                            f"optuna_search takes choices of None, bool, int, float or str; "
                            f"space path {path!r} has {value!r}."
                        )

    def start(
        self,
        space: Space,
        *,
        trials: int,
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
        owner: str | None = None,
        live: Callable[[int], bool] | None = None,
    ) -> SearchRun:
        """Begin proposing trials; `owner` names the ledger (`sweep` passes it), which each
        trial records as user attribute `OWNER_ATTR` from the moment the study creates it.
        `live(index)` says whether a live process holds trial `index`'s claim in the ledger
        (`sweep` passes it; by default none does): such a trial, created but not yet
        recorded, is that process's, not an orphan to adopt."""
        return _OptunaRun(self, space, trials, finished, running, owner, live)


optuna_search = OptunaSearch()
"""Optuna's default sampler on an in-memory study; `optuna_search(storage=..., study_name=...,
sampler=..., direction=...)` to configure it."""
