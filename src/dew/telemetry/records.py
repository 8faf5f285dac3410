"""Typed run records, reported to a tracker as artifacts.

Each record is a frozen dataclass with a stable JSON form (`to_json` /
`record_from_json`) that round-trips exactly. Non-finite floats are written as
the strings `"NaN"`, `"+Inf"` and `"-Inf"` and read back as floats; those three
strings are therefore reserved inside record values.

```python
>>> record = TrialFinished(trial=3, overrides={"optim.lr": 0.01}, value=float("inf"))
>>> record.to_json()
'{"overrides": {"optim.lr": 0.01}, "trial": 3, "type": "trial_finished", "value": "+Inf"}'
>>> record_from_json(record.to_json()) == record
True

```
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, ClassVar, Literal, TypeVar

from dew._checks import check_integer

__all__ = [
    "CheckpointRequested",
    "FitEnded",
    "FitStarted",
    "ProfileWindow",
    "Record",
    "RunRecord",
    "TrialFinished",
    "decode_json_value",
    "encode_json_value",
    "package_versions",
    "record_from_dict",
    "record_from_json",
]

_NON_FINITE = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}
FitStatus = Literal["completed", "failed", "interrupted"]
FIT_STATUSES: tuple[str, ...] = ("completed", "failed", "interrupted")


def encode_json_value(value: Any) -> Any:
    """Map non-finite floats (nested anywhere) to `"NaN"`, `"+Inf"`, `"-Inf"`."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, Mapping):
        return {key: encode_json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encode_json_value(item) for item in value]
    return value


def decode_json_value(value: Any) -> Any:
    """Inverse of `encode_json_value`: the three reserved strings become floats."""
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, Mapping):
        return {key: decode_json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode_json_value(item) for item in value]
    return value


def _plain(value: Any, where: str) -> Any:
    """Normalise a record value to JSON's data model: dicts with string keys,
    lists, str, int, float, bool, None. NumPy and JAX scalars become Python ones."""
    if value is None:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        value = str(value)
        if value in _NON_FINITE:
            raise ValueError(
                f"{where} is the string {value!r}, which record JSON reserves for a "
                "non-finite float; pass float(" + repr(value) + ") or another string."
            )
        return value
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has key {key!r}; record mapping keys must be strings.")
            plain[key] = _plain(item, f"{where}[{key!r}]")
        return plain
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [_plain(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if hasattr(value, "shape") and hasattr(value, "item") and value.shape == ():
        return _plain(value.item(), where)
    raise TypeError(
        f"{where} is {value!r} of type {type(value).__name__}; records hold only None, "
        "bool, int, float, str, lists and string-keyed mappings."
    )


def _check_step(name: str, value: Any) -> int:
    return check_integer(name, value, minimum=0)


_R = TypeVar("_R", bound="Record")
_RECORD_TYPES: dict[str, type[Record]] = {}


@dataclasses.dataclass(frozen=True)
class Record:
    """Base of the typed run records. `type` is the record's stable JSON name."""

    type: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RECORD_TYPES[cls.type] = cls

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            object.__setattr__(self, field.name, _plain(value, f"{self.type}.{field.name}"))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready mapping: the fields plus `"type"`, non-finite floats encoded."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return encode_json_value({"type": self.type, **fields})

    def to_json(self) -> str:
        """The stable JSON form: keys sorted, no NaN or Infinity tokens."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls: type[_R], data: Mapping[str, Any]) -> _R:
        """Rebuild the record from `to_dict`'s mapping."""
        record = record_from_dict(data)
        if not isinstance(record, cls):
            raise TypeError(f"expected a {cls.type!r} record, got {type(record).type!r}.")
        return record


def record_from_dict(data: Mapping[str, Any]) -> Record:
    """Rebuild any record from its `to_dict` form, choosing the class by `"type"`."""
    if not isinstance(data, Mapping) or "type" not in data:
        raise ValueError(f"a record mapping needs a 'type' key, got {data!r}.")
    kind = data["type"]
    if kind not in _RECORD_TYPES:
        allowed = ", ".join(repr(name) for name in sorted(_RECORD_TYPES))
        raise ValueError(f"unknown record type {kind!r}; known types are {allowed}.")
    cls = _RECORD_TYPES[kind]
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"type"})
    if unknown:
        raise ValueError(f"{kind!r} record has unknown fields {unknown}; it has {sorted(names)}.")
    return cls(**{key: decode_json_value(value) for key, value in data.items() if key != "type"})


def record_from_json(text: str) -> Record:
    """Rebuild any record from its `to_json` form."""
    return record_from_dict(json.loads(text))


def package_versions(
    names: Sequence[str] = ("dew-ml", "jax", "jaxlib", "equinox", "optax", "numpy"),
) -> dict[str, str]:
    """Installed versions of `names`; a package that is not installed is left out."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


@dataclasses.dataclass(frozen=True)
class RunRecord(Record):
    """The resolved configuration of a run and the package versions it ran with."""

    type: ClassVar[str] = "run_record"
    model: Mapping[str, Any]
    data: Mapping[str, Any]
    optimizer: Mapping[str, Any]
    trainer: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    packages: Mapping[str, str] = dataclasses.field(default_factory=package_versions)
    objective: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class FitStarted(Record):
    """A fit began: its stage, the step it starts from and the step it runs to."""

    type: ClassVar[str] = "fit_started"
    stage: str
    start_step: int
    steps: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_step("FitStarted.start_step", self.start_step)
        _check_step("FitStarted.steps", self.steps)


@dataclasses.dataclass(frozen=True)
class CheckpointRequested(Record):
    """A checkpoint save was submitted (asynchronously): not that it is durable."""

    type: ClassVar[str] = "checkpoint_requested"
    step: int
    directory: str

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_step("CheckpointRequested.step", self.step)


@dataclasses.dataclass(frozen=True)
class ProfileWindow(Record):
    """A profile window stopped: the directory it wrote and the steps it traced."""

    type: ClassVar[str] = "profile_window"
    directory: str
    traced_steps: int
    start_step: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_step("ProfileWindow.traced_steps", self.traced_steps)
        _check_step("ProfileWindow.start_step", self.start_step)


@dataclasses.dataclass(frozen=True)
class FitEnded(Record):
    """A fit ended: `completed`, `failed` (with the error) or `interrupted`."""

    type: ClassVar[str] = "fit_ended"
    status: FitStatus
    step: int
    error: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.status not in FIT_STATUSES:
            allowed = ", ".join(repr(status) for status in FIT_STATUSES)
            raise ValueError(f"FitEnded.status {self.status!r} is not one of {allowed}.")
        _check_step("FitEnded.step", self.step)


@dataclasses.dataclass(frozen=True)
class TrialFinished(Record):
    """One finished sweep trial: its number, the point it trained and its score."""

    type: ClassVar[str] = "trial_finished"
    trial: int
    overrides: Mapping[str, Any]
    value: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_step("TrialFinished.trial", self.trial)
        if isinstance(self.value, bool) or not isinstance(self.value, numbers.Real):
            raise TypeError(f"TrialFinished.value must be a real number, got {self.value!r}.")
        object.__setattr__(self, "value", float(self.value))
