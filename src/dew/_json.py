"""The JSON dew writes: one normaliser, atomic writes, and reads whose errors name the file.

Every JSON file and journal line dew writes goes through `plain` (values in JSON's data
model, NumPy and JAX scalars as Python numbers) and `encode` (non-finite floats as the
strings `"NaN"`, `"+Inf"`, `"-Inf"`); files are replaced atomically by `write_atomic`
and read back by `read_json` (a file) or `loads` (a line), whose errors name what they read.
Values nest at most `MAX_DEPTH` lists and mappings deep, read or written, so every recursive
walk over them stays far inside Python's recursion limit.
"""

import contextlib
import json
import math
import numbers
import os
import pathlib
import uuid
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "NON_FINITE",
    "VALUE_DEPTH",
    "check_depth",
    "decode",
    "encode",
    "loads",
    "nesting_error",
    "plain",
    "python_scalar",
    "read_json",
    "write_atomic",
]

NON_FINITE = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}
"""The strings dew's JSON writes for non-finite floats, and the floats they stand for."""

_SCALARS = (bool, int, float, str)

MAX_DEPTH = 100
"""The most lists and mappings a JSON or TOML document dew reads may nest inside each other:
far more than any record, config or ledger needs, and far inside Python's recursion limit
(1000 frames), which `json.loads` and `tomllib` otherwise hit as a `RecursionError`."""

VALUE_DEPTH = MAX_DEPTH - 10
"""The most lists and mappings a value dew writes (a config value, a record field, an
artifact) may nest: the files dew writes wrap a value in a few levels of their own, and the
whole file must stay within `MAX_DEPTH` to be read back."""


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` lists and mappings deep (a bare list is 1
    deep); level by level, without recursion."""
    level = [value]
    for _ in range(limit):
        inner = []
        for item in level:
            if isinstance(item, Mapping):
                inner.extend(item.values())
            elif isinstance(item, list | tuple):
                inner.extend(item)
        level = [item for item in inner if isinstance(item, Mapping | list | tuple)]
        if not level:
            return False
    return True


def nesting_error(where: str, limit: int = MAX_DEPTH) -> ValueError:
    """The error for a value nesting more than `limit` deep, naming `where`."""
    if limit == MAX_DEPTH:
        return ValueError(
            f"{where} nests lists and mappings more than {limit} deep, past dew's limit."
        )
    return ValueError(
        f"{where} nests lists and mappings more than {limit} deep; dew writes values at most "
        f"{limit} deep, so that every file holding one stays within the {MAX_DEPTH} it reads."
    )


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> Any:
    """Return `value` unless it nests more than `limit` lists and mappings deep, which
    raises `ValueError` naming `where`."""
    if _nests_deeper(value, limit):
        raise nesting_error(where, limit)
    return value


def python_scalar(value: Any) -> Any:
    """`value` as a Python scalar when it is a NumPy or JAX scalar (a 0-d array: `.item()`);
    anything else unchanged."""
    if isinstance(value, _SCALARS) or value is None:
        return value
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    return value


def _non_finite_text(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def plain(
    value: Any,
    where: str,
    *,
    holder: str = "a JSON value",
    reserved_by: str | None = None,
    nan: str | None = None,
    default: Callable[[Any], Any] | None = None,
    _nested: bool = False,
) -> Any:
    """`value` in JSON's data model: dicts with string keys, lists, str, int, float, bool,
    None. NumPy and JAX scalars become Python ones, tuples lists; floats stay floats (NaN and
    infinities included). Lists and mappings nested more than `VALUE_DEPTH` deep raise
    `ValueError`: a file holding them could not be read back.

    **Arguments:**

    - `where`: names the value in errors (`"trial_finished.overrides"`).
    - `holder`: what holds the value, in errors (`"a record"`, `"a space"`).
    - `reserved_by`: when given, the strings `"NaN"`, `"+Inf"`, `"-Inf"` are refused, the
      error saying that `reserved_by` reserves them.
    - `nan`: when given, NaN is refused, with `nan` as the reason.
    - `default`: called with a leaf of any other type; its result takes the leaf's place
      as it is. Without it such a leaf raises `TypeError`.
    """
    value = python_scalar(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        value = str.__str__(value)
        if reserved_by is not None and value in NON_FINITE:
            raise ValueError(
                f"{where} is the string {value!r}, which {reserved_by} reserves for a non-finite "
                f"float; pass float({value!r}) or another string."
            )
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if nan is not None and math.isnan(value):
            raise ValueError(f"{where} is NaN; {nan}.")
        return value
    rules = {"holder": holder, "reserved_by": reserved_by, "nan": nan, "default": default}
    if not _nested:  # once, at the top: a deep value's error names the whole value
        check_depth(value, where, VALUE_DEPTH)
    rules["_nested"] = True
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                kind = holder.split()[-1]
                raise TypeError(f"{where} has key {key!r}; {kind} mapping keys must be strings.")
            result[str.__str__(key)] = plain(item, f"{where}[{key!r}]", **rules)
        return result
    if isinstance(value, list | tuple):
        return [plain(item, f"{where}[{index}]", **rules) for index, item in enumerate(value)]
    if default is not None:
        return default(value)
    raise TypeError(
        f"{where} is {value!r} of type {type(value).__name__}; {holder} holds None, bool, int, "
        "float, str, and lists and string-keyed mappings of them."
    )


def encode(value: Any, where: str = "the value", **rules: Any) -> Any:
    """`plain(value, where, **rules)` with non-finite floats as `"NaN"`, `"+Inf"`, `"-Inf"`:
    what dew writes as JSON."""
    return _encode_plain(plain(value, where, **rules))


def _encode_plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite_text(value)
    if isinstance(value, dict):
        return {key: _encode_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_encode_plain(item) for item in value]
    return value


def decode(value: Any) -> Any:
    """Inverse of `encode`: the three reserved strings become floats, nested anywhere."""
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    if isinstance(value, Mapping):
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def _fsync_directory(folder: pathlib.Path) -> None:
    with contextlib.suppress(OSError):  # not every platform opens folders
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def write_atomic(
    path: str | os.PathLike[str], content: str | bytes, *, durable: bool = True
) -> None:
    """Write `content` to `path` through a temporary file beside it, then replace `path`,
    so `path` is always either its whole old or its whole new content. `durable` also
    fsyncs the file and its folder, so the new content survives a power cut. An `OSError`
    (a full or read-only disk) names `path`, and leaves it and its folder as they were."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        if isinstance(error, OSError) and error.errno is not None:
            raise OSError(error.errno, error.strerror, str(path)) from error  # not the temp's
        raise
    if durable:
        _fsync_directory(path.parent)


def loads(data: bytes | str, subject: str, what: str = "JSON") -> Any:
    """Parse the JSON text `data`. Text that is not UTF-8 JSON, or nests more than
    `MAX_DEPTH` deep, raises `ValueError` saying `"<subject> is not valid <what>: ..."`
    (`subject`: the file, or its line), never `RecursionError`."""
    where = f"{subject} is not valid {what}"
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as error:
        raise ValueError(f"{where}: it is not UTF-8 ({error}).") from error
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        empty = " (the file is empty)" if not text.strip() else ""
        raise ValueError(f"{where}{empty}: {error}.") from error
    except RecursionError:  # json's C scanner counts nesting against the recursion limit
        raise nesting_error(f"{where}: it") from None
    except ValueError as error:  # an integer past Python's 4300 digits
        raise ValueError(f"{where}: {error}.") from error
    return check_depth(value, f"{where}: it")


def read_json(path: str | os.PathLike[str], what: str = "JSON") -> Any:
    """Parse the JSON file at `path`; a file that is not UTF-8 JSON, or nests more than
    `MAX_DEPTH` deep, raises `ValueError` naming `path` (and what the file should hold,
    `what`)."""
    path = pathlib.Path(path)
    return loads(path.read_bytes(), str(path), what)
