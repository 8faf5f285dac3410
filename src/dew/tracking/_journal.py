"""The journals of a `LocalTracker` folder: their files, their line shapes, reopening one
for appending, and reading a folder back (`read_journal`)."""

import bisect
import dataclasses
import json
import os
import pathlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from dew import _json
from dew._files import append_line, open_for_writing
from dew.telemetry.records import Record, decode_json_value, record_from_dict

__all__ = [
    "Journal",
    "append_line",
    "entries",
    "read_journal",
    "read_params",
    "read_records",
    "repair_tail",
]

SCALARS = "scalars.jsonl"
RECORDS = "records.jsonl"
PARAMS = "params.json"
SUMMARY = "summary.json"
RESUME = "resume"
"""The key marking a resume boundary line: `{"step": 4, "values": {}, "resume": true}`."""


def _scalars_entry(entry: Any) -> str | None:
    """Why `entry` is not a scalars line, or None when it is one."""
    if type(entry) is dict and len(entry) == 2:  # the common line, checked at once
        step, values = entry.get("step"), entry.get("values")
        if type(step) is int and step >= 0 and type(values) is dict:
            for value in values.values():
                kind = type(value)
                if kind is not float and kind is not int and kind is not str:
                    break
                if kind is str and value not in _json.NON_FINITE:
                    break
            else:
                return None
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


_UNREAD = object()
_SHAPES: dict[str, Callable[[Any], str | None]] = {SCALARS: _scalars_entry, RECORDS: _records_entry}


def _parse_line(path: pathlib.Path, number: int, line: bytes) -> Any:
    """One journal line, checked for its journal's shape; `ValueError` naming the line."""
    entry = _json.loads(line, f"{path}: line {number}")
    problem = _SHAPES[path.name](entry)
    if problem is not None:
        raise ValueError(f"{path}: line {number} is not a {path.name} line: {problem}.")
    return entry


_BLOCK = 1 << 16


def _tail(journal: Any) -> bytes:
    """The bytes after the last newline of the open binary `journal` (empty when it ends in
    one), read backward from its end: a journal's length never costs a reopen."""
    end = journal.seek(0, os.SEEK_END)
    tail, position = b"", end
    while position > 0:
        step = min(_BLOCK, position)
        position -= step
        journal.seek(position)
        tail = journal.read(step) + tail
        newline = tail.rfind(b"\n")
        if newline >= 0:
            return tail[newline + 1 :]
    return tail


def repair_tail(path: pathlib.Path) -> None:
    """Prepare a journal for appending, reading only its last line.

    A tail without its newline is finished with one when it is a whole line, and cut
    back to the last complete line (with a warning) when it is torn, so appending never
    glues a new line onto a half-written one.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as journal:
        tail = _tail(journal)
    if not tail:
        return
    try:
        _parse_line(path, 0, tail)
    except ValueError:
        with open_for_writing(path, "r+b") as journal:
            journal.truncate(path.stat().st_size - len(tail))
        warnings.warn(
            f"{path} ended in a torn line (a crash mid-write?); cut it back to its last "
            f"complete line ({len(tail)} bytes dropped).",
            stacklevel=4,
        )
    else:
        with open_for_writing(path, "ab") as journal:
            journal.write(b"\n")  # a whole line whose newline was never written


def warn_malformed(malformed: list[str]) -> None:
    """Warn, naming the first, of the malformed complete lines a reopened journal keeps."""
    if malformed:
        more = f" (and {len(malformed) - 1} more malformed lines)" if len(malformed) > 1 else ""
        warnings.warn(
            f"{malformed[0]}{more} LocalTracker keeps it and appends after it, but "
            "read_journal refuses this journal until the line is repaired or removed.",
            stacklevel=4,
        )


def _reopen_journal(path: pathlib.Path) -> None:
    """Prepare a journal for appending (`repair_tail`), and warn of its malformed lines
    (kept: `read_journal` refuses the journal until they are repaired), streaming it."""
    repair_tail(path)
    malformed: list[str] = []
    for _ in entries(path, malformed=malformed):
        pass
    warn_malformed(malformed)


def _read_params(path: pathlib.Path) -> dict[str, Any]:
    """The parameters in `params.json`; a file that is not a JSON object raises naming it."""
    params = _json.read_json(path, "params.json (a JSON object of parameters)")
    if not isinstance(params, dict):
        raise ValueError(f"{path} holds {type(params).__name__}, not a JSON object of parameters.")
    return params


def read_params(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A `LocalTracker` folder's parameters (`params.json`, non-finite values decoded; none:
    `{}`); a file that is not a JSON object raises naming it."""
    params_file = pathlib.Path(path) / PARAMS
    return decode_json_value(_read_params(params_file)) if params_file.exists() else {}


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


def entries(
    path: pathlib.Path, *, start: int = 0, first: int = 1, malformed: list[str] | None = None
) -> Iterator[tuple[int, int, bytes, Any]]:
    """A journal's entries, one line at a time: `(line number, the byte just past the
    line, line, entry)` from byte `start` on (`first`: the number of the line there). A
    torn last line (not JSON, no newline) is skipped with a warning. A malformed line
    raises `ValueError` naming it, or, given a `malformed` list, is noted there and
    skipped."""
    if not path.exists():
        return
    shape = _SHAPES[path.name]
    with open(path, "rb") as journal:
        journal.seek(start)
        end = start
        for number, line in enumerate(journal, start=first):
            end += len(line)
            try:  # the common line, parsed at once; any other, again, to name what is wrong
                entry = json.loads(line.decode("utf-8"))
            except (ValueError, RecursionError):
                entry = _UNREAD
            if entry is not _UNREAD and shape(entry) is None:
                yield number, end, line, entry
                continue
            if not line.strip():
                continue
            try:
                entry = _parse_line(path, number, line)
            except ValueError as error:
                if not line.endswith(b"\n") and isinstance(
                    error.__cause__, json.JSONDecodeError | UnicodeDecodeError
                ):
                    warnings.warn(
                        f"{path}: skipped a torn last line (a crash mid-write?); every line "
                        "before it was read.",
                        stacklevel=3,
                    )
                    return
                if malformed is None:
                    raise  # not the last line, or a whole line of the wrong shape
                malformed.append(str(error))
                continue
            yield number, end, line, entry


def read_records(
    path: str | os.PathLike[str],
) -> tuple[list[tuple[str, int | None, Record]], list[tuple[str, int | None, Any]]]:
    """A `LocalTracker` folder's records journal, streamed: its typed records and its other
    artifacts, as `read_journal` returns them (`Journal.records`, `Journal.artifacts`),
    without reading its scalars."""
    records: list[tuple[str, int | None, Record]] = []
    artifacts: list[tuple[str, int | None, Any]] = []
    records_path = pathlib.Path(path) / RECORDS
    for number, _, _, entry in entries(records_path):
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
    return records, artifacts


def _step(point: tuple[int, float]) -> int:
    return point[0]


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
    series: dict[str, list[tuple[int, float]]] = {}
    latest: dict[str, int] = {}  # a series' greatest step
    places: dict[str, dict[int, int]] = {}  # the steps of a series out of step order
    resumes = []
    non_finite = _json.NON_FINITE
    for _, _, _, entry in entries(path / SCALARS):
        step = entry["step"]
        if len(entry) == 3 and entry[RESUME]:
            resumes.append(step)
        for tag, value in entry["values"].items():
            value = non_finite[value] if type(value) is str else float(value)
            last = latest.get(tag)
            if last is None:
                latest[tag] = step
                series[tag] = [(step, value)]
                continue
            if step > last:  # the common value: a new, later step
                latest[tag] = step
                if places and tag in places:
                    places[tag][step] = len(series[tag])
                series[tag].append((step, value))
                continue
            points = series[tag]
            place = places.get(tag)
            if place is None:  # in step order so far: a resumed fit's step is found by bisection
                index = bisect.bisect_left(points, step, key=_step)
                if index < len(points) and points[index][0] == step:
                    points[index] = (step, value)  # logged again: the last value stands
                    continue
                place = places[tag] = {known: i for i, (known, _) in enumerate(points)}
            if step in place:
                points[place[step]] = (step, value)
            else:  # a step not logged before, below the greatest: listed last, as logged
                place[step] = len(points)
                points.append((step, value))
    records, artifacts = read_records(path)
    return Journal(series, records, artifacts, read_params(path), resumes)
