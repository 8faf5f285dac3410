"""Compiled calls cached by an objective's structure: the one cache the Trainer's steps,
`run_supervised`'s step and an evaluation pass's calls go through. Below the core: imports
no dew module.

A compiled call that takes an objective is built from its structure, not its arrays: the
objective is split into its array leaves and its static rest (`partitioned`), the call is
built from the leaves' treedef and the static rest, and the leaves travel as an argument.
So objectives of one structure (a new Trainer of the same model, a twin objective, a new
`SupervisedObjective` of the same model and loss) share one compiled call.
`CompiledCalls(build)` keeps the calls it built, keyed on `(treedef, static, *rest)`; a key
that does not hash (a static field holding a list or a NumPy array) builds the call afresh,
for its caller alone to keep.

`ByIdentity` remembers a value made from some objects while they live, found by their
identities: a layer for what costs more to find by structure (hashing a model's static
structure, partitioning it) than the work it saves, used where measurements show it pays
(decision 0082).
"""

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax

__all__ = ["ByIdentity", "CompiledCalls", "partitioned"]

_C = TypeVar("_C")
_V = TypeVar("_V")


def partitioned(objective: Any) -> tuple[list[Any], Any, Any]:
    """`objective`'s array leaves, their treedef and its static rest (`eqx.partition` on
    `eqx.is_array`): the leaves a compiled call takes, and its cache key's first two parts.

    ```python
    >>> import equinox as eqx, jax
    >>> leaves, treedef, static = partitioned(eqx.nn.Linear(2, 3, key=jax.random.key(0)))
    >>> [leaf.shape for leaf in leaves], static.in_features
    ([(3, 2), (3,)], 2)

    ```
    """
    arrays, static = eqx.partition(objective, eqx.is_array)
    leaves, treedef = jax.tree.flatten(arrays)
    return leaves, treedef, static


class _Hashed:
    """A cache key with its hash taken once (a model's static structure is slow to hash)."""

    __slots__ = ("hash", "key")

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.hash = hash(key)  # TypeError: a part that does not hash

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Hashed) and self.key == other.key


class CompiledCalls(Generic[_C]):
    """The calls `build(treedef, static, *rest)` made, kept per key `(treedef, static,
    *rest)` (the `maxsize` last used), each built once; a key that does not hash (an
    unhashable static field) builds a call that is not kept.

    ```python
    >>> built = []
    >>> calls = CompiledCalls(lambda treedef, static, n: built.append(n) or f"call {n}")
    >>> calls("def", "static", 1), calls("def", "static", 1), calls("def", "static", 2)
    ('call 1', 'call 1', 'call 2')
    >>> calls("def", ["a list"], 1), built
    ('call 1', [1, 2, 1])

    ```
    """

    def __init__(self, build: Callable[..., _C], maxsize: int = 32) -> None:
        self.build = build
        self._kept = functools.lru_cache(maxsize=maxsize)(self._build_key)

    def _build_key(self, hashed: _Hashed) -> _C:
        return self.build(*hashed.key)

    def __call__(self, treedef: Any, static: Any, *rest: Any) -> _C:
        key = (treedef, static, *rest)
        try:
            hashed = _Hashed(key)
        except TypeError:  # an unhashable static field: built for this caller alone
            return self.build(*key)
        return self._kept(hashed)

    def cache_info(self) -> Any:
        """The kept calls' hits, misses and count (`functools.lru_cache`'s)."""
        return self._kept.cache_info()


class ByIdentity(Generic[_V]):
    """Values made from some objects, each remembered while all its objects live and found
    by their identities (no hashing, no comparison); objects that cannot be weakly
    referenced get a fresh value each time.

    ```python
    >>> class Thing: ...
    >>> first, second, made = Thing(), Thing(), ByIdentity()
    >>> made.get((first, second), list) is made.get((first, second), list)
    True
    >>> made.get((second, first), list) is made.get((first, second), list)
    False

    ```
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, ...], tuple[tuple[weakref.ref, ...], _V]] = {}

    def get(self, objects: Sequence[Any], make: Callable[[], _V]) -> _V:
        """The value remembered for `objects`, made by `make()` when there is none."""
        identity = tuple(map(id, objects))
        entry = self._entries.get(identity)
        if entry is not None and all(
            reference() is member for reference, member in zip(entry[0], objects, strict=True)
        ):
            return entry[1]
        value = make()
        # (The callback holds its dict: one that fires while the interpreter shuts down,
        # after this module's globals were cleared, still finds it.)
        forget = lambda _, found=self._entries: found.pop(identity, None)  # noqa: E731
        try:
            references = tuple(weakref.ref(member, forget) for member in objects)
        except TypeError:  # not weakly referenceable: made afresh each time
            return value
        self._entries[identity] = (references, value)
        return value
