"""The one place where metric tags, artifact tags and parameter paths are built and parsed.

A metric name is bare snake_case (`loss`, `perplexity`). A *metric tag* is the
namespaced identity of a recorded series, `stage/split/metric`, always three
segments. A *preview name* is the name a preview is logged under, `stage/split/name`
(`lm/validation/samples`), so two stages' previews never share a tag or a file. An
*artifact tag* names what a tracker shows of an artifact (`lm/validation/samples/0`,
`reporting/fit_ended`). A *parameter path* is a key path through a nested parameter
mapping. All use `/` as their only separator, and no segment may be empty or contain
it, so parsing always recovers exactly the parts a string was built from.

No other module in dew joins or splits these strings.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from dew._integers import check_integer

__all__ = [
    "SEPARATOR",
    "ArtifactKind",
    "ArtifactTag",
    "MetricTag",
    "PreviewName",
    "Split",
    "bare_metric_name",
    "check_metric_name",
    "check_index",
    "check_name",
    "check_path_segment",
    "artifact_tag",
    "flatten_parameters",
    "metric_tag",
    "metric_tag_pattern",
    "parse_artifact_tag",
    "parse_metric_tag",
    "parse_parameter_path",
    "parse_preview_name",
    "preview_name",
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

    @property
    def series(self) -> str:
        """`stage/split`: which of a bare metric's series the tag is (a plot's line)."""
        return SEPARATOR.join((self.stage, self.split.value))


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


def bare_metric_name(name: str) -> str:
    """The bare metric name of a metric tag (`parse_metric_tag`), or `name` itself
    when it is a bare name already.

    ```python
    >>> bare_metric_name("lm/validation/perplexity"), bare_metric_name("loss")
    ('perplexity', 'loss')

    ```
    """
    return parse_metric_tag(name).metric if SEPARATOR in name else check_metric_name(name)


def metric_tag_pattern(stage: str, splits: Iterable[Split | str], metric: str) -> str:
    """The regular expression matching exactly the tags of `metric` in `stage` over
    `splits` (each segment escaped), as TensorBoard's custom scalars take it.

    ```python
    >>> metric_tag_pattern("lm", ["validation", "train"], "loss")
    '^lm/(train|validation)/loss$'

    ```
    """
    tags = [parse_metric_tag(metric_tag(stage, split, metric)) for split in splits]
    alternatives = "|".join(sorted({re.escape(tag.split.value) for tag in tags}))
    escaped = [re.escape(stage), f"({alternatives})", re.escape(metric)]
    return f"^{SEPARATOR.join(escaped)}$"


class PreviewName(NamedTuple):
    """The three parts of a preview name, as `parse_preview_name` returns them."""

    stage: str
    split: Split
    name: str


def _check_preview_parts(stage: str, split: object, name: str) -> PreviewName:
    check_path_segment("stage", stage)
    split = _as_split(split)
    return PreviewName(stage, split, check_path_segment("preview name", name))


def preview_name(stage: str, split: Split | str, name: str) -> str:
    """Build `stage/split/name`, the name a preview is logged under (`log_artifact`):
    trackers build its tags and files from all three parts, so a second stage's
    previews never overwrite the first's. Each part is a path segment
    (`check_path_segment`); `split` is a `Split`.

    **Raises:** `ValueError` naming the bad part, `TypeError` for a part that is not a
    string.

    ```python
    >>> preview_name("diffusion", Split.VALIDATION, "samples")
    'diffusion/validation/samples'

    ```
    """
    return SEPARATOR.join(_check_preview_parts(stage, split, name))


def parse_preview_name(text: str) -> PreviewName:
    """Recover the `(stage, split, name)` a preview name was built from.

    **Raises:** `ValueError` when `text` is not a name `preview_name` builds (a bare
    `"samples"` names no stage), `TypeError` when it is not a string.

    ```python
    >>> parse_preview_name("lm/validation/samples")
    PreviewName(stage='lm', split=<Split.VALIDATION: 'validation'>, name='samples')

    ```
    """
    if not isinstance(text, str):
        raise TypeError(f"a preview's name must be a string, got {type(text).__name__}.")
    segments = text.split(SEPARATOR)
    if len(segments) != 3:
        raise ValueError(
            f"a preview's name is stage{SEPARATOR}split{SEPARATOR}name, got {text!r}: build it "
            "with dew.naming.preview_name(stage, split, name), e.g. 'lm/validation/samples'."
        )
    return _check_preview_parts(*segments)


class ArtifactKind(enum.StrEnum):
    """What an artifact tag shows.

    - `PREVIEW`: one piece of a preview, `<preview name>/<part>`, four segments
      `stage/split/name/part`, where `<part>` is a generated row's index, `tokens` or
      `spread`.
    - `RECORD`: a typed record, `reporting/<record type>`.
    - `VALUE`: any other value a tracker shows as text, `artifacts/<name>`.

    A record's and a value's tag start with the kind's value; a preview's starts with
    its stage, and its four segments tell it from the two of the others.
    """

    PREVIEW = "preview"
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
    if kind is ArtifactKind.PREVIEW:
        parse_preview_name(name)
        if part is None:
            raise ValueError("a preview's artifact tag needs a part (a row, tokens or spread).")
        check_path_segment("preview part", part)
        return
    check_path_segment("record type" if kind is ArtifactKind.RECORD else "artifact name", name)
    if part is not None:
        raise ValueError(f"a {kind.name.lower()}'s artifact tag has no part, got {part!r}.")


def artifact_tag(kind: ArtifactKind | str, name: str, part: str | None = None) -> str:
    """Build the tag under which a tracker shows an artifact.

    **Arguments:**

    - `kind`: the `ArtifactKind` (or its value, `"preview"`).
    - `name`: a preview name (`preview_name`) for `ArtifactKind.PREVIEW`, a record's
      type for `ArtifactKind.RECORD`, the artifact's name for `ArtifactKind.VALUE`.
    - `part`: for a preview only, the piece it shows (`"0"`, `"tokens"`, `"spread"`).

    **Raises:** `ValueError` when `kind` is not an `ArtifactKind`, when a segment is
    not a path segment (`check_path_segment`) or a preview's name no preview name, or
    when `part` is missing for a preview or given for another kind; `TypeError` when a
    segment is not a string.

    ```python
    >>> artifact_tag(ArtifactKind.PREVIEW, "diffusion/validation/samples", "0")
    'diffusion/validation/samples/0'
    >>> artifact_tag(ArtifactKind.RECORD, "fit_ended")
    'reporting/fit_ended'

    ```
    """
    kind = _as_artifact_kind(kind)
    _check_artifact_parts(kind, name, part)
    segments = (kind.value, name) if part is None else (name, part)
    return SEPARATOR.join(segments)


def parse_artifact_tag(tag: str) -> ArtifactTag:
    """Recover the `(kind, name, part)` an artifact tag was built from: four segments
    are a preview's (`name` its preview name), two a record's or a value's.

    **Raises:** `ValueError` when `tag` is not a tag `artifact_tag` builds, `TypeError`
    when it is not a string.

    ```python
    >>> parse_artifact_tag("lm/validation/samples/0")
    ArtifactTag(kind=<ArtifactKind.PREVIEW: 'preview'>, name='lm/validation/samples', part='0')

    ```
    """
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a string, got {tag!r} of type {type(tag).__name__}.")
    segments = tag.split(SEPARATOR)
    if len(segments) == 4:
        kind, name, part = ArtifactKind.PREVIEW, SEPARATOR.join(segments[:3]), segments[3]
    elif len(segments) == 2 and segments[0] != ArtifactKind.PREVIEW.value:
        kind, name, part = _as_artifact_kind(segments[0]), segments[1], None
    else:
        raise ValueError(
            f"artifact tag {tag!r} must be stage/split/name/part (a preview), reporting/type "
            f"or artifacts/name, got {len(segments)} segments."
        )
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


def parse_parameter_path(path: str) -> tuple[str, ...]:
    """The keys of a parameter path (`flatten_parameters`), outermost first.

    **Raises:** `ValueError` for an empty key (`"a//b"`), `TypeError` for a non-string.

    ```python
    >>> parse_parameter_path("optimizer/learning_rate")
    ('optimizer', 'learning_rate')

    ```
    """
    if not isinstance(path, str):
        raise TypeError(f"parameter path must be a string, got {type(path).__name__}.")
    keys = tuple(path.split(SEPARATOR))
    if not all(keys):
        raise ValueError(f"parameter path {path!r} has an empty key.")
    return keys
