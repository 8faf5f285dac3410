"""TOML: the keys and values of a run configuration written as TOML text (`tomli_w`), and TOML
text and files read back (`tomllib`), errors naming the file and values nested at most
`dew._json.MAX_DEPTH` deep."""

import os
import tomllib
from typing import Any

from dew._json import check_depth, nesting_error


def _check_toml(value: Any, where: str) -> None:
    """Raise, naming `where` (the value's dotted path), if `value` holds anything TOML cannot:
    a None, or a value other than a bool, int, float, string, list or string-keyed dict."""
    if value is None:
        raise ValueError(
            f"{where} is None, which TOML cannot hold; leave the key out of the kwargs to use "
            "the builder's default, or keep the config as JSON (to_dict)."
        )
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_toml(item, f"{where}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}; TOML keys are strings.")
            _check_toml(item, f"{where}.{key}")
    elif not isinstance(value, bool | int | float | str):
        raise TypeError(
            f"{where} is {value!r} of type {type(value).__name__}, which TOML cannot hold."
        )


def dumps_toml(document: dict[str, dict[str, Any]]) -> str:
    """The TOML text of `document`, tables of keys and values, written by `tomli_w` (a value
    that TOML cannot hold raises first, naming its dotted path: `_check_toml`)."""
    for section, values in document.items():
        _check_toml(values, section)
    import tomli_w  # imported here: only writing TOML needs it

    return tomli_w.dumps(document)


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
