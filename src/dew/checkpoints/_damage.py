"""Damaged checkpoints: which failures of a restore mean a step's files are damaged, what
is wrong with them in a few words, and setting a damaged step aside.

A step orbax lists is complete by orbax's own rule (its folder was renamed into place, or
on Google Cloud Storage holds its `commit_success.txt`); whether its files are whole is
known only by restoring it. A restore that fails with a missing item (`KeyError`), a file
that is not valid JSON or an array TensorStore cannot read (`ValueError`), or a missing
file means damage; a failure to reach the store (network, credentials, permissions) does
not, and is raised as it is.
"""

import json
import re
from typing import Any

from dew.checkpoints._orbax import transient

__all__ = ["DamagedCheckpointWarning", "damage", "misplaced_steps", "set_aside"]

SET_ASIDE = "damaged"
"""A damaged step's folder `<step>` is renamed `<step>.damaged` (orbax lists no such name)."""

_JSON_FILES = ("state/_METADATA", "extra/metadata")
_SHOWN = 160
_STATUS = re.compile(r"([A-Z_]+): ")
_LOCAL_FILE = re.compile(r'local file "([^"]+)"')
_STATUS_WORDS = {
    "NOT_FOUND": "is missing",
    "OUT_OF_RANGE": "is cut short",
    "DATA_LOSS": "is corrupt",
}


class DamagedCheckpointWarning(UserWarning):
    """A checkpoint step was damaged and an earlier one was restored instead."""


def damage(error: BaseException) -> bool:
    """Whether `error`, raised restoring a step, says the step's files are damaged."""
    if isinstance(error, KeyError | FileNotFoundError | NotADirectoryError | IsADirectoryError):
        return True
    return isinstance(error, ValueError) and not transient(error)


def _first_line(error: BaseException) -> str:
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    text = (text.splitlines() or [type(error).__name__])[0].split(" [tensorstore_spec=")[0]
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _unreadable_file(folder: Any, error: BaseException) -> str | None:
    """A TensorStore read failure as the file it could not read, relative to the step
    folder, and what is wrong with it (`None`: not such a failure)."""
    text = str(error)
    status = _STATUS.match(text)
    files = _LOCAL_FILE.findall(text)
    if status is None or not files:
        return None
    name = files[-1]  # the innermost: the file itself, not the database holding it
    prefix = f"{str(folder).rstrip('/')}/"
    if name.startswith(prefix):
        name = name[len(prefix) :]
    what = _STATUS_WORDS.get(status.group(1), f"cannot be read ({status.group(1)})")
    return f"the array data under {name} {what}" if name.endswith("/") else f"{name} {what}"


def reason(folder: Any, items: tuple[str, ...], error: BaseException) -> str:
    """What is wrong with the step folder `folder` (an `epath.Path`), in a few words, for
    a restore that failed with `error`: the folder empty, an item missing, a JSON file
    that does not parse, else the error's first line."""
    if not any(True for _ in folder.iterdir()):
        return "its folder is empty"
    for item in items:
        if not (folder / item).is_dir():
            return f"its {item}/ item is missing"
    for name in _JSON_FILES:
        path = folder / name
        if not path.exists():
            return f"{name} is missing"
        try:
            json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            return f"{name} is not valid JSON (cut short?)"
    return _unreadable_file(folder, error) or _first_line(error)


def misplaced_steps(directory: Any) -> dict[int, str]:
    """The entries of a checkpoint directory (an `epath.Path`) named as steps that are
    not folders (orbax passes over them without a word), with what they are."""
    if not directory.is_dir():
        return {}
    return {
        int(entry.name): "it is a file, not a checkpoint folder"
        for entry in directory.iterdir()
        if entry.name.isdigit() and not entry.is_dir()
    }


def set_aside(path: Any) -> Any:
    """Rename the damaged step `path` to `<step>.damaged` (`.damaged.2`, ... when taken),
    so a later save of that step finds its place free; returns the new path."""
    target = path.with_name(f"{path.name}.{SET_ASIDE}")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.{SET_ASIDE}.{number}")
    path.rename(target)
    return target
