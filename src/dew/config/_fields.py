"""The parts every configuration section is built from: where a value sits (its dotted
path), the value checks, a frozen mapping, and the `_Section` base."""

import contextlib
import contextvars
import dataclasses
import math
import numbers
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar, overload

from dew._integers import check_integer
from dew._json import VALUE_DEPTH, check_depth, python_scalar

SCHEDULES = ("constant", "cosine", "linear", "warmup_cosine")
SEED_LIMIT = 2**32
_INT64 = (-(2**63), 2**63 - 1)
_VALUES = (
    "None, a bool, an integer, a finite float, a string, a list, or a mapping with string keys"
)

# Where a config is being built: the dotted path of its section when `RunConfig.from_dict`
# builds it ("optim"), so its errors name `optim.learning_rate`; else its class name.
_WHERE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dew_config_where", default=None
)


@contextlib.contextmanager
def _building(where: str) -> Iterator[None]:
    token = _WHERE.set(where)
    try:
        yield
    finally:
        _WHERE.reset(token)


def _where(config: object) -> str:
    return _WHERE.get() or type(config).__name__


class _FrozenMapping(Mapping[str, Any]):
    """A read-only mapping compared by value with any mapping, and hashable."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any]):
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._items == dict(other.items())

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)


_EMPTY = _FrozenMapping({})


# Checks of typed fields. A wrong type raises TypeError, a wrong value ValueError; the
# message is the same and names the field by its dotted path.


@overload
def _integer(where: str, value: Any, *, least: int, optional: Literal[False] = False) -> int: ...
@overload
def _integer(where: str, value: Any, *, least: int, optional: bool) -> int | None: ...
def _integer(where: str, value: Any, *, least: int, optional: bool = False) -> int | None:
    value = check_integer(where, value, minimum=least, optional=optional)
    expected = f"{'None or ' if optional else ''}an integer >= {least}"
    if value is not None and value > _INT64[1]:
        raise ValueError(f"{where} must be {expected} that fits in 64 bits, got {value!r}.")
    return value


def _real(where: str, value: Any, *, positive: bool, optional: bool = False) -> float | None:
    if optional and value is None:
        return None
    expected = f"{'None or ' if optional else ''}a finite number {'>' if positive else '>='} 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} must be {expected}, got {value!r}.")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{where} must be {expected}, got {value!r}.") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{where} must be {expected}, got {value!r}.")
    return value


def _string(where: str, value: Any, *, what: str = "a non-empty string") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where} must be {what}, got {value!r}.")
    value = str.__str__(value)
    if not value.strip():
        raise ValueError(f"{where} must be {what}, got {value!r}.")
    _utf8(where, value)
    return value


def _utf8(where: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{where} holds {value!r}, which UTF-8 cannot encode (a lone surrogate), so no "
            "config file could hold it."
        ) from None


def _registry_name(where: str, value: Any) -> str:
    value = _string(where, value)
    if value != value.strip():
        raise ValueError(f"{where} {value!r} may not start or end with whitespace.")
    return value


def _run_name(where: str, value: Any) -> str | None:
    if value is None:
        return None
    rule = (
        "None or a run name: '/'-separated segments, each non-empty, not blank, not '.' or "
        "'..', without '\\'"
    )
    if not isinstance(value, str):
        raise TypeError(f"{where} must be {rule}; got {value!r}.")
    value = str.__str__(value)
    for segment in value.split("/"):
        if not segment.strip() or segment in {".", ".."} or "\\" in segment or "\0" in segment:
            raise ValueError(f"{where} must be {rule}; got {value!r} (segment {segment!r}).")
    _utf8(where, value)
    return value


def _plain_value(where: str, value: Any) -> Any:
    """A config value, frozen: mappings become read-only mappings, lists tuples, NumPy and
    JAX scalars Python ones (`dew._json.python_scalar`)."""
    value = python_scalar(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        if not _INT64[0] <= int(value) <= _INT64[1]:
            raise ValueError(
                f"{where} must fit in a signed 64-bit integer (the range TOML holds), got "
                f"{value!r}."
            )
        return int(value)
    if isinstance(value, numbers.Real):
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise ValueError(
                f"{where} must be finite, got {value!r}: configs hold only finite numbers, "
                "so a config always equals itself and fits TOML and JSON."
            )
        return value
    if isinstance(value, str):
        value = str.__str__(value)
        _utf8(where, value)
        return value
    if isinstance(value, Mapping):
        frozen = {}
        for key, item in value.items():
            if not isinstance(key, str) or not key or "." in key:
                raise ValueError(
                    f"{where} has key {key!r}; keys of mappings in configs must be non-empty "
                    "strings without '.', since dotted override paths address them."
                )
            frozen[str.__str__(key)] = _plain_value(f"{where}.{key}", item)
        return _FrozenMapping(frozen)
    if isinstance(value, list | tuple):
        return tuple(_plain_value(f"{where}[{index}]", item) for index, item in enumerate(value))
    raise TypeError(f"{where} must be {_VALUES}, got {value!r} of type {type(value).__name__}.")


def _kwargs(where: str, value: Any, reserved: Mapping[str, str]) -> _FrozenMapping:
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{where} must be a mapping of keyword arguments, got {value!r} of type "
            f"{type(value).__name__}."
        )
    for key in value:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(
                f"{where} key {key!r} must be a Python identifier: it is passed as a keyword "
                "argument."
            )
        if key in reserved:
            raise ValueError(f"{where} may not set {key!r}: {reserved[key]}.")
    return _plain_value(where, check_depth(value, where, VALUE_DEPTH))


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    return value


def _set(config: object, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)


_S = TypeVar("_S", bound="_Section")


class _Section:
    """Shared plain-data behaviour of the config sections."""

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (dicts, lists, str, int, float, bool, None)."""
        return {
            field.name: _thaw(getattr(self, field.name))
            for field in dataclasses.fields(self)  # type: ignore[arg-type]
        }

    @classmethod
    def from_dict(cls: type[_S], mapping: Mapping[str, Any]) -> _S:
        """The config `to_dict` returned; missing keys take their defaults and unknown
        keys raise, naming the allowed keys."""
        where = _WHERE.get() or cls.__name__
        if not isinstance(mapping, Mapping):
            raise TypeError(
                f"{where} must be a mapping (a TOML table), got {mapping!r} of type "
                f"{type(mapping).__name__}."
            )
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = [field.name for field in fields]
        allowed = ", ".join(repr(name) for name in names)
        for key in mapping:
            if key not in names:
                raise ValueError(f"{where} has unknown key {key!r}; allowed keys are {allowed}.")
        for field in fields:
            required = field.default is dataclasses.MISSING
            if required and field.name not in mapping:
                raise ValueError(
                    f"{where} is missing the required key {field.name!r}; allowed keys are "
                    f"{allowed}."
                )
        values = {key: _coerce(cls, key, value) for key, value in mapping.items()}
        with _building(where):
            return cls(**values)


def _coerce(cls: type, key: str, value: Any) -> Any:
    """Convert an int read for a float field to float before the constructor's type
    check sees it (TOML and JSON write `1` for `1.0`)."""
    if key in _FLOAT_FIELDS.get(cls.__name__, ()) and (
        isinstance(value, numbers.Real) and not isinstance(value, bool)
    ):
        try:
            return float(value)
        except OverflowError:
            return value  # the constructor's check names the field
    if key in _INT_FIELDS.get(cls.__name__, ()) and (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
    ):
        return int(value)
    return value


_FLOAT_FIELDS = {"OptimConfig": ("learning_rate", "weight_decay", "clipping")}
_INT_FIELDS = {
    "OptimConfig": ("warmup_steps",),
    "TrainerConfig": (
        "steps",
        "batch_size",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "seed",
    ),
}
