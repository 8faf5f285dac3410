"""The sweep's ledger: a JSON file of finished and running trials, guarded by POSIX record locks
on `<ledger>.lock`, and read back as strictly as it is written (`read_entry`, `read_ledger`)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import pathlib
import socket
from collections.abc import Iterator
from typing import Any

from dew import _json
from dew._files import open_descriptor
from dew._json import write_atomic
from dew.config._identity import comparable
from dew.config.sweep._search import Trial
from dew.config.sweep._space import Space, _is_int, _outside, _space_from_json, _space_json
from dew.telemetry.records import decode_json_value, encode_json_value

try:  # POSIX: the ledger's lock; without it (Windows) one process per ledger
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LEDGER_VERSION = 1
MOST_TRIALS = 2**63 - 1
"""The largest trial budget: trial `index` holds byte `index + 1` of the ledger's lock file,
and a lock's byte offset is a signed 64-bit integer."""
_HEX = frozenset("0123456789abcdef")
_REQUIRED = ("version", "space", "search", "config", "trials")
_OPTIONAL = ("direction", "budget", "running")  # older ledgers lack the first two


@dataclasses.dataclass
class _State:
    finished: dict[int, Trial]
    running: dict[int, dict[str, Any]]
    budget: int | None = None  # the largest budget a sweep of the ledger has had


class _EntryError(ValueError):
    """What is wrong with one ledger entry; the caller says where the entry came from."""


def _shown(value: Any) -> str:
    """`value` for an error line, cut short when long."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def read_entry(
    entry: Any, where: str, *, space: Space, budget: int | None, finished: bool
) -> Trial:
    """One ledger entry (`{"index", "overrides", "value"}` when `finished`, else
    `{"index", "overrides"}`, in the ledger's JSON form) as a `Trial` (a running one's
    value is 0.0), checked as strictly as a sweep writes it: an index below `budget` (the
    largest trial budget the ledger's sweeps had; `None`: `MOST_TRIALS`), a point of `space`
    at exactly its paths, and a number (or `"NaN"`, `"+Inf"`, `"-Inf"`) for its value.

    **Raises:** `ValueError` naming `where` (`"trials[3]"`), the trial and the bad value.
    """
    fields = {"index", "overrides", "value"} if finished else {"index", "overrides"}
    if not isinstance(entry, dict) or set(entry) != fields:
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
        return Trial(index, point, float(value))
    except OverflowError:
        raise _EntryError(f"{where} has value {_shown(entry['value'])}, past a float") from None


def _malformed(path: pathlib.Path, problem: str) -> ValueError:
    return ValueError(
        f"ledger {str(path)!r} is malformed: {problem}. It was left unchanged; move it away to "
        "start the sweep over."
    )


@dataclasses.dataclass(frozen=True)
class _Contents:
    """A ledger's contents, each checked for itself (not yet against a sweep)."""

    data: dict[str, Any]
    space: Space
    direction: str
    state: _State


def _contents(path: pathlib.Path, text: bytes) -> _Contents:
    """Parse and check a ledger's text: its keys, version, space, search, configuration,
    direction and budget, and every entry (`read_entry`)."""
    try:
        data = _json.loads(text, "it", "JSON")
    except ValueError as error:
        raise _malformed(path, str(error).rstrip(".")) from None
    if not isinstance(data, dict):
        raise _malformed(path, f"it holds {type(data).__name__}, not a JSON object")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise _malformed(path, f"it has no {', '.join(map(repr, missing))}")
    version = data["version"]
    if not _is_int(version) or version != LEDGER_VERSION:
        raise ValueError(
            f"ledger {str(path)!r} has version {version!r}; this dew reads version "
            f"{LEDGER_VERSION}."
        )
    unknown = sorted(set(data) - {*_REQUIRED, *_OPTIONAL})
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
    return _Contents(data, space, direction, state)


def read_ledger(path: str | os.PathLike[str]) -> _Contents:
    """A ledger read and checked for itself, as `dew runs` reads one: `ValueError` naming
    the file, the entry and the value when anything in it is not what a sweep writes."""
    path = pathlib.Path(path)
    return _contents(path, path.read_bytes())


class _Ledger:
    """The ledger file, its lock file `<ledger>.lock` and this process's trial claims.

    Byte 0 of the lock file (a POSIX record lock) guards every read-modify-write of the
    ledger; byte `index + 1` is held while trial `index` trains, so another process can tell
    a live trial from one whose process died (the kernel drops a dead process's locks).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        space: Space,
        search: str,
        config: dict[str, Any],
        direction: str = "minimize",
        trials: int = 1,
    ) -> None:
        self.path = pathlib.Path(path)
        self.owner = f"{socket.gethostname()}:{self.path.absolute()}"
        self.fields, self.space = space, _space_json(space)
        self.search, self.direction, self.trials = search, direction, trials
        self.config = json.loads(_dumps(config))  # as the ledger's JSON reads back
        self._header = (
            f'"version": {LEDGER_VERSION},\n "space": {_dumps(self.space)},\n "search": '
            f'{_dumps(search)},\n "config": {_dumps(config)},\n "direction": {_dumps(direction)}'
        )
        self.descriptor: int | None = None
        # The bytes last read or written and their state: a ledger no other process changed
        # is not parsed again, and each finished trial's line is encoded once.
        self._data: bytes | None = None
        self._state = _State({}, {})
        self._lines: dict[int, tuple[Trial, str]] = {}

    def __enter__(self) -> _Ledger:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        self.descriptor = open_descriptor(lock, os.O_RDWR | os.O_CREAT)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)  # drops this process's claims too
            self.descriptor = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover
            yield
            return
        fcntl.lockf(self.descriptor, fcntl.LOCK_EX, 1, 0)
        try:
            yield
        finally:
            fcntl.lockf(self.descriptor, fcntl.LOCK_UN, 1, 0)

    def claim(self, index: int) -> bool:
        """Hold trial `index`'s lock; False when a live process holds it."""
        if fcntl is None:  # pragma: no cover
            return True
        try:
            fcntl.lockf(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, index + 1)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def release(self, index: int) -> None:
        if fcntl is not None:
            fcntl.lockf(self.descriptor, fcntl.LOCK_UN, 1, index + 1)

    def clean(self) -> None:
        """Remove temporary files a process left when it died mid-write (under the lock)."""
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            middle = stale.name[len(self.path.name) + 2 : -len(".tmp")]
            if len(middle) == 32 and all(character in _HEX for character in middle):
                with contextlib.suppress(OSError):
                    stale.unlink()

    def load(self) -> _State:
        """Read and check the ledger (call under the lock); an absent ledger is empty."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = None
        if data != self._data:
            self._state = _State({}, {}) if data is None else self._parse(data)
            self._data = data
        state = self._state
        return _State(dict(state.finished), dict(state.running), state.budget)

    def _parse(self, data: bytes) -> _State:
        """The ledger's state: its contents checked for themselves (`_contents`), then
        against this sweep's search, direction, base configuration and space."""
        contents = _contents(self.path, data)
        stored = contents.data
        if stored["search"] != self.search:
            raise ValueError(
                f"ledger {str(self.path)!r} was written by search {stored['search']!r}, but "
                f"this sweep uses {self.search!r}; use another ledger path for another search."
            )
        if contents.direction != self.direction:
            raise ValueError(
                f"ledger {str(self.path)!r} was written by a sweep to {contents.direction!r} "
                f"its score, but this sweep would {self.direction!r} it; use another ledger path."
            )
        ours, theirs = comparable(self.config), comparable(stored["config"])
        if stored["config"] != self.config and ours != theirs:  # not where the sweep's folder is
            sections = sorted(
                section for section in {*ours, *theirs} if theirs.get(section) != ours.get(section)
            )
            raise ValueError(
                f"ledger {str(self.path)!r} was written for another base configuration (sections "
                f"that differ: {', '.join(sections)}); its trials would not be comparable. Use "
                "another ledger path for this configuration."
            )
        if list(stored["space"].items()) != list(self.space.items()):
            raise ValueError(
                f"ledger {str(self.path)!r} was written for another space: "
                f"{_space_difference(stored['space'], self.space)}. Use another ledger path "
                "for this space, or sweep the space the ledger was written for."
            )
        return contents.state

    def store(self, state: _State) -> None:
        """Write the ledger atomically (call under the lock)."""
        lines = []
        for index, trial in sorted(state.finished.items()):
            cached = self._lines.get(index)
            if cached is None or cached[0] is not trial:
                entry = {"index": index, "overrides": trial.overrides, "value": trial.value}
                cached = self._lines[index] = (trial, _dumps(entry))
            lines.append(cached[1])
        running = [
            _dumps({"index": index, "overrides": overrides})
            for index, overrides in sorted(state.running.items())
        ]
        # The largest budget of the ledger's sweeps (an older ledger's, its highest index + 1).
        taken = (*state.finished, *state.running)
        budget = max(state.budget or 0, self.trials, *(index + 1 for index in taken))
        body = (
            f'{self._header},\n "budget": {budget},\n "trials": {_lines(lines)},\n "running": '
            f"{_lines(running)}"
        )
        data = ("{\n " + body + "\n}\n").encode("utf-8")
        write_atomic(self.path, data)  # fsynced, folder included
        self._data = data
        self._state = _State(dict(state.finished), dict(state.running), budget)


def _dumps(value: Any) -> str:
    return json.dumps(encode_json_value(value), allow_nan=False)


def _lines(entries: list[str]) -> str:
    """A JSON list of encoded entries, one per line (`json.dumps(indent=...)` would not use
    the C encoder)."""
    if not entries:
        return "[]"
    return "[\n  " + ",\n  ".join(entries) + "\n ]"


def _space_difference(stored: Any, ours: dict[str, Any]) -> str:
    if not isinstance(stored, dict):
        return f"its space is {stored!r}"
    parts = []
    removed = [path for path in stored if path not in ours]
    added = [path for path in ours if path not in stored]
    if removed:
        parts.append(f"the ledger has paths {removed} this sweep does not")
    if added:
        parts.append(f"this sweep has paths {added} the ledger does not")
    for path in ours:
        if path in stored and stored[path] != ours[path]:
            parts.append(f"{path!r} is {ours[path]} here but {stored[path]} in the ledger")
    if not parts:
        parts.append(f"the paths are in another order ({list(stored)} in the ledger)")
    return "; ".join(parts)
