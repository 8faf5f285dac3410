"""The journals of a `LocalTracker` folder: their files, their line shapes, reopening one
for appending, and reading a folder back (`read_journal`)."""

import dataclasses
import json
import os
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

from dew import _json
from dew._files import append_line, open_for_writing
from dew.telemetry.records import Record, decode_json_value, record_from_dict

__all__ = ["Journal", "append_line", "read_journal"]

SCALARS = "scalars.jsonl"
RECORDS = "records.jsonl"
PARAMS = "params.json"
RUN_RECORD = "run.json"
RESUME = "resume"
"""The key marking a resume boundary line: `{"step": 4, "values": {}, "resume": true}`."""


def _scalars_entry(entry: Any) -> str | None:
    """Why `entry` is not a scalars line, or None when it is one."""
    if not isinstance(entry, dict) or set(entry) - {"step", "values", RESUME}:
        return 'it is not {"step": ..., "values": {...}}'
    step, values = entry.get("step"), entry.get("values")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"its step is {step!r}, not an integer >= 0"
    if not isinstance(values, dict):
        return f"its values are {values!r}, not a mapping"
    for tag, value in values.items():
        if isinstance(value, str) and value in _json.NON_FINITE:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"metric {tag!r} is {value!r}, not a number"
    return None


def _records_entry(entry: Any) -> str | None:
    """Why `entry` is not a records line, or None when it is one."""
    if not isinstance(entry, dict) or "name" not in entry or "step" not in entry:
        return 'it is not {"name": ..., "step": ..., "record" | "files" | "value": ...}'
    kinds = [key for key in ("record", "files", "value") if key in entry]
    if len(kinds) != 1 or len(entry) != 3:
        return "it needs exactly one of 'record', 'files', 'value' besides 'name' and 'step'"
    step = entry["step"]
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        return f"its step is {step!r}, not None or an integer >= 0"
    if kinds == ["record"] and not isinstance(entry["record"], dict):
        return f"its record is {entry['record']!r}, not a mapping"
    return None


_SHAPES: dict[str, Callable[[Any], str | None]] = {SCALARS: _scalars_entry, RECORDS: _records_entry}


def _parse_line(path: pathlib.Path, number: int, line: bytes) -> Any:
    """One journal line, checked for its journal's shape; `ValueError` naming the line."""
    entry = _json.loads(line, f"{path}: line {number}")
    problem = _SHAPES[path.name](entry)
    if problem is not None:
        raise ValueError(f"{path}: line {number} is not a {path.name} line: {problem}.")
    return entry


def _lines(path: pathlib.Path) -> tuple[list[bytes], bytes]:
    """The complete lines of a journal and its tail (empty when it ends in a newline)."""
    pieces = path.read_bytes().split(b"\n")
    return pieces[:-1], pieces[-1]


def _reopen_journal(path: pathlib.Path) -> list[Any]:
    """Prepare a journal for appending, and return its entries.

    A tail without its newline is finished with one when it is a whole line, and cut
    back to the last complete line (with a warning) when it is torn, so appending never
    glues a new line onto a half-written one. A malformed complete line is kept and
    warned about, naming it: `read_journal` refuses the journal until it is repaired.
    """
    if not path.exists() or path.stat().st_size == 0:
        return []
    lines, tail = _lines(path)
    entries, malformed = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(_parse_line(path, number, line))
        except ValueError as error:
            malformed.append(str(error))
    if tail:
        try:
            entries.append(_parse_line(path, len(lines) + 1, tail))
        except ValueError:
            with open_for_writing(path, "r+b") as journal:
                journal.truncate(path.stat().st_size - len(tail))
            warnings.warn(
                f"{path} ended in a torn line (a crash mid-write?); cut it back to its last "
                f"complete line ({len(tail)} bytes dropped).",
                stacklevel=3,
            )
        else:
            with open_for_writing(path, "ab") as journal:
                journal.write(b"\n")  # a whole line whose newline was never written
    if malformed:
        more = f" (and {len(malformed) - 1} more malformed lines)" if len(malformed) > 1 else ""
        warnings.warn(
            f"{malformed[0]}{more} LocalTracker keeps it and appends after it, but "
            "read_journal refuses this journal until the line is repaired or removed.",
            stacklevel=3,
        )
    return entries


def _read_params(path: pathlib.Path) -> dict[str, Any]:
    """The parameters in `params.json`; a file that is not a JSON object raises naming it."""
    params = _json.read_json(path, "params.json (a JSON object of parameters)")
    if not isinstance(params, dict):
        raise ValueError(f"{path} holds {type(params).__name__}, not a JSON object of parameters.")
    return params


@dataclasses.dataclass(frozen=True)
class Journal:
    """What a `LocalTracker` folder holds, as `read_journal` returns it.

    - `scalars`: metric tag to `[(step, value), ...]`, values as floats, one value per
      step: the last one logged.
    - `records`: `[(name, step, record)]` for every typed record, in order.
    - `artifacts`: `[(name, step, value_or_files)]` for the other artifacts.
    - `params`: the flattened parameters.
    - `resumes`: the steps at which a fit resumed (the journal's resume boundaries).
    """

    scalars: dict[str, list[tuple[int, float]]]
    records: list[tuple[str, int | None, Record]]
    artifacts: list[tuple[str, int | None, Any]]
    params: dict[str, Any]
    resumes: list[int] = dataclasses.field(default_factory=list)


def _read_lines(path: pathlib.Path) -> list[tuple[int, Any]]:
    """A journal's entries with their line numbers."""
    if not path.exists():
        return []
    lines, tail = _lines(path)
    entries = [
        (number, _parse_line(path, number, line))
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if tail.strip():
        try:
            entries.append((len(lines) + 1, _parse_line(path, len(lines) + 1, tail)))
        except ValueError as error:
            if isinstance(error.__cause__, json.JSONDecodeError | UnicodeDecodeError):
                warnings.warn(
                    f"{path}: skipped a torn last line (a crash mid-write?); every line "
                    "before it was read.",
                    stacklevel=3,
                )
            else:
                raise  # a whole line of the wrong shape
    return entries


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read a `LocalTracker` folder back: scalars by tag, records, artifacts, params.

    Each series holds one value per step, the last one logged: the steps a resumed fit
    logs again replace the values logged before the resume boundary. A torn last line
    (a crash mid-write) is skipped with a warning; a malformed line anywhere else (not
    UTF-8, not JSON, or not the journal's shape) raises `ValueError` naming the file
    and the line, and so does a `params.json` that is not a JSON object.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no LocalTracker folder at {str(path)!r}.")
    by_step: dict[str, dict[int, float]] = {}
    resumes = []
    for _, entry in _read_lines(path / SCALARS):
        step = entry["step"]
        if entry.get(RESUME):
            resumes.append(step)
        for tag, value in entry["values"].items():
            by_step.setdefault(tag, {})[step] = float(decode_json_value(value))
    scalars = {tag: list(series.items()) for tag, series in by_step.items()}
    records: list[tuple[str, int | None, Record]] = []
    artifacts: list[tuple[str, int | None, Any]] = []
    records_path = path / RECORDS
    for number, entry in _read_lines(records_path):
        if "record" in entry:
            try:
                record = record_from_dict(entry["record"])
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"{records_path}: line {number} holds no record: {error}"
                ) from error
            records.append((entry["name"], entry["step"], record))
        elif "files" in entry:
            artifacts.append((entry["name"], entry["step"], entry["files"]))
        else:
            artifacts.append((entry["name"], entry["step"], decode_json_value(entry["value"])))
    params_file = path / PARAMS
    params = decode_json_value(_read_params(params_file)) if params_file.exists() else {}
    return Journal(scalars, records, artifacts, params, resumes)
