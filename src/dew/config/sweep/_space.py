"""The search space: its fields (`Choice`, `Uniform`, `IntUniform`) and the checks a space passes
before a sweep trains anything."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Mapping
from typing import Any, TypeGuard

from dew._json import plain
from dew.config import RunConfig, override
from dew.telemetry.records import decode_json_value, encode_json_value


def _is_int(value: Any) -> TypeGuard[int]:
    """Whether `value` is an integer (an `int` or a NumPy integer, which acts as one), not a
    bool."""
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


def _space_from_json(stored: Any) -> Space:
    """The space a ledger stores (`_space_json`'s form), checked as a space given to `sweep`
    is: `ValueError` naming what is wrong."""
    if not isinstance(stored, dict) or not stored:
        raise ValueError("its space is not a mapping of dotted paths to fields")
    space: dict[str, Any] = {}
    for path, stored_spec in stored.items():
        spec = decode_json_value(stored_spec)
        kind = spec.get("kind") if isinstance(spec, dict) else None
        keys = {"choice": {"kind", "values"}, "uniform": {"kind", "low", "high", "log"}}
        keys["int_uniform"] = keys["uniform"]
        if kind not in keys or set(spec) != keys[kind]:
            raise ValueError(
                f"its space path {path!r} is {stored_spec!r}, not a field ({{'kind': 'choice', "
                "'values': [...]}, or 'uniform' or 'int_uniform' with 'low', 'high', 'log')"
            )
        try:
            if kind == "choice":
                if not isinstance(spec["values"], list):
                    raise TypeError("its values are not a list")
                space[path] = Choice(tuple(spec["values"]))
            else:
                integer = kind == "int_uniform"
                low, high = (_bound(spec[key], integer) for key in ("low", "high"))
                space[path] = (IntUniform if integer else Uniform)(low, high, log=spec["log"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"its space path {path!r} is {stored_spec!r}: {error}") from None
    try:
        return _normalize_space(space)
    except (TypeError, ValueError) as error:
        raise ValueError(f"its space is not a space: {error}") from None


def _bound(value: Any, integer: bool) -> Any:
    """A stored range's bound as its field takes it (JSON writes `1` for `1.0`)."""
    if integer or not _is_real(value):
        return value  # the field's own check names a bound of the wrong type
    return float(value)


def _outside(spec: Field, value: Any) -> str | None:
    """Why `value` (in the ledger's JSON form, decoded) is no point of `spec`; `None` when
    it is one."""
    if isinstance(spec, Choice):
        text = json.dumps(value, sort_keys=True)  # 1 is not 1.0 nor True, as in Choice
        if all(json.dumps(choice, sort_keys=True) != text for choice in spec.values):
            return f"not one of the choices {list(spec.values)!r}"
        return None
    integer = isinstance(spec, IntUniform)
    fits = _is_int(value) if integer else _is_real(value)
    if not fits or not spec.low <= value <= spec.high:  # NaN lies in no range
        kind = "an integer" if integer else "a number"
        return f"not {kind} in [{spec.low!r}, {spec.high!r}]"
    return None


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
