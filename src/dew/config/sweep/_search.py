"""The search protocol (`Search`, `SearchRun`, `Trial`) and the indexed backends: random and grid
search."""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import numpy as np

from dew.config.sweep._space import Choice, Field, Space, Uniform, _is_int, _normalize_space


@dataclasses.dataclass(frozen=True)
class Trial:
    """One finished trial: its `index` (the trial number, `trial-<index>` in its name), the
    point it trained (`overrides`, dotted path to value, in the ledger's JSON form) and the
    score `train` returned (`value`, possibly non-finite).

    With a pruner (`optuna_search(pruner=...)`), `reports` holds the validation score the
    trial reported at each evaluation step (`{step: value}`, Optuna's intermediate values)
    and `pruned` whether the pruner stopped it: its `value` is then its score where it
    stopped, not comparable to a trial trained to its end (decision 0055)."""

    index: int
    overrides: dict[str, Any]
    value: float
    pruned: bool = False
    reports: dict[int, float] = dataclasses.field(default_factory=dict)


class SweepStateError(RuntimeError, ValueError):
    """A sweep that cannot go on as its ledger and search stand: an index handed out but
    neither finished nor trained by a live process, or a search proposing an index the
    ledger already holds (processes sharing a ledger but not an Optuna storage). The user's
    to fix (rerun, or share the storage), so `dew sweep` says it in one line, exit status 2;
    a `RuntimeError` as before, and a `ValueError` for dew's one-line errors."""


class SearchRun(abc.ABC):
    """One sweep call's conversation with a search backend (`Search.start` returns it).

    `ask(taken)` proposes the next trial as `(index, point)`, or `None` when the search has
    nothing more to propose; `taken` holds the indices the ledger already has (finished or
    being trained), which a proposal must avoid. `tell(trial)` reports a finished trial.
    `unfinished(finished)` names the indices still missing at the end; `close()` releases
    what the run holds. A run that `prunes` takes each trial's validation scores as it
    trains (`report`) and says when its pruner stops the trial.

    `ask` runs under the ledger's lock, so processes sharing a ledger ask one at a time. A
    run whose point takes long to choose (a sampler) may instead set `reserves` and split
    the ask in two: `reserve(taken, claim, release)` under the lock takes the next index and
    claims it (`claim(index)` holds the index's lock in the ledger, False when a live
    process holds it; `release(index)` lets go of one it claimed but does not use), then
    `draw(index)` chooses its point outside the lock, and the sweep records the trial as
    running under the lock again (decision 0056).
    """

    prunes: bool = False
    """Whether `report` may stop a trial (a search with a pruner)."""

    reserves: bool = False
    """Whether the sweep calls `reserve` and `draw` instead of `ask`."""

    def report(self, index: int, step: int, value: float) -> bool:
        """Take trial `index`'s validation score at evaluation `step`; True when the pruner
        stops the trial there (by default nothing is taken and nothing stopped)."""
        return False

    @abc.abstractmethod
    def ask(self, taken: Set[int]) -> tuple[int, dict[str, Any]] | None:
        """The next trial's index and point, or `None` when done."""

    def reserve(
        self, taken: Set[int], claim: Callable[[int], bool], release: Callable[[int], None]
    ) -> int | None:
        """Under the ledger's lock: the next trial's index, claimed with `claim` and not in
        `taken`, or `None` when done. By default the whole `ask`, its point kept for `draw`
        (a run that `reserves` draws it outside the lock instead)."""
        proposal = self.ask(taken)
        if proposal is None:
            return None
        index, point = proposal
        if not claim(index):
            raise SweepStateError(f"the search proposed trial {index}, which is already taken.")
        vars(self).setdefault("_drawn", {})[index] = point
        return index

    def draw(self, index: int) -> dict[str, Any]:
        """Outside the ledger's lock: the point of trial `index`, which `reserve` returned
        (by default the one `ask` proposed with it)."""
        return self.__dict__["_drawn"].pop(index)

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

    def _choices(self, space: Space) -> list[Choice]:
        """The space's choices, in order, after `check` (which refuses a range)."""
        self.check(space)
        return [spec for spec in space.values() if isinstance(spec, Choice)]

    def limit(self, space: Space, trials: int) -> int:
        return min(trials, math.prod(len(spec.values) for spec in self._choices(space)))

    def point(self, space: Mapping[str, Any], index: int) -> dict[str, Any]:
        space = _normalize_space(space)
        choices = self._choices(space)
        size = math.prod(len(spec.values) for spec in choices)
        if not 0 <= index < size:
            raise IndexError(f"grid point {index} is outside the grid of {size} points.")
        picks = []
        for spec in reversed(choices):
            index, pick = divmod(index, len(spec.values))
            picks.append(spec.values[pick])
        return dict(zip(space, reversed(picks), strict=True))


random_search = RandomSearch()
"""Random search with seed 0; `random_search(seed=...)` for another seed."""
grid_search = GridSearch()
"""Grid search over the cartesian product of the space's choices."""
