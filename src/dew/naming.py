"""The one place where metric tags, artifact tags and parameter paths are built and parsed.

A metric name is bare snake_case (`loss`, `perplexity`). A *metric tag* is the
namespaced identity of a recorded series, `stage/split/metric`, always three
segments. An *artifact tag* names what a tracker shows of an artifact
(`validation/samples/0`, `reporting/fit_ended`). A *parameter path* is a key path
through a nested parameter mapping. All use `/` as their only separator, and no
segment may be empty or contain it, so parsing always recovers exactly the parts a
string was built from.

No other module in dew joins or splits these strings.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

from dew._checks import check_integer

__all__ = [
    "SEPARATOR",
    "ArtifactKind",
    "ArtifactTag",
    "MetricTag",
    "Split",
    "check_metric_name",
    "check_index",
    "check_name",
    "check_path_segment",
    "artifact_tag",
    "flatten_parameters",
    "metric_tag",
    "parse_artifact_tag",
    "parse_metric_tag",
]

SEPARATOR = "/"
MAX_SEGMENT_BYTES = 255
"""The longest path segment, in UTF-8 bytes, that common file systems hold."""


class Split(enum.StrEnum):
    """The data split a metric was measured on, set by the runner that measured it.

    ```python
    >>> Split("validation")
    <Split.VALIDATION: 'validation'>

    ```
    """

    TRAIN = "train"
    VALIDATION = "validation"


class MetricTag(NamedTuple):
    """The three parts of a metric tag, as `parse_metric_tag` returns them."""

    stage: str
    split: Split
    metric: str


def _allowed_splits() -> str:
    return ", ".join(repr(split.value) for split in Split)


def _check_segment(kind: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a string, got {value!r} of type {type(value).__name__}.")
    if not value:
        raise ValueError(f"{kind} may not be empty.")
    if SEPARATOR in value:
        raise ValueError(f"{kind} {value!r} may not contain {SEPARATOR!r}.")
    return value


def _as_split(value: object) -> Split:
    if isinstance(value, Split):
        return value
    if isinstance(value, str):
        try:
            return Split(value)
        except ValueError:
            pass
    raise ValueError(f"split {value!r} is not one of {_allowed_splits()}.")


def check_metric_name(name: str) -> str:
    """Return `name` if it can be a metric's bare name (non-empty, no `/`), else raise.

    ```python
    >>> check_metric_name("perplexity")
    'perplexity'

    ```
    """
    return _check_segment("metric", name)


def check_name(kind: str, value: str) -> str:
    """Return `value` if it can be one segment of a tag or a path (non-empty, no `/`,
    not `.` or `..`), else raise naming `kind`.

    ```python
    >>> check_name("artifact name", "samples")
    'samples'

    ```
    """
    _check_segment(kind, value)
    if value in {".", ".."}:
        raise ValueError(f"{kind} {value!r} may not be '.' or '..'.")
    return value


def check_path_segment(kind: str, value: str) -> str:
    """Return `value` if it can name one file or folder that dew creates, else raise.

    A path segment passes `check_name` and also holds no backslash, no control character
    (NUL included), is not blank, is valid UTF-8 and is at most 255 UTF-8 bytes long,
    so a path built from it never leaves the folder it is built under.

    **Raises:** `TypeError` when `value` is not a string, `ValueError` naming `value`
    and the rule otherwise.

    ```python
    >>> check_path_segment("artifact name", "samples")
    'samples'

    ```
    """
    rule = (
        "a path segment is non-empty, not blank, not '.' or '..', holds no '/', no backslash "
        f"and no control character, and is at most {MAX_SEGMENT_BYTES} UTF-8 bytes"
    )
    if not isinstance(value, str):
        raise TypeError(
            f"{kind} must be a string, got {value!r} of type {type(value).__name__}; {rule}."
        )
    shown = repr(value) if len(value) <= 80 else f"{value[:40]!r}...{value[-20:]!r}"
    problem = None
    if not value:
        shown, problem = "", "may not be empty"
    elif SEPARATOR in value:
        problem = f"may not contain {SEPARATOR!r}"
    elif value in {".", ".."}:
        problem = "may not be '.' or '..'"
    elif "\\" in value:
        problem = "may not contain a backslash"
    elif any(ord(character) < 32 or ord(character) == 127 for character in value):
        problem = "may not contain control characters (NUL included)"
    elif not value.strip():
        problem = "may not be blank"
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            problem = "is not valid UTF-8"
        else:
            if size > MAX_SEGMENT_BYTES:
                problem = f"is {size} UTF-8 bytes long"
    if problem is not None:
        raise ValueError(f"{kind}{' ' if shown else ''}{shown} {problem}; {rule}.")
    return value


def check_index(kind: str, value: Any) -> int:
    """Return `value` as an `int` if it can be a step or an index (an integer >= 0,
    NumPy integers included, `bool` not), else raise naming `kind` and `value`.

    ```python
    >>> check_index("step", 3)
    3

    ```
    """
    return check_integer(kind, value, minimum=0)


def metric_tag(stage: str, split: Split | str, metric: str) -> str:
    """Build the tag `stage/split/metric` of a recorded metric.

    **Arguments:**

    - `stage`: the stage that measured the metric (`lm`, `supervised`, `mean`).
    - `split`: the `Split` the metric was measured on (or its value, `"train"`).
    - `metric`: the metric's bare name (`loss`, `perplexity`).

    **Raises:** `ValueError` when a segment is empty or contains `/`, or when
    `split` is not a `Split`; `TypeError` when a segment is not a string.

    ```python
    >>> metric_tag("mean", Split.VALIDATION, "loss")
    'mean/validation/loss'

    ```
    """
    _check_segment("stage", stage)
    split = _as_split(split)
    _check_segment("metric", metric)
    return SEPARATOR.join((stage, split.value, metric))


def parse_metric_tag(tag: str) -> MetricTag:
    """Recover the `(stage, split, metric)` a tag was built from.

    ```python
    >>> parse_metric_tag("lm/train/loss")
    MetricTag(stage='lm', split=<Split.TRAIN: 'train'>, metric='loss')

    ```
    """
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a string, got {tag!r} of type {type(tag).__name__}.")
    segments = tag.split(SEPARATOR)
    if len(segments) != 3:
        raise ValueError(
            f"tag {tag!r} must have three segments stage{SEPARATOR}split{SEPARATOR}metric, "
            f"got {len(segments)}."
        )
    stage, split, metric = segments
    for kind, segment in (("stage", stage), ("split", split), ("metric", metric)):
        if not segment:
            raise ValueError(f"tag {tag!r} has an empty {kind} segment.")
    return MetricTag(stage, _as_split(split), metric)


class ArtifactKind(enum.StrEnum):
    """What an artifact tag shows; its value is the tag's first segment.

    - `PREVIEW`: one piece of a preview, `validation/<name>/<part>`, where `<part>` is
      a generated row's index, `tokens` or `spread`.
    - `RECORD`: a typed record, `reporting/<record type>`.
    - `VALUE`: any other value a tracker shows as text, `artifacts/<name>`.
    """

    PREVIEW = "validation"
    RECORD = "reporting"
    VALUE = "artifacts"


class ArtifactTag(NamedTuple):
    """The parts of an artifact tag, as `parse_artifact_tag` returns them."""

    kind: ArtifactKind
    name: str
    part: str | None = None


def _as_artifact_kind(value: object) -> ArtifactKind:
    try:
        return ArtifactKind(value)
    except ValueError:
        allowed = ", ".join(repr(kind.value) for kind in ArtifactKind)
        raise ValueError(f"artifact kind {value!r} must be one of {allowed}.") from None


def _check_artifact_parts(kind: ArtifactKind, name: str, part: str | None) -> None:
    check_path_segment("record type" if kind is ArtifactKind.RECORD else "artifact name", name)
    if kind is ArtifactKind.PREVIEW:
        if part is None:
            raise ValueError("a preview's artifact tag needs a part (a row, tokens or spread).")
        check_path_segment("preview part", part)
    elif part is not None:
        raise ValueError(f"a {kind.name.lower()}'s artifact tag has no part, got {part!r}.")


def artifact_tag(kind: ArtifactKind | str, name: str, part: str | None = None) -> str:
    """Build the tag under which a tracker shows an artifact.

    **Arguments:**

    - `kind`: the `ArtifactKind` (or its value, `"validation"`).
    - `name`: the artifact's name, or a record's type for `ArtifactKind.RECORD`.
    - `part`: for a preview only, the piece it shows (`"0"`, `"tokens"`, `"spread"`).

    **Raises:** `ValueError` when `kind` is not an `ArtifactKind`, when a segment is
    not a path segment (`check_path_segment`), or when `part` is missing for a preview
    or given for another kind; `TypeError` when a segment is not a string.

    ```python
    >>> artifact_tag(ArtifactKind.PREVIEW, "samples", "0")
    'validation/samples/0'
    >>> artifact_tag(ArtifactKind.RECORD, "fit_ended")
    'reporting/fit_ended'

    ```
    """
    kind = _as_artifact_kind(kind)
    _check_artifact_parts(kind, name, part)
    segments = (kind.value, name) if part is None else (kind.value, name, part)
    return SEPARATOR.join(segments)


def parse_artifact_tag(tag: str) -> ArtifactTag:
    """Recover the `(kind, name, part)` an artifact tag was built from.

    **Raises:** `ValueError` when `tag` is not a tag `artifact_tag` builds, `TypeError`
    when it is not a string.

    ```python
    >>> parse_artifact_tag("validation/samples/0")
    ArtifactTag(kind=<ArtifactKind.PREVIEW: 'validation'>, name='samples', part='0')

    ```
    """
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a string, got {tag!r} of type {type(tag).__name__}.")
    segments = tag.split(SEPARATOR)
    kind = _as_artifact_kind(segments[0])
    shape = ("name", "part") if kind is ArtifactKind.PREVIEW else ("name",)
    if len(segments) != 1 + len(shape):
        raise ValueError(
            f"artifact tag {tag!r} must have {1 + len(shape)} segments "
            f"{SEPARATOR.join((kind.value, *shape))}, got {len(segments)}."
        )
    name, part = segments[1], segments[2] if kind is ArtifactKind.PREVIEW else None
    _check_artifact_parts(kind, name, part)
    return ArtifactTag(kind, name, part)


def flatten_parameters(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten a nested parameter mapping into `{parameter path: value}`.

    Nested mappings become levels of the path; every other value (tuples and
    lists included) is a leaf and is passed through unchanged: converting values a
    tracker cannot store is the tracker's job. Leaves keep the mapping's order.

    **Raises:** `ValueError` for a key that is empty or contains `/`, `TypeError`
    for a key that is not a string, so two key paths never share one path.

    ```python
    >>> flatten_parameters({"optimizer": {"name": "sgd", "learning_rate": 0.1}})
    {'optimizer/name': 'sgd', 'optimizer/learning_rate': 0.1}

    ```
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"parameters must be a mapping, got {values!r} of type {type(values).__name__}."
        )
    flat: dict[str, Any] = {}
    _flatten_into(flat, (), values)
    return flat


def _flatten_into(flat: dict[str, Any], prefix: tuple[str, ...], values: Mapping) -> None:
    for key, value in values.items():
        where = f" under {SEPARATOR.join(prefix)!r}" if prefix else ""
        if not isinstance(key, str):
            raise TypeError(
                f"parameter key {key!r}{where} must be a string, got {type(key).__name__}."
            )
        if not key:
            raise ValueError(f"parameter key{where} may not be empty.")
        if SEPARATOR in key:
            raise ValueError(f"parameter key {key!r}{where} may not contain {SEPARATOR!r}.")
        path = (*prefix, key)
        if isinstance(value, Mapping):
            _flatten_into(flat, path, value)
        else:
            flat[SEPARATOR.join(path)] = value
