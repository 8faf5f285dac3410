"""TOML: the keys and values of a run configuration written as TOML text, and TOML text and
files read back (`tomllib`), errors naming the file and values nested at most
`dew._json.MAX_DEPTH` deep."""

import os
import re
import tomllib
from typing import Any

from dew._json import check_depth, nesting_error

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_ESCAPES["\r"] = "\\r"


def _toml_string(value: str) -> str:
    out = []
    for character in value:
        if character in _ESCAPES:
            out.append(_ESCAPES[character])
        elif ord(character) < 0x20 or ord(character) == 0x7F:
            out.append(f"\\u{ord(character):04X}")
        else:
            out.append(character)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_value(value: Any, where: str) -> str:
    if value is None:
        raise ValueError(
            f"{where} is None, which TOML cannot hold; leave the key out of the kwargs to use "
            "the builder's default, or keep the config as JSON (to_dict)."
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        items = (_toml_value(item, f"{where}[{index}]") for index, item in enumerate(value))
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = (
            f"{_toml_key(key)} = {_toml_value(item, f'{where}.{key}')}"
            for key, item in value.items()
        )
        return "{ " + ", ".join(items) + " }"
    raise TypeError(f"{where} is {value!r} of type {type(value).__name__}, which TOML cannot hold.")


def loads_toml(text: str, where: str) -> dict[str, Any]:
    """Parse the TOML text `text`; text that is not TOML, or nests more than
    `dew._json.MAX_DEPTH` deep, raises `ValueError` saying `"<where> is not valid TOML:
    ..."` (a `tomllib.TOMLDecodeError` as its cause), never `RecursionError`."""
    invalid = f"{where} is not valid TOML"
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{invalid}: {error}.") from error
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise nesting_error(f"{invalid}: it") from None
    except ValueError as error:  # an integer past Python's 4300 digits
        raise ValueError(f"{invalid}: {error}.") from error
    return check_depth(values, f"{invalid}: it")


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML file at `path`, as `loads_toml` reads it; a file that is not UTF-8 raises
    `ValueError` naming it."""
    with open(path, "rb") as file:
        data = file.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{os.fspath(path)} is not valid TOML: it is not UTF-8 ({error})."
        ) from None
    return loads_toml(text, os.fspath(path))
