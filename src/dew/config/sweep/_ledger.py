"""The sweep's ledger: a JSON file of finished and running trials, guarded by POSIX record locks
on `<ledger>.lock`."""

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

from dew._files import open_descriptor
from dew._json import write_atomic
from dew.config._identity import comparable
from dew.config.sweep._search import Trial
from dew.config.sweep._space import _is_int, _is_real
from dew.telemetry.records import decode_json_value, encode_json_value

try:  # POSIX: the ledger's lock; without it (Windows) one process per ledger
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LEDGER_VERSION = 1
_HEX = frozenset("0123456789abcdef")


@dataclasses.dataclass
class _State:
    finished: dict[int, Trial]
    running: dict[int, dict[str, Any]]


class _Ledger:
    """The ledger file, its lock file `<ledger>.lock` and this process's trial claims.

    Byte 0 of the lock file (a POSIX record lock) guards every read-modify-write of the
    ledger; byte `index + 1` is held while trial `index` trains, so another process can tell
    a live trial from one whose process died (the kernel drops a dead process's locks).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        space: dict[str, Any],
        search: str,
        config: dict[str, Any],
        direction: str = "minimize",
    ) -> None:
        self.path = pathlib.Path(path)
        self.owner = f"{socket.gethostname()}:{self.path.absolute()}"
        self.space, self.search, self.direction = space, search, direction
        self.config = json.loads(_dumps(config))  # as the ledger's JSON reads back
        self._header = (
            f'"version": {LEDGER_VERSION},\n "space": {_dumps(space)},\n "search": {_dumps(search)}'
            f',\n "config": {_dumps(config)},\n "direction": {_dumps(direction)}'
        )
        self.descriptor: int | None = None
        # The text last read or written and its state: a ledger no other process changed
        # is not parsed again, and each finished trial's line is encoded once.
        self._text: str | None = None
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

    def _malformed(self, problem: str) -> ValueError:
        return ValueError(
            f"ledger {str(self.path)!r} is malformed: {problem}. It was left unchanged; move "
            "it away to start the sweep over."
        )

    def load(self) -> _State:
        """Read and check the ledger (call under the lock); an absent ledger is empty."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = None
        if text != self._text:
            self._state = _State({}, {}) if text is None else self._parse(text)
            self._text = text
        return _State(dict(self._state.finished), dict(self._state.running))

    def _parse(self, text: str) -> _State:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise self._malformed(f"it is not valid JSON ({error})") from None
        if not isinstance(data, dict):
            raise self._malformed(f"it holds {type(data).__name__}, not a JSON object")
        missing = [
            key for key in ("version", "space", "search", "config", "trials") if key not in data
        ]
        if missing:
            raise self._malformed(f"it has no {', '.join(map(repr, missing))}")
        if data["version"] != LEDGER_VERSION:
            raise ValueError(
                f"ledger {str(self.path)!r} has version {data['version']!r}; this dew reads "
                f"version {LEDGER_VERSION}."
            )
        if data["search"] != self.search:
            raise ValueError(
                f"ledger {str(self.path)!r} was written by search {data['search']!r}, but this "
                f"sweep uses {self.search!r}; use another ledger path for another search."
            )
        if data.get("direction", self.direction) != self.direction:  # older ledgers lack it
            raise ValueError(
                f"ledger {str(self.path)!r} was written by a sweep to {data['direction']!r} its "
                f"score, but this sweep would {self.direction!r} it; use another ledger path."
            )
        stored = data["config"] if isinstance(data["config"], dict) else {}
        ours, theirs = comparable(self.config), comparable(stored)
        if data["config"] != self.config and ours != theirs:  # not where the sweep's folder is
            sections = sorted(
                section for section in {*ours, *theirs} if theirs.get(section) != ours.get(section)
            )
            raise ValueError(
                f"ledger {str(self.path)!r} was written for another base configuration (sections "
                f"that differ: {', '.join(sections)}); its trials would not be comparable. Use "
                "another ledger path for this configuration."
            )
        if not isinstance(data["space"], dict) or list(data["space"].items()) != list(
            self.space.items()
        ):
            raise ValueError(
                f"ledger {str(self.path)!r} was written for another space: "
                f"{_space_difference(data['space'], self.space)}. Use another ledger path "
                "for this space, or sweep the space the ledger was written for."
            )
        return _State(
            self._entries(data["trials"], "trials", finished=True),
            {
                index: entry.overrides
                for index, entry in self._entries(
                    data.get("running", []), "running", finished=False
                ).items()
            },
        )

    def _entries(self, entries: Any, key: str, *, finished: bool) -> dict[int, Trial]:
        if not isinstance(entries, list):
            raise self._malformed(f"{key!r} is not a list")
        fields = {"index", "overrides", "value"} if finished else {"index", "overrides"}
        read: dict[int, Trial] = {}
        for position, entry in enumerate(entries):
            where = f"{key}[{position}]"
            if not isinstance(entry, dict) or set(entry) != fields:
                raise self._malformed(f"{where} is {entry!r}; it needs exactly {sorted(fields)}")
            index, overrides = entry["index"], entry["overrides"]
            if not _is_int(index) or index < 0:
                raise self._malformed(f"{where} has index {index!r}")
            if index in read:
                raise self._malformed(f"{key!r} holds index {index} twice")
            if not isinstance(overrides, dict) or set(overrides) != set(self.space):
                raise self._malformed(f"{where} has overrides {overrides!r} for other paths")
            overrides = {path: overrides[path] for path in self.space}
            value = decode_json_value(entry.get("value", 0.0))
            if not _is_real(value):
                raise self._malformed(f"{where} has value {entry['value']!r}")
            read[index] = Trial(index, decode_json_value(overrides), float(value))
        return read

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
        body = f'{self._header},\n "trials": {_lines(lines)},\n "running": {_lines(running)}'
        text = "{\n " + body + "\n}\n"
        write_atomic(self.path, text)  # fsynced, folder included
        self._text = text
        self._state = _State(dict(state.finished), dict(state.running))


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
