"""The JSON dew writes: one normaliser, atomic writes, and reads whose errors name the file.

Every JSON file and journal line dew writes goes through `plain` (values in JSON's data
model, NumPy and JAX scalars as Python numbers) and `encode` (non-finite floats as the
strings `"NaN"`, `"+Inf"`, `"-Inf"`); files are replaced atomically by `write_atomic`
and read back by `read_json`, whose errors name the file.
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
    "NON_FINITE",
    "decode",
    "encode",
    "plain",
    "python_scalar",
    "read_json",
    "write_atomic",
]

NON_FINITE = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}
"""The strings dew's JSON writes for non-finite floats, and the floats they stand for."""

_SCALARS = (bool, int, float, str)


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
) -> Any:
    """`value` in JSON's data model: dicts with string keys, lists, str, int, float, bool,
    None. NumPy and JAX scalars become Python ones, tuples lists; floats stay floats (NaN and
    infinities included).

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


def read_json(path: str | os.PathLike[str], what: str = "JSON") -> Any:
    """Parse the JSON file at `path`; a file that is not UTF-8 JSON raises `ValueError`
    naming `path` (and what the file should hold, `what`)."""
    path = pathlib.Path(path)
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not valid {what}: it is not UTF-8 ({error}).") from error
    except json.JSONDecodeError as error:
        empty = " (the file is empty)" if not data.strip() else ""
        raise ValueError(f"{path} is not valid {what}{empty}: {error}.") from error
