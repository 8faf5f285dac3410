"""Writing TOML: the keys and values of a run configuration as TOML text (`tomllib` reads it
back)."""

import re
from typing import Any

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
