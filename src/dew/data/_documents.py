"""Text documents from files: paths and globs resolved to files, each file one document (plain
text) or one document a line (JSON Lines, the text under a named field)."""

from __future__ import annotations

import glob
import json
import os
import pathlib
from collections.abc import Sequence

__all__ = ["file_documents", "resolve_files"]

_MAGIC = frozenset("*?[")


def _entries(owner: str, paths: object) -> list[str]:
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    if (
        isinstance(paths, Sequence)
        and paths
        and all(isinstance(entry, str | os.PathLike) for entry in paths)
    ):
        return [os.fspath(entry) for entry in paths]
    raise TypeError(
        f"{owner}: paths must be a file path or glob, or a non-empty list of them, got {paths!r}."
    )


def resolve_files(owner: str, paths: object) -> list[pathlib.Path]:
    """The files `paths` names, in order: each entry a file, or a glob (`*`, `?`, `[...]`,
    `**` for any depth) whose matches are taken in sorted order; a file named twice is read
    once, at its first place.

    **Raises:** `FileNotFoundError` naming a path with no file, a folder, or a glob that
    matches no file; `TypeError` for anything but a path or a list of paths.
    """
    files: dict[pathlib.Path, pathlib.Path] = {}
    for entry in _entries(owner, paths):
        path = pathlib.Path(entry).expanduser()
        if path.is_file():
            matches = [path]
        elif _MAGIC & set(entry):
            pattern = os.fspath(path)
            matches = [pathlib.Path(found) for found in sorted(glob.glob(pattern, recursive=True))]
            matches = [found for found in matches if found.is_file()]
            if not matches:
                raise FileNotFoundError(f"{owner}: the glob {entry!r} matches no file.")
        elif path.is_dir():
            raise FileNotFoundError(
                f"{owner}: {entry!r} is a folder; name its files with a glob such as "
                f"{os.path.join(entry, '**', '*.txt')!r}."
            )
        else:
            raise FileNotFoundError(f"{owner}: no file at {entry!r}.")
        for found in matches:
            files.setdefault(found.resolve(), found)
    return list(files.values())


def _utf8(owner: str, path: pathlib.Path, data: bytes, why: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{owner}: {os.fspath(path)!r} line {line} is not UTF-8 ({error.reason}, byte "
            f"{data[error.start : error.start + 1]!r} at offset {error.start}); {why}."
        ) from None


def _json_kind(value: object) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


def file_documents(
    owner: str, path: pathlib.Path, data: bytes, *, field: str | None, raw: bool
) -> list[str] | list[bytes]:
    """The non-empty documents of one file's bytes `data`.

    - `field=None`: the whole file is one document: its bytes when `raw` (a tokenizer that
      reads bytes), else its UTF-8 text.
    - `field="name"`: JSON Lines, one document a line: the string under `name` of each line's
      object (blank lines skipped).

    **Raises:** `ValueError` in one line naming the file and line: text that is not UTF-8
    (unless `raw` and no `field`), a line that is not JSON, not an object, without `field`,
    or whose `field` is not a string.
    """
    if field is None:
        if path.suffix == ".jsonl":
            raise ValueError(
                f"{owner}: {os.fspath(path)!r} is JSON Lines: pass field= naming the field that "
                "holds each line's text (or rename the file to train on its raw characters)."
            )
        if raw:
            return [data] if data else []
        text = _utf8(owner, path, data, "the bytes tokenizer reads any bytes; this one needs text")
        return [text] if text else []
    text = _utf8(owner, path, data, "JSON Lines are UTF-8 text")
    documents: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{owner}: {os.fspath(path)!r} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{where} is not JSON ({error.msg} at column {error.colno})."
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{where} is {_json_kind(record)}, not an object with the field {field!r}."
            )
        if field not in record:
            fields = ", ".join(repr(key) for key in record) or "none"
            raise ValueError(f"{where} has no field {field!r} (its fields: {fields}).")
        value = record[field]
        if not isinstance(value, str):
            raise ValueError(f"{where}: the field {field!r} is {_json_kind(value)}, not a string.")
        if value:
            documents.append(value)
    return documents
