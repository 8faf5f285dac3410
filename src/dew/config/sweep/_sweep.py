"""Search a hyperparameter space: one ordinary run per point, recorded in a ledger.

`sweep(config, space, train=..., trials=..., ledger=...)` trains one trial per point of
`space`. Each trial is `config` with the point applied by `dew.config.override` and with
`trainer.name` set to `"<config.trainer.name>/trial-<index>"`, so every trial keeps its own
record, checkpoints and tracking directory. `train(run_config)` trains it and returns its
score, a float (non-finite scores are data and are kept).

A space maps dotted paths of the run record to what a trial may take there:

- a list or tuple of choices (`[0.01, 0.003]`), or `Choice(values)`;
- `Uniform(low, high, log=False)`: a float range (random and Optuna search only);
- `IntUniform(low, high, log=False)`: an integer range, both ends included (likewise).

Three search backends ship, and `Search` is the protocol for writing another:

- `random_search` draws each path independently and reproducibly from the trial index
  (`random_search(seed=7)` for another seed);
- `grid_search` walks the cartesian product in order and stops at the grid's size;
- `optuna_search` asks Optuna's sampler (extra `hpo`); with a shared RDB storage, several
  worker processes split one sweep's trials.

The ledger is a JSON file: `{"version": 1, "space": ..., "search": ..., "config": ...,
"trials": [{"index", "overrides", "value"}], "running": [{"index", "overrides"}]}`. A
finished trial is written to it (atomically, and made durable) before it is reported to the
tracker; a rerun of the same call skips the finished trials, retrains from its start a trial
that was cut off mid-training (its checkpoints resume it) and continues. A ledger written for
another space, another search or another base configuration (`config.to_dict()`) is refused
before any training. Non-finite scores are written `"NaN"`, `"+Inf"`, `"-Inf"`.

A tracker passed to `sweep` receives each trial's score under `VALUE_TAG`
(`sweep/validation/value`, dew's `stage/split/metric` scheme) at step `index`, and its
`dew.telemetry.records.TrialFinished` record as artifact `"trial_finished"`.

```python
>>> import tempfile
>>> from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
>>> config = RunConfig(ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name="demo"))
>>> def train(run):
...     return abs(run.optim.learning_rate - 0.003) + run.trainer.batch_size / 100
>>> ledger = tempfile.mkdtemp() + "/ledger.json"
>>> space = {"optim.learning_rate": [0.01, 0.003], "trainer.batch_size": [16, 32]}
>>> trials = sweep(config, space, train=train, trials=4, ledger=ledger, search=grid_search)
>>> for trial in trials:
...     print(trial.index, trial.overrides)
0 {'optim.learning_rate': 0.01, 'trainer.batch_size': 16}
1 {'optim.learning_rate': 0.01, 'trainer.batch_size': 32}
2 {'optim.learning_rate': 0.003, 'trainer.batch_size': 16}
3 {'optim.learning_rate': 0.003, 'trainer.batch_size': 32}
>>> min(trials, key=lambda trial: trial.value).index
2

```
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import errno
import itertools
import json
import math
import numbers
import os
import pathlib
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Any

import numpy as np

from dew._json import plain, write_atomic
from dew.config import RunConfig, override
from dew.naming import Split, check_index, metric_tag
from dew.telemetry.records import TrialFinished, decode_json_value, encode_json_value
from dew.tracking import Tracker

try:  # POSIX: the ledger's lock; without it (Windows) one process per ledger
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LEDGER_VERSION",
    "OWNER_ATTR",
    "VALUE_TAG",
    "Choice",
    "GridSearch",
    "IndexedSearch",
    "IntUniform",
    "OptunaSearch",
    "RandomSearch",
    "Search",
    "SearchRun",
    "Trial",
    "Uniform",
    "grid_search",
    "optuna_search",
    "random_search",
    "sweep",
]

LEDGER_VERSION = 1
VALUE_TAG = metric_tag("sweep", Split.VALIDATION, "value")
"""The tag each trial's score is logged under, at the trial's index: `sweep/validation/value`."""
TRIAL_FINISHED = "trial_finished"
_HPO_HINT = 'pip install "dew-ml[hpo]"'
_HEX = frozenset("0123456789abcdef")
OWNER_ATTR = "dew.ledger"
"""The Optuna user attribute naming the ledger (`host:absolute path`) a trial was asked for."""


# -- the space --------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _json_value(value: Any, where: str) -> Any:
    """`value` in JSON's data model (tuples become lists, NumPy scalars Python ones)."""
    return plain(
        value,
        where,
        holder="a space",
        reserved_by="the ledger",
        nan="a space holds no NaN (it equals nothing)",
    )


@dataclasses.dataclass(frozen=True)
class Choice:
    """A categorical field: one of `values` (a non-empty tuple of distinct JSON values).

    A list or tuple in a space means the same: `{"optim.optimizer": ["adam", "sgd"]}`.
    """

    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.values, list | tuple):
            raise TypeError(f"Choice.values must be a list or tuple, got {self.values!r}.")
        if not self.values:
            raise ValueError("Choice.values is empty; give at least one value.")
        plain = tuple(_json_value(item, f"choice {item!r}") for item in self.values)
        seen: set[str] = set()
        for item in plain:
            text = json.dumps(item, sort_keys=True)
            if text in seen:
                raise ValueError(f"Choice.values {list(self.values)!r} repeats {item!r}.")
            seen.add(text)
        object.__setattr__(self, "values", plain)

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form the ledger records."""
        return {"kind": "choice", "values": list(self.values)}


def _check_bounds(kind: str, low: Any, high: Any, log: Any, integer: bool) -> None:
    check = _is_int if integer else _is_real
    allowed = "integers" if integer else "real numbers"
    for name, value in (("low", low), ("high", high)):
        if not check(value) or (not integer and not math.isfinite(value)):
            raise TypeError(f"{kind}.{name} must be finite {allowed}, got {value!r}.")
    if not isinstance(log, bool):
        raise TypeError(f"{kind}.log must be True or False, got {log!r}.")
    if not low < high:
        raise ValueError(
            f"{kind} needs low < high, got low={low!r}, high={high!r}; "
            "for a single value give a one-element list."
        )
    if log and low <= 0:
        raise ValueError(f"{kind}(log=True) needs low > 0, got low={low!r}.")


@dataclasses.dataclass(frozen=True)
class Uniform:
    """A float drawn from `[low, high]`, uniformly or (with `log=True`) log-uniformly.

    ```python
    >>> Uniform(1e-4, 1e-1, log=True)
    Uniform(low=0.0001, high=0.1, log=True)

    ```
    """

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        _check_bounds("Uniform", self.low, self.high, self.log, integer=False)
        object.__setattr__(self, "low", float(self.low))
        object.__setattr__(self, "high", float(self.high))

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form the ledger records."""
        return {"kind": "uniform", "low": self.low, "high": self.high, "log": self.log}


@dataclasses.dataclass(frozen=True)
class IntUniform:
    """An integer drawn from `low..high` (both included), uniformly or log-uniformly."""

    low: int
    high: int
    log: bool = False

    def __post_init__(self) -> None:
        _check_bounds("IntUniform", self.low, self.high, self.log, integer=True)
        object.__setattr__(self, "low", int(self.low))
        object.__setattr__(self, "high", int(self.high))

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form the ledger records."""
        return {"kind": "int_uniform", "low": self.low, "high": self.high, "log": self.log}


Field = Choice | Uniform | IntUniform
Space = dict[str, Field]


def _normalize_space(space: Mapping[str, Any]) -> Space:
    """Check `space` and turn lists into `Choice`s, keeping the order of its paths."""
    if not isinstance(space, Mapping):
        raise TypeError(f"space must be a mapping of dotted path to values, got {space!r}.")
    if not space:
        raise ValueError("space is empty; give at least one dotted path and its values.")
    normalized: Space = {}
    for path, spec in space.items():
        if not isinstance(path, str) or not path:
            raise TypeError(f"space has key {path!r}; keys are dotted paths such as 'optim.lr'.")
        if path == "trainer.name":
            raise ValueError(
                "space sets 'trainer.name', which sweep sets for each trial "
                "('<trainer.name>/trial-<index>'); sweep another path."
            )
        if isinstance(spec, Choice | Uniform | IntUniform):
            normalized[path] = spec
        elif isinstance(spec, list | tuple):
            try:
                normalized[path] = Choice(tuple(spec))
            except (TypeError, ValueError) as error:
                raise type(error)(f"space[{path!r}]: {error}") from None
        else:
            hint = f" (did you mean [{spec!r}]?)" if isinstance(spec, str | numbers.Number) else ""
            raise TypeError(
                f"space[{path!r}] is {spec!r}{hint}; give a list of choices, "
                "Uniform(low, high) or IntUniform(low, high)."
            )
    return normalized


def _space_json(space: Space) -> dict[str, Any]:
    """The canonical JSON form of a space, as stored (non-finite floats encoded)."""
    return json.loads(
        json.dumps(encode_json_value({path: spec.to_json() for path, spec in space.items()}))
    )


def _candidates(spec: Field) -> tuple[Any, ...]:
    return spec.values if isinstance(spec, Choice) else (spec.low, spec.high)


def _check_paths(config: RunConfig, space: Space) -> None:
    """Apply every value of every path to `config` alone, so an undeclared path or a
    value the config refuses raises before any training."""
    for path, spec in space.items():
        for value in _candidates(spec):
            try:
                override(config, {path: value})
            except Exception as error:
                error.add_note(f"(while checking sweep space path {path!r} with value {value!r})")
                raise


def _checked_space(config: RunConfig, space: Mapping[str, Any]) -> Space:
    """`space` normalized, every path and value applied to `config` (what `sweep` checks
    before anything is written; the `dew` command checks it before opening its tracker)."""
    normalized = _normalize_space(space)
    _check_paths(config, normalized)
    return normalized


# -- trials and search backends ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Trial:
    """One finished trial: its `index` (the trial number, `trial-<index>` in its name), the
    point it trained (`overrides`, dotted path to value, in the ledger's JSON form) and the
    score `train` returned (`value`, possibly non-finite)."""

    index: int
    overrides: dict[str, Any]
    value: float


class SearchRun(abc.ABC):
    """One sweep call's conversation with a search backend (`Search.start` returns it).

    `ask(taken)` proposes the next trial as `(index, point)`, or `None` when the search has
    nothing more to propose; `taken` holds the indices the ledger already has (finished or
    being trained), which a proposal must avoid. `tell(trial)` reports a finished trial.
    `unfinished(finished)` names the indices still missing at the end; `close()` releases
    what the run holds.
    """

    @abc.abstractmethod
    def ask(self, taken: Set[int]) -> tuple[int, dict[str, Any]] | None:
        """The next trial's index and point, or `None` when done."""

    def tell(self, trial: Trial) -> None:  # noqa: B027  (optional hook)
        """Report a finished trial (by default nothing is told)."""

    def unfinished(self, finished: Set[int]) -> list[int]:
        """The indices this search handed out, or must hand out, that `finished` (the
        ledger's finished indices) lacks once `ask` returned `None` (by default none); the
        sweep fails naming them unless a live process is still training them."""
        return []

    def close(self) -> None:  # noqa: B027  (optional hook)
        """Release what the run holds (by default nothing)."""


class Search(abc.ABC):
    """A search backend: proposes the points a sweep trains.

    - `name`: recorded in the ledger; a rerun with another name is refused.
    - `check(space)`: refuse a space the backend cannot search (called before any training).
    - `start(space, *, trials, finished, running)`: a `SearchRun` for one sweep call, given
      the trial budget, the ledger's finished trials and the trials this call will retrain
      first (`(index, point)` pairs that were cut off mid-training).

    A search whose index alone decides its point subclasses `IndexedSearch` instead.
    """

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The backend's name as the ledger records it."""

    def check(self, space: Space) -> None:  # noqa: B027  (optional hook)
        """Raise if this backend cannot search `space` (by default every space is fine)."""

    @abc.abstractmethod
    def start(
        self,
        space: Space,
        *,
        trials: int,
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
    ) -> SearchRun:
        """Begin proposing trials for one sweep call."""


class IndexedSearch(Search):
    """A search whose trial index alone decides its point: `point(space, index)`.

    Trials are proposed at the lowest index the ledger has not taken, below
    `limit(space, trials)` (by default `trials`).
    """

    @abc.abstractmethod
    def point(self, space: Space, index: int) -> dict[str, Any]:
        """The point of trial `index`: dotted path to value, for every path of `space`."""

    def limit(self, space: Space, trials: int) -> int:
        """How many trial indices this search proposes for a budget of `trials`."""
        return trials

    def start(
        self,
        space: Space,
        *,
        trials: int,
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
    ) -> SearchRun:
        return _IndexedRun(self, space, self.limit(space, trials))


class _IndexedRun(SearchRun):
    def __init__(self, search: IndexedSearch, space: Space, limit: int) -> None:
        self.search, self.space, self.limit, self.cursor = search, space, limit, 0

    def ask(self, taken: Set[int]) -> tuple[int, dict[str, Any]] | None:
        while self.cursor < self.limit and self.cursor in taken:
            self.cursor += 1
        if self.cursor >= self.limit:
            return None
        return self.cursor, self.search.point(self.space, self.cursor)

    def unfinished(self, finished: Set[int]) -> list[int]:
        return [index for index in range(self.limit) if index not in finished]


def _check_seed(seed: Any) -> int:
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}.")
    return int(seed)


@dataclasses.dataclass(frozen=True)
class RandomSearch(IndexedSearch):
    """Draw each path independently from `numpy.random.default_rng([seed, index, position])`
    (`position`: the path's place in the space), so trial `index` always gets the same point.

    `random_search` is this search with seed 0; `random_search(seed=7)` another seed. Choices
    are drawn uniformly; a range with `log=True` uniformly in log space.

    ```python
    >>> space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True), "trainer.steps": [5, 9]}
    >>> random_search.point(space, 3) == random_search.point(space, 3)
    True

    ```
    """

    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", _check_seed(self.seed))

    def __call__(self, *, seed: int = 0) -> RandomSearch:
        """This search with another seed."""
        return RandomSearch(seed=seed)

    @property
    def name(self) -> str:
        return f"random(seed={self.seed})"

    def point(self, space: Mapping[str, Any], index: int) -> dict[str, Any]:
        space = _normalize_space(space)
        point = {}
        for position, (path, spec) in enumerate(space.items()):
            rng = np.random.default_rng([self.seed, index, position])
            point[path] = _draw(spec, rng)
        return point


def _draw(spec: Field, rng: np.random.Generator) -> Any:
    if isinstance(spec, Choice):
        return spec.values[int(rng.integers(len(spec.values)))]
    if isinstance(spec, Uniform):
        if spec.log:
            value = math.exp(rng.uniform(math.log(spec.low), math.log(spec.high)))
        else:
            value = float(rng.uniform(spec.low, spec.high))
        return min(max(value, spec.low), spec.high)
    if spec.log:  # round a log-uniform draw over [low - 1/2, high + 1/2] to the nearest integer
        drawn = math.exp(rng.uniform(math.log(spec.low - 0.5), math.log(spec.high + 0.5)))
        return min(max(round(drawn), spec.low), spec.high)
    return int(rng.integers(spec.low, spec.high + 1))


@dataclasses.dataclass(frozen=True)
class GridSearch(IndexedSearch):
    """Walk the cartesian product of the choices: trial `i` is the `i`-th point in
    `itertools.product` order of the space's paths as given (the last path varies fastest).
    A budget larger than the grid stops at the grid's size. Ranges are refused.

    ```python
    >>> space = {"a": [1, 2], "b": ["x", "y"]}
    >>> [grid_search.point(space, index) for index in range(4)]  # doctest: +NORMALIZE_WHITESPACE
    [{'a': 1, 'b': 'x'}, {'a': 1, 'b': 'y'}, {'a': 2, 'b': 'x'}, {'a': 2, 'b': 'y'}]

    ```
    """

    def __call__(self) -> GridSearch:
        """This search (grid search takes no settings)."""
        return self

    @property
    def name(self) -> str:
        return "grid"

    def check(self, space: Space) -> None:
        for path, spec in space.items():
            if not isinstance(spec, Choice):
                raise ValueError(
                    f"grid_search walks lists of choices, but space path {path!r} is {spec!r}; "
                    "give a list of values, or use random_search or optuna_search for a range."
                )

    def limit(self, space: Space, trials: int) -> int:
        return min(trials, math.prod(len(spec.values) for spec in space.values()))

    def point(self, space: Mapping[str, Any], index: int) -> dict[str, Any]:
        space = _normalize_space(space)
        self.check(space)
        size = math.prod(len(spec.values) for spec in space.values())
        if not 0 <= index < size:
            raise IndexError(f"grid point {index} is outside the grid of {size} points.")
        picks = []
        for spec in reversed(list(space.values())):
            index, pick = divmod(index, len(spec.values))
            picks.append(spec.values[pick])
        return dict(zip(space, reversed(picks), strict=True))


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as error:
        raise ImportError(
            f"optuna_search needs Optuna, which is not installed: {_HPO_HINT}", name="optuna"
        ) from error
    return optuna


_OPTUNA_CHOICE = (type(None), bool, int, float, str)


@dataclasses.dataclass(frozen=True, eq=False)
class OptunaSearch(Search):
    """Ask an Optuna sampler for each trial's point and tell it every finished trial (extra
    `hpo`: `pip install "dew-ml[hpo]"`).

    Trial indices are Optuna's trial numbers. `storage=None` keeps the study in memory:
    each sweep call creates one and first tells it the ledger's trials. With an RDB storage
    URL (`"sqlite:///study.db"`, `"postgresql://..."`) and a `study_name`, the study
    persists, and several worker processes running the same sweep call split its trials:
    the storage hands out each trial number once, and a worker that draws a number at or
    beyond the budget tells it as failed and stops. Workers may share one ledger path on one
    machine (writes are locked), or keep one ledger each. Each trial is created carrying its
    ledger's name (user attribute `OWNER_ATTR`), so a rerun trains at its number a trial a
    killed worker created but never recorded, and never takes another ledger's trial.

    - `sampler`: an Optuna sampler (`None`: Optuna's default, TPE).
    - `direction`: `"minimize"` (default) or `"maximize"` the trial values.

    Choices must be None, bool, int, float or str (Optuna's categorical values). A NaN score
    is told to Optuna as a failed trial; the ledger keeps it as NaN.
    """

    storage: Any = None
    study_name: str | None = None
    sampler: Any = None
    direction: str = "minimize"

    def __post_init__(self) -> None:
        if self.direction not in ("minimize", "maximize"):
            raise ValueError(f"direction {self.direction!r} is not one of 'minimize', 'maximize'.")
        if self.storage is not None and not self.study_name:
            raise ValueError(
                f"optuna_search(storage={self.storage!r}) needs study_name=..., so reruns and "
                "other workers find the same study."
            )

    def __call__(
        self,
        *,
        storage: Any = None,
        study_name: str | None = None,
        sampler: Any = None,
        direction: str = "minimize",
    ) -> OptunaSearch:
        """This search with a storage, study name, sampler or direction."""
        return OptunaSearch(storage, study_name, sampler, direction)

    @property
    def name(self) -> str:
        return "optuna"

    def check(self, space: Space) -> None:
        _import_optuna()
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
    ) -> SearchRun:
        """Begin proposing trials; `owner` names the ledger (`sweep` passes it), which each
        trial records as user attribute `OWNER_ATTR` from the moment the study creates it."""
        return _OptunaRun(self, space, trials, finished, running, owner)


class _OptunaRun(SearchRun):
    def __init__(
        self,
        search: OptunaSearch,
        space: Space,
        trials: int,
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
        owner: str | None,
    ) -> None:
        optuna = self.optuna = _import_optuna()
        self.owner = owner
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
        self.study = optuna.create_study(
            storage=search.storage,
            study_name=search.study_name,
            sampler=search.sampler,
            direction=search.direction,
            load_if_exists=True,
        )
        if self.study.direction.name.lower() != search.direction:
            raise ValueError(
                f"Optuna study {self.study.study_name!r} exists with direction "
                f"{self.study.direction.name.lower()!r}, but optuna_search asks to "
                f"{search.direction!r}."
            )
        storage = search.storage
        where = f"study {self.study.study_name!r}"
        if storage is not None:
            where += (
                f" of storage {storage if isinstance(storage, str) else type(storage).__name__}"
            )
        existing = {trial.number: trial for trial in self.study.get_trials(deepcopy=False)}
        if existing:
            self._reconcile(existing, finished, running, where)
            self._adopt_orphans(existing, finished, running)
        else:
            self._replay(finished, running)

    def _frozen(self, state: Any, params: Mapping[str, Any], value: float | None) -> Any:
        return self.optuna.trial.create_trial(
            state=state, value=value, params=dict(params), distributions=self.distributions
        )

    def _replay(
        self, finished: Sequence[Trial], running: Sequence[tuple[int, dict[str, Any]]]
    ) -> None:
        """Tell an empty study the ledger's trials under the ledger's indices: finished ones
        as complete (failed for NaN), the ones to retrain as running, gaps as failed."""
        states = self.optuna.trial.TrialState
        entries: dict[int, tuple[Any, Mapping[str, Any], float | None]] = {}
        for trial in finished:
            if math.isnan(trial.value):
                entries[trial.index] = (states.FAIL, trial.overrides, None)
            else:
                entries[trial.index] = (states.COMPLETE, trial.overrides, trial.value)
        for index, point in running:
            entries[index] = (states.RUNNING, point, None)
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
                self.tell(trial)

    def _owned(self, trial: Any) -> bool:
        return self.owner is not None and trial.user_attrs.get(OWNER_ATTR) == self.owner

    def _adopt_orphans(
        self,
        existing: Mapping[int, Any],
        finished: Sequence[Trial],
        running: Sequence[tuple[int, dict[str, Any]]],
    ) -> None:
        """Trials this ledger's processes created that are still running in the study but
        are in neither part of the ledger: a process died between creating one and
        recording it. Both happen under the ledger's lock, which the caller holds, so no
        live process owns them. Those inside the budget are asked for again (first, at their
        number, with the parameters the study already holds); the others are failed."""
        recorded = {trial.index for trial in finished} | {index for index, _ in running}
        for number, trial in sorted(existing.items()):
            if (
                trial.state != self.optuna.trial.TrialState.RUNNING
                or number in recorded
                or not self._owned(trial)
            ):
                continue
            if number < self.trials:
                self.orphans.append(number)
            else:
                self.study.tell(number, state=self.optuna.trial.TrialState.FAIL)

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
        while self.orphans:
            number = self.orphans.pop(0)
            if number in taken:
                continue
            storage, study_id = self.study._storage, self.study._study_id
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            return number, self._suggest(self.optuna.trial.Trial(self.study, trial_id))
        if len(self.study.get_trials(deepcopy=False)) >= self.trials:
            return None
        trial = self._create()
        if trial.number >= self.trials or trial.number in taken:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            if trial.number >= self.trials:
                return None
            raise RuntimeError(
                f"Optuna gave trial number {trial.number}, which the ledger already holds: "
                "processes sharing a ledger must share an Optuna storage "
                "(optuna_search(storage=..., study_name=...))."
            )
        return trial.number, self._suggest(trial)

    def unfinished(self, finished: Set[int]) -> list[int]:
        """The trials inside the budget this ledger's processes created that are still
        running in the study and absent from `finished`."""
        return [
            trial.number
            for trial in self.study.get_trials(deepcopy=False)
            if trial.number < self.trials
            and trial.number not in finished
            and trial.state == self.optuna.trial.TrialState.RUNNING
            and self._owned(trial)
        ]

    def tell(self, trial: Trial) -> None:
        if math.isnan(trial.value):
            state = self.optuna.trial.TrialState.FAIL
            self.study.tell(trial.index, state=state, skip_if_finished=True)
        else:
            self.study.tell(trial.index, trial.value, skip_if_finished=True)


random_search = RandomSearch()
"""Random search with seed 0; `random_search(seed=...)` for another seed."""
grid_search = GridSearch()
"""Grid search over the cartesian product of the space's choices."""
optuna_search = OptunaSearch()
"""Optuna's default sampler on an in-memory study; `optuna_search(storage=..., study_name=...,
sampler=..., direction=...)` to configure it."""


# -- the ledger -------------------------------------------------------------------------------


@dataclasses.dataclass
class _State:
    finished: dict[int, Trial]
    running: dict[int, dict[str, Any]]


class _Ledger:
    """The ledger file, its lock file `<ledger>.lock` and this process's trial claims.

    Byte 0 of the lock file (a POSIX record lock) guards every read-modify-write of the
    ledger; byte `index + 1` is held while trial `index` trains, so another process can tell
    a live trial from one whose process died (the kernel drops a dead process's locks).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        space: dict[str, Any],
        search: str,
        config: dict[str, Any],
    ) -> None:
        self.path = pathlib.Path(path)
        self.owner = f"{socket.gethostname()}:{self.path.absolute()}"
        self.space, self.search = space, search
        self.config = json.loads(_dumps(config))  # as the ledger's JSON reads back
        self._header = (
            f'"version": {LEDGER_VERSION},\n "space": {_dumps(space)},\n "search": {_dumps(search)}'
            f',\n "config": {_dumps(config)}'
        )
        self.descriptor: int | None = None
        # The text last read or written and its state: a ledger no other process changed
        # is not parsed again, and each finished trial's line is encoded once.
        self._text: str | None = None
        self._state = _State({}, {})
        self._lines: dict[int, tuple[Trial, str]] = {}

    def __enter__(self) -> _Ledger:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        self.descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)  # drops this process's claims too
            self.descriptor = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover
            yield
            return
        fcntl.lockf(self.descriptor, fcntl.LOCK_EX, 1, 0)
        try:
            yield
        finally:
            fcntl.lockf(self.descriptor, fcntl.LOCK_UN, 1, 0)

    def claim(self, index: int) -> bool:
        """Hold trial `index`'s lock; False when a live process holds it."""
        if fcntl is None:  # pragma: no cover
            return True
        try:
            fcntl.lockf(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, index + 1)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def release(self, index: int) -> None:
        if fcntl is not None:
            fcntl.lockf(self.descriptor, fcntl.LOCK_UN, 1, index + 1)

    def clean(self) -> None:
        """Remove temporary files a process left when it died mid-write (under the lock)."""
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            middle = stale.name[len(self.path.name) + 2 : -len(".tmp")]
            if len(middle) == 32 and all(character in _HEX for character in middle):
                with contextlib.suppress(OSError):
                    stale.unlink()

    def _malformed(self, problem: str) -> ValueError:
        return ValueError(
            f"ledger {str(self.path)!r} is malformed: {problem}. It was left unchanged; move "
            "it away to start the sweep over."
        )

    def load(self) -> _State:
        """Read and check the ledger (call under the lock); an absent ledger is empty."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = None
        if text != self._text:
            self._state = _State({}, {}) if text is None else self._parse(text)
            self._text = text
        return _State(dict(self._state.finished), dict(self._state.running))

    def _parse(self, text: str) -> _State:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise self._malformed(f"it is not valid JSON ({error})") from None
        if not isinstance(data, dict):
            raise self._malformed(f"it holds {type(data).__name__}, not a JSON object")
        missing = [
            key for key in ("version", "space", "search", "config", "trials") if key not in data
        ]
        if missing:
            raise self._malformed(f"it has no {', '.join(map(repr, missing))}")
        if data["version"] != LEDGER_VERSION:
            raise ValueError(
                f"ledger {str(self.path)!r} has version {data['version']!r}; this dew reads "
                f"version {LEDGER_VERSION}."
            )
        if data["search"] != self.search:
            raise ValueError(
                f"ledger {str(self.path)!r} was written by search {data['search']!r}, but this "
                f"sweep uses {self.search!r}; use another ledger path for another search."
            )
        if data["config"] != self.config:
            sections = sorted(
                section
                for section in {*self.config, *(data["config"] or {})}
                if (data["config"] or {}).get(section) != self.config.get(section)
            )
            raise ValueError(
                f"ledger {str(self.path)!r} was written for another base configuration (sections "
                f"that differ: {', '.join(sections)}); its trials would not be comparable. Use "
                "another ledger path for this configuration."
            )
        if not isinstance(data["space"], dict) or list(data["space"].items()) != list(
            self.space.items()
        ):
            raise ValueError(
                f"ledger {str(self.path)!r} was written for another space: "
                f"{_space_difference(data['space'], self.space)}. Use another ledger path "
                "for this space, or sweep the space the ledger was written for."
            )
        return _State(
            self._entries(data["trials"], "trials", finished=True),
            {
                index: entry.overrides
                for index, entry in self._entries(
                    data.get("running", []), "running", finished=False
                ).items()
            },
        )

    def _entries(self, entries: Any, key: str, *, finished: bool) -> dict[int, Trial]:
        if not isinstance(entries, list):
            raise self._malformed(f"{key!r} is not a list")
        fields = {"index", "overrides", "value"} if finished else {"index", "overrides"}
        read: dict[int, Trial] = {}
        for position, entry in enumerate(entries):
            where = f"{key}[{position}]"
            if not isinstance(entry, dict) or set(entry) != fields:
                raise self._malformed(f"{where} is {entry!r}; it needs exactly {sorted(fields)}")
            index, overrides = entry["index"], entry["overrides"]
            if not _is_int(index) or index < 0:
                raise self._malformed(f"{where} has index {index!r}")
            if index in read:
                raise self._malformed(f"{key!r} holds index {index} twice")
            if not isinstance(overrides, dict) or set(overrides) != set(self.space):
                raise self._malformed(f"{where} has overrides {overrides!r} for other paths")
            overrides = {path: overrides[path] for path in self.space}
            value = decode_json_value(entry.get("value", 0.0))
            if not _is_real(value):
                raise self._malformed(f"{where} has value {entry['value']!r}")
            read[index] = Trial(index, decode_json_value(overrides), float(value))
        return read

    def store(self, state: _State) -> None:
        """Write the ledger atomically (call under the lock)."""
        lines = []
        for index, trial in sorted(state.finished.items()):
            cached = self._lines.get(index)
            if cached is None or cached[0] is not trial:
                entry = {"index": index, "overrides": trial.overrides, "value": trial.value}
                cached = self._lines[index] = (trial, _dumps(entry))
            lines.append(cached[1])
        running = [
            _dumps({"index": index, "overrides": overrides})
            for index, overrides in sorted(state.running.items())
        ]
        body = f'{self._header},\n "trials": {_lines(lines)},\n "running": {_lines(running)}'
        text = "{\n " + body + "\n}\n"
        write_atomic(self.path, text)  # fsynced, folder included
        self._text = text
        self._state = _State(dict(state.finished), dict(state.running))


def _dumps(value: Any) -> str:
    return json.dumps(encode_json_value(value), allow_nan=False)


def _lines(entries: list[str]) -> str:
    """A JSON list of encoded entries, one per line (`json.dumps(indent=...)` would not use
    the C encoder)."""
    if not entries:
        return "[]"
    return "[\n  " + ",\n  ".join(entries) + "\n ]"


def _space_difference(stored: Any, ours: dict[str, Any]) -> str:
    if not isinstance(stored, dict):
        return f"its space is {stored!r}"
    parts = []
    removed = [path for path in stored if path not in ours]
    added = [path for path in ours if path not in stored]
    if removed:
        parts.append(f"the ledger has paths {removed} this sweep does not")
    if added:
        parts.append(f"this sweep has paths {added} the ledger does not")
    for path in ours:
        if path in stored and stored[path] != ours[path]:
            parts.append(f"{path!r} is {ours[path]} here but {stored[path]} in the ledger")
    if not parts:
        parts.append(f"the paths are in another order ({list(stored)} in the ledger)")
    return "; ".join(parts)


# -- the sweep --------------------------------------------------------------------------------


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


def sweep(
    config: RunConfig,
    space: Mapping[str, Any],
    *,
    train: Callable[[RunConfig], float],
    trials: int,
    ledger: str | os.PathLike[str],
    tracker: Tracker | None = None,
    search: Search = random_search,
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
    - `ledger`: the JSON file recording the sweep. A rerun continues where the last call
      stopped and never retrains a finished trial; a ledger for another space or search is
      refused. Its folder also gets `<ledger>.lock` (the lock processes sharing it take).
    - `tracker`: receives each trial this call finishes, after it is in the ledger: its
      score as `VALUE_TAG` (`sweep/validation/value`) at step `index`, and its
      `TrialFinished` record as artifact `"trial_finished"` at step `index`.
    - `search`: `random_search` (default), `grid_search`, `optuna_search` or another `Search`.

    **Returns:** the ledger's finished trials in index order (with a shared ledger, other
    workers' trials too), each with `overrides` and `value`.

    **Resuming.** Before a trial trains, the ledger records it under `"running"`; once
    `train` returns, it moves to `"trials"` (the ledger is rewritten atomically and fsynced
    each time), then the search is told and the tracker gets it. A rerun first retrains, at
    the same index and point, each running trial whose process is gone (killed, or `train`
    raised), so its own checkpoints resume it; finished trials are neither retrained nor
    reported again. A trial killed after its ledger write but before its report is not
    reported. Processes on one machine may share a ledger (POSIX locks on `<ledger>.lock`
    tell a live trial from a dead one); one process runs one sweep per ledger at a time.

    **Raises** `RuntimeError` naming the indices when the search has nothing more to propose
    but an index it handed out (`SearchRun.unfinished`) is neither finished nor trained by a
    live process: a sweep never ends as if complete with an index missing.
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
    if not isinstance(search, Search):
        raise TypeError(
            f"search must be a Search (random_search, grid_search, optuna_search), got {search!r}."
        )
    if not callable(train):
        raise TypeError(f"train must be a callable taking a RunConfig, got {train!r}.")
    normalized = _checked_space(config, space)
    search.check(normalized)

    with _Ledger(ledger, _space_json(normalized), search.name, config.to_dict()) as book:
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
                **({"owner": book.owner} if isinstance(search, OptunaSearch) else {}),
            )
            if not book.path.exists():
                book.store(state)  # record the space and search before anything trains
        try:
            _run_trials(config, name, book, run, resume, train, tracker)
            with book.locked():
                finished = book.load().finished
                _check_complete(book, run, finished)
        finally:
            run.close()
        return [trial for _, trial in sorted(finished.items())]


def _check_complete(book: _Ledger, run: SearchRun, finished: Mapping[int, Trial]) -> None:
    """Under the lock: fail naming the indices the search handed out but nobody finished,
    unless a live process still trains them (it holds their claim)."""
    missing = []
    for index in run.unfinished(frozenset(finished)):
        if book.claim(index):  # no live process holds it
            book.release(index)
            missing.append(index)
    if missing:
        raise RuntimeError(
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
    tracker: Tracker | None,
) -> None:
    pending = iter(resume)
    for index, point in itertools.chain(pending, iter(lambda: _next(book, run), None)):
        try:
            run_config = override(config, {**point, "trainer.name": f"{name}/trial-{index}"})
            value = _score(train(run_config), index)
            trial = Trial(index, point, value)
            with book.locked():
                state = book.load()
                state.running.pop(index, None)
                state.finished[index] = trial
                book.store(state)
        finally:
            book.release(index)
        run.tell(trial)
        if tracker is not None:
            tracker.log_metrics({VALUE_TAG: trial.value}, step=index)
            record = TrialFinished(trial=index, overrides=trial.overrides, value=trial.value)
            tracker.log_artifact(TRIAL_FINISHED, record, step=index)


def _next(book: _Ledger, run: SearchRun) -> tuple[int, dict[str, Any]] | None:
    """Under the lock: ask for the next trial, claim it and record it as running."""
    with book.locked():
        state = book.load()
        proposal = run.ask(frozenset(state.finished) | frozenset(state.running))
        if proposal is None:
            return None
        index, point = proposal
        index = check_index("the trial index the search proposed", index)
        if set(point) != set(book.space):
            raise ValueError(
                f"the search proposed {dict(point)!r} for trial {index}; a point sets exactly "
                f"the space's paths {list(book.space)}."
            )
        point = _canonical({path: point[path] for path in book.space})
        if index in state.finished or index in state.running or not book.claim(index):
            raise RuntimeError(f"the search proposed trial {index}, which is already taken.")
        state.running[index] = point
        book.store(state)
        return index, point
