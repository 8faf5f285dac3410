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
import numbers
import re
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, ClassVar, Literal, TypeVar

from dew import _json
from dew._precisions import check_precision
from dew.naming import check_index

__all__ = [
    "CheckpointRequested",
    "FitEnded",
    "FitStarted",
    "ProfileWindow",
    "Record",
    "RunRecord",
    "SamplingProtocol",
    "TrialFinished",
    "decode_json_value",
    "encode_json_value",
    "package_versions",
    "record_from_dict",
    "record_from_json",
]

FitStatus = Literal["completed", "failed", "interrupted"]
FIT_STATUSES: tuple[str, ...] = ("completed", "failed", "interrupted")
CONDITIONINGS: tuple[str, ...] = ("class_labels", "unconditional")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def encode_json_value(value: Any) -> Any:
    """Map non-finite floats (nested anywhere) to `"NaN"`, `"+Inf"`, `"-Inf"`; NumPy and
    JAX scalars become Python numbers, tuples lists. Other leaves pass through as they are."""
    return _json.encode(value, default=_keep)


def _keep(value: Any) -> Any:
    return value


def decode_json_value(value: Any) -> Any:
    """Inverse of `encode_json_value`: the three reserved strings become floats."""
    return _json.decode(value)


def _plain(value: Any, where: str) -> Any:
    """Normalise a record value to JSON's data model (`dew._json.plain`): dicts with string
    keys, lists, str, int, float, bool, None; NumPy and JAX scalars become Python ones."""
    return _json.plain(value, where, holder="a record", reserved_by="record JSON")


def _check_step(name: str, value: Any) -> int:
    return check_index(name, value)


_R = TypeVar("_R", bound="Record")
_RECORD_TYPES: dict[str, type[Record]] = {}


@dataclasses.dataclass(frozen=True)
class Record:
    """Base of the typed run records. `type` is the record's stable JSON name."""

    type: ClassVar[str]
    renamed: ClassVar[Mapping[str, str]] = {}
    """Old field names a record's JSON may still use, and the fields they now are."""

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
    old = {key: new for key, new in cls.renamed.items() if key in data and new not in data}
    data = {old.get(key, key): value for key, value in data.items()}
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"type"})
    if unknown:
        raise ValueError(f"{kind!r} record has unknown fields {unknown}; it has {sorted(names)}.")
    return cls(**{key: decode_json_value(value) for key, value in data.items() if key != "type"})


def record_from_json(text: str) -> Record:
    """Rebuild any record from its `to_json` form; text that is not JSON, or nests more than
    `dew._json.MAX_DEPTH` deep, raises `ValueError`."""
    return record_from_dict(_json.loads(text, "the record's text", "record JSON"))


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
    """The resolved configuration of a run and the package versions it ran with: one field
    per `RunConfig` section, under the section's name (`optim`; records written before it
    was renamed say `optimizer`, which `record_from_dict` still reads). The sections hold
    local file paths absolute; `paths` keeps the relative ones as the configuration gave
    them, by dotted path (`{"data.kwargs.path": "licenses.npy"}`), for display."""

    type: ClassVar[str] = "run_record"
    renamed: ClassVar[Mapping[str, str]] = {"optimizer": "optim"}
    model: Mapping[str, Any]
    data: Mapping[str, Any]
    optim: Mapping[str, Any]
    trainer: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    packages: Mapping[str, str] = dataclasses.field(default_factory=package_versions)
    objective: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    paths: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class FitStarted(Record):
    """A fit began: its stage, the step it starts from and the step it runs to, and the
    direction each of its metrics declares (`metric_directions`: bare name to `"minimize"`,
    `"maximize"` or `None`; empty in records written before metrics declared one, whose
    readers guess from the names, decision 0064), and the precision policy its compiled step
    computed under (`precision`: `"float32"`, `"bfloat16"` or `"mixed_bfloat16"`; records
    written before policies say none, and read as `"float32"`, decision 0078)."""

    type: ClassVar[str] = "fit_started"
    stage: str
    start_step: int
    steps: int
    metric_directions: Mapping[str, str | None] = dataclasses.field(
        default_factory=dict, repr=False
    )
    precision: str = dataclasses.field(default="float32", repr=False)

    def to_dict(self) -> dict[str, Any]:
        """`Record.to_dict`, without `metric_directions` when it is empty and without
        `precision` when it is `"float32"`: such a fit writes the record as before the
        fields were."""
        data = super().to_dict()
        if not self.metric_directions:
            del data["metric_directions"]
        if self.precision == "float32":
            del data["precision"]
        return data

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_step("FitStarted.start_step", self.start_step)
        _check_step("FitStarted.steps", self.steps)
        check_precision(self.precision, "FitStarted.precision")


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


@dataclasses.dataclass(frozen=True)
class SamplingProtocol(Record):
    """How a generative objective draws the samples it is scored on: what document 000
    asks a user comparing generative scores to record.

    - `objective`: the objective's name; `solver`, `steps`, `guidance`: its sampler
      (`guidance` `None` for a sampler that takes none, masked diffusion's).
    - `seed_domain`: folded into the event's scoring keys to draw the noise (`None` when
      the objective draws from the scoring keys themselves).
    - `conditioning`: `"class_labels"` (each sample conditioned on its real row's label)
      or `"unconditional"`.
    - `generated_rows`, `real_rows`: the rows an evaluation generated and the real rows
      it consumed (both `0` in the record a fit reports once, at its start).
    - `event_key`: the evaluation event's key as hex (each word of its raw key data as
      eight hex digits), from which the scoring keys derive; `None` in the fit's record.
    - `conditioning_sha256`: the identity of the conditioning data: the SHA-256 of every
      generated row's conditioning values (its class label) in pass order, as
      little-endian int64 (`hashlib.sha256(np.asarray(labels, "<i8").tobytes())` over
      the pass's labels); `None` when unconditional and in the fit's record.
    - `features`: the feature and preprocessing definition of each score that reads the
      samples through a network, by metric name (`FID.feature_definition()`: the
      network, its preprocessing, the SHA-256 of its weights file, the reference).
    """

    type: ClassVar[str] = "sampling_protocol"
    objective: str
    solver: str
    steps: int
    guidance: float | None
    seed_domain: int | None
    conditioning: str
    generated_rows: int = 0
    real_rows: int = 0
    event_key: str | None = None
    conditioning_sha256: str | None = None
    features: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("steps", "seed_domain", "generated_rows", "real_rows"):
            if name != "seed_domain" or self.seed_domain is not None:
                _check_step(f"SamplingProtocol.{name}", getattr(self, name))
        guidance = self.guidance
        if guidance is not None:
            if isinstance(guidance, bool) or not isinstance(guidance, numbers.Real):
                raise TypeError(
                    f"SamplingProtocol.guidance must be a real number or None, got {guidance!r}."
                )
            object.__setattr__(self, "guidance", float(guidance))
        if self.conditioning not in CONDITIONINGS:
            allowed = ", ".join(repr(name) for name in CONDITIONINGS)
            raise ValueError(
                f"SamplingProtocol.conditioning {self.conditioning!r} is not one of {allowed}."
            )
        digest = self.conditioning_sha256
        if digest is not None and not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise ValueError(
                "SamplingProtocol.conditioning_sha256 must be None or a SHA-256 digest (64 "
                f"lowercase hex digits), got {digest!r}."
            )
