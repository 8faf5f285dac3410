"""Where a source's files are: the one place a path argument is checked and resolved.

A path is kept as the user gave it (a relative path stays relative, so a configuration that
names `data/train.npy` reads it from the working directory of each run); `local_path` only
checks it and returns the `pathlib.Path` to open.
"""

import os
import pathlib
from typing import Any

__all__ = ["local_path"]


def local_path(source: str, value: Any, what: str) -> pathlib.Path:
    """`value` (a `str` or `os.PathLike`, `~` expanded) as the path of an existing file.

    **Raises:** `TypeError` for anything but a path; `FileNotFoundError` naming `source`,
    `what` the file should hold and the path, when there is no file there (a folder is
    not one).
    """
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise TypeError(f"{source}: the path of {what} must be a non-empty path, got {value!r}.")
    path = pathlib.Path(os.fspath(value)).expanduser()
    if not path.is_file():
        found = "a folder" if path.is_dir() else "no file"
        raise FileNotFoundError(f"{source}: {found} at {os.fspath(value)!r}, expected {what}.")
    return path
