"""The sweep's ledger format: a JSON-lines file of the trials a sweep started and finished, read
back as strictly as it is written (`read_entry`, `read_ledger`); decision 0045. A sweep's use of
it (its locks, appends and the state read so far) is `_ledger_file`'s.

Its first line is the header, `{"version": 2, "space", "search", "config", "direction",
"budget"}`, written whole (`write_atomic`) when the ledger is created. Every later line is one
event, appended under the lock and fsynced: `{"running": {"index", "overrides"}}` before a trial
trains, `{"finished": {"index", "overrides", "value"}}` once it returned its score, and
`{"budget": N}` when a sweep with a larger trial budget opens the ledger. A sweep with a pruner
(decision 0055) adds `"reports": [[step, value], ...]` (the validation scores the trial reported
at its evaluation events) to a finished trial's entry, and ends a trial its pruner stopped with
`{"pruned": {"index", "overrides", "value", "reports"}}` instead of `finished`. A last line
without its newline (a writer that died mid-write) is no event: readers ignore it, and the next
writer cuts it off. A version-1 ledger (one JSON object, rewritten whole on every change) is
still read, and the first sweep that opens it converts it to version 2, whole."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterator, Set
from typing import Any

from dew import _json
from dew.config.sweep._search import Trial
from dew.config.sweep._space import Space, _is_int, _outside, _space_from_json
from dew.telemetry.records import decode_json_value

LEDGER_VERSION = 2
OLD_VERSION = 1
"""The whole-JSON ledgers of earlier dew, read and converted (decision 0045)."""
MOST_TRIALS = 2**63 - 1
"""The largest trial budget: trial `index` holds byte `index + 1` of the ledger's lock file,
and a lock's byte offset is a signed 64-bit integer."""
_REQUIRED = {
    LEDGER_VERSION: ("version", "space", "search", "config", "direction", "budget"),
    OLD_VERSION: ("version", "space", "search", "config", "trials"),
}
_OPTIONAL = {LEDGER_VERSION: (), OLD_VERSION: ("direction", "budget", "running")}  # older lack some
_EVENTS = ("budget", "running", "finished", "pruned")


@dataclasses.dataclass
class _State:
    finished: dict[int, Trial]
    running: dict[int, dict[str, Any]]
    budget: int | None = None  # the largest budget a sweep of the ledger has had

    def taken(self) -> Set[int]:
        """The indices finished or running: a live view, not a copy."""
        return _Taken(self)


class _Taken(Set[int]):
    def __init__(self, state: _State) -> None:
        self._state = state

    def __contains__(self, index: object) -> bool:
        return index in self._state.finished or index in self._state.running

    def __iter__(self) -> Iterator[int]:
        yield from self._state.finished  # the two never share an index
        yield from self._state.running

    def __len__(self) -> int:
        return len(self._state.finished) + len(self._state.running)


class _EntryError(ValueError):
    """What is wrong with one ledger entry; the caller says where the entry came from."""


def _shown(value: Any) -> str:
    """`value` for an error line, cut short when long."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def read_entry(
    entry: Any,
    where: str,
    *,
    space: Space,
    budget: int | None,
    finished: bool,
    pruned: bool = False,
) -> Trial:
    """One ledger entry (`{"index", "overrides", "value"}` when `finished`, with
    `"reports"` when the trial reported scores; `{"index", "overrides", "value",
    "reports"}` when `pruned`; else `{"index", "overrides"}`, in the ledger's JSON form) as
    a `Trial` (a running one's value is 0.0), checked as strictly as a sweep writes it: an
    index below `budget` (the largest trial budget the ledger's sweeps had; `None`:
    `MOST_TRIALS`), a point of `space` at exactly its paths, a number (or `"NaN"`,
    `"+Inf"`, `"-Inf"`) for its value, and `[step, value]` pairs at rising steps >= 0 for
    its reports.

    **Raises:** `ValueError` naming `where` (`"trials[3]"`), the trial and the bad value.
    """
    finished = finished or pruned
    fields = {"index", "overrides", "value"} if finished else {"index", "overrides"}
    given = set(entry) if isinstance(entry, dict) else set()
    if pruned or (finished and "reports" in given):
        fields.add("reports")
    if not isinstance(entry, dict) or given != fields:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise _EntryError(f"{where} has {keys}, not exactly {sorted(fields)}")
    index, overrides = entry["index"], entry["overrides"]
    most = MOST_TRIALS if budget is None else budget
    if not _is_int(index) or not 0 <= index < most:
        limit = "[0, 2**63 - 1)" if budget is None else f"[0, {budget}), the trial budget"
        raise _EntryError(f"{where} has trial index {_shown(index)}, not an integer in {limit}")
    where = f"{where} (trial {index})"
    if not isinstance(overrides, dict) or set(overrides) != set(space):
        shown = sorted(overrides) if isinstance(overrides, dict) else _shown(overrides)
        raise _EntryError(f"{where} sets the paths {shown}, not the space's {list(space)}")
    point = {path: decode_json_value(overrides[path]) for path in space}
    for path, spec in space.items():
        problem = _outside(spec, point[path])
        if problem is not None:
            raise _EntryError(f"{where} has {path} = {_shown(overrides[path])}, {problem}")
    value = decode_json_value(entry.get("value", 0.0))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _EntryError(f"{where} has value {_shown(entry['value'])}, not a number")
    try:
        value = float(value)
    except OverflowError:
        raise _EntryError(f"{where} has value {_shown(entry['value'])}, past a float") from None
    reports = _reports(entry["reports"], where) if "reports" in entry else {}
    return Trial(index, point, value, pruned=pruned, reports=reports)


def _reports(reports: Any, where: str) -> dict[int, float]:
    """A trial's `"reports"`: `[step, value]` pairs at rising steps >= 0, values numbers."""
    if not isinstance(reports, list):
        raise _EntryError(f"{where} has reports {_shown(reports)}, not a list of [step, value]")
    read: dict[int, float] = {}
    last = -1
    for pair in reports:
        value = decode_json_value(pair[1]) if isinstance(pair, list) and len(pair) == 2 else None
        step = pair[0] if value is not None else None
        if (
            not _is_int(step)
            or step < 0
            or step <= last
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise _EntryError(
                f"{where} has report {_shown(pair)}, not [step, value] with a step >= 0 past "
                "the one before and a number"
            )
        try:
            read[int(step)], last = float(value), step
        except OverflowError:
            raise _EntryError(f"{where} has report {_shown(pair)}, past a float") from None
    return read


def _malformed(path: pathlib.Path, problem: str) -> ValueError:
    return ValueError(
        f"ledger {str(path)!r} is malformed: {problem}. It was left unchanged; move it away to "
        "start the sweep over."
    )


@dataclasses.dataclass(frozen=True)
class _Contents:
    """A ledger's contents, each checked for itself (not yet against a sweep): `data` is its
    header (a version-1 ledger's whole object), `end` the bytes read (through the last whole
    line) and `lines` the whole lines among them."""

    data: dict[str, Any]
    space: Space
    direction: str
    state: _State
    version: int
    end: int = 0
    lines: int = 0


def _apply(state: _State, event: Any, where: str, space: Space) -> None:
    """Apply one event line of a version-2 ledger to `state`; `_EntryError` when it is not
    one a sweep writes at that point of the ledger."""
    if not isinstance(event, dict) or len(event) != 1 or next(iter(event)) not in _EVENTS:
        shown = sorted(event) if isinstance(event, dict) else _shown(event)
        raise _EntryError(f"{where} is {shown}, not one key of {list(_EVENTS)}")
    [(kind, body)] = event.items()
    if kind == "budget":
        if not _is_int(body) or not 1 <= body <= MOST_TRIALS:
            raise _EntryError(
                f"{where} has budget {_shown(body)}, not an integer in [1, 2**63 - 1]"
            )
        state.budget = max(state.budget or 0, body)
        return
    finished, pruned = kind in ("finished", "pruned"), kind == "pruned"
    trial = read_entry(
        body, where, space=space, budget=state.budget, finished=finished, pruned=pruned
    )
    if trial.index in state.finished:
        raise _EntryError(f"{where} has {kind} trial {trial.index}, which finished before")
    if finished:
        state.running.pop(trial.index, None)
        state.finished[trial.index] = trial
    elif trial.index in state.running:
        raise _EntryError(f"{where} has trial {trial.index} running twice")
    else:
        state.running[trial.index] = trial.overrides


def _read_events(
    path: pathlib.Path, state: _State, space: Space, data: bytes, lines: int
) -> tuple[int, int]:
    """Apply the whole lines of `data` (a version-2 ledger's bytes after its line `lines`) to
    `state`; return how many bytes and lines that was. A last line without its newline is no
    event (a writer died mid-write, or is writing it now)."""
    end = data.rfind(b"\n") + 1
    for line in data[:end].split(b"\n")[:-1]:
        lines += 1
        where = f"line {lines}"
        try:
            _apply(state, _json.loads(line, where), where, space)
        except ValueError as error:  # _EntryError included
            raise _malformed(path, str(error).rstrip(".")) from None
    return end, lines


def _checked_fields(path: pathlib.Path, data: Any, version: int) -> tuple[Space, str, int | None]:
    """The space, direction and budget of a ledger's header (a version-1 ledger's object),
    its keys and values checked."""
    missing = [key for key in _REQUIRED[version] if key not in data]
    if missing:
        raise _malformed(path, f"it has no {', '.join(map(repr, missing))}")
    unknown = sorted(set(data) - {*_REQUIRED[version], *_OPTIONAL[version]})
    if unknown:
        raise _malformed(path, f"it has unknown keys {unknown}")
    try:
        space = _space_from_json(data["space"])
    except ValueError as error:
        raise _malformed(path, str(error)) from None
    direction = data.get("direction", "minimize")
    budget = data.get("budget")
    for key, valid, allowed in [
        ("search", isinstance(data["search"], str), "a string"),
        ("config", isinstance(data["config"], dict), "a JSON object"),
        ("direction", direction in ("minimize", "maximize"), "'minimize' or 'maximize'"),
        ("budget", budget is None or (_is_int(budget) and 1 <= budget <= MOST_TRIALS), ""),
    ]:
        if not valid:
            allowed = allowed or f"an integer in [1, {MOST_TRIALS}]"
            raise _malformed(path, f"its {key} is {_shown(data[key])}, not {allowed}")
    return space, direction, budget


def _contents(path: pathlib.Path, text: bytes) -> _Contents:
    """Parse and check a ledger's text, version 2 or 1: its header's keys, version, space,
    search, configuration, direction and budget, and every entry (`read_entry`)."""
    first, newline, _ = text.partition(b"\n")
    try:
        header = _json.loads(first, "its first line")
    except ValueError:
        header = None  # a version-1 ledger as dew wrote it: "{" alone on its first line
    if not isinstance(header, dict) or header.get("version") != LEDGER_VERSION:
        return _old_contents(path, text)
    space, direction, budget = _checked_fields(path, header, LEDGER_VERSION)
    state = _State({}, {}, budget)
    start = len(first) + len(newline)
    end, lines = _read_events(path, state, space, text[start:], 1)
    return _Contents(header, space, direction, state, LEDGER_VERSION, start + end, lines)


def _old_contents(path: pathlib.Path, text: bytes) -> _Contents:
    """A version-1 ledger: one JSON object holding its `"trials"` and `"running"` lists."""
    try:
        data = _json.loads(text, "it", "JSON")
    except ValueError as error:
        raise _malformed(path, str(error).rstrip(".")) from None
    if not isinstance(data, dict):
        raise _malformed(path, f"it holds {type(data).__name__}, not a JSON object")
    if "version" not in data:
        raise _malformed(path, "it has no 'version'")
    version = data["version"]
    if version == LEDGER_VERSION:
        raise _malformed(path, "a version-2 ledger holds one JSON object a line")
    if not _is_int(version) or version != OLD_VERSION:
        raise ValueError(
            f"ledger {str(path)!r} has version {version!r}; this dew reads versions "
            f"{OLD_VERSION} and {LEDGER_VERSION}."
        )
    space, direction, budget = _checked_fields(path, data, OLD_VERSION)
    state = _State({}, {}, budget)
    for key, finished in (("trials", True), ("running", False)):
        entries = data.get(key, [])
        if not isinstance(entries, list):
            raise _malformed(path, f"its {key!r} is {type(entries).__name__}, not a list")
        for position, entry in enumerate(entries):
            try:
                trial = read_entry(
                    entry, f"{key}[{position}]", space=space, budget=budget, finished=finished
                )
            except _EntryError as error:
                raise _malformed(path, str(error)) from None
            if trial.index in (state.finished if finished else state.running):
                raise _malformed(path, f"{key!r} holds index {trial.index} twice")
            if trial.index in state.finished:
                raise _malformed(path, f"'running' holds index {trial.index}, finished in 'trials'")
            if finished:
                state.finished[trial.index] = trial
            else:
                state.running[trial.index] = trial.overrides
    return _Contents(data, space, direction, state, OLD_VERSION)


def read_ledger(path: str | os.PathLike[str]) -> _Contents:
    """A ledger read and checked for itself, as `dew runs` reads one: `ValueError` naming
    the file, the entry and the value when anything in it is not what a sweep writes. A
    sweep may be appending to it meanwhile: a last line without its newline is not read."""
    path = pathlib.Path(path)
    return _contents(path, path.read_bytes())
