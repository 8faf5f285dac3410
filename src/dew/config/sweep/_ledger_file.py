"""The sweep's ledger file as a sweep uses it: its lock file `<ledger>.lock`, this process's
trial claims, the state read so far, and the events appended to it (decision 0045; the format
and its reading are `_ledger`'s)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import socket
import warnings
from collections.abc import Iterator
from typing import Any

from dew._files import append_line, open_descriptor
from dew._json import write_atomic
from dew.config._identity import comparable
from dew.config.sweep._ledger import (
    LEDGER_VERSION,
    _apply,
    _Contents,
    _contents,
    _EntryError,
    _malformed,
    _read_events,
    _State,
)
from dew.config.sweep._search import Trial
from dew.config.sweep._space import Space, _space_json
from dew.telemetry.records import encode_json_value

try:  # POSIX: the ledger's lock; without it (Windows) one process per ledger
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

_HEX = frozenset("0123456789abcdef")


def _read_range(descriptor: int, start: int, stop: int) -> bytes:
    os.lseek(descriptor, start, os.SEEK_SET)
    chunks = []
    while start < stop:
        chunk = os.read(descriptor, stop - start)
        if not chunk:
            break
        chunks.append(chunk)
        start += len(chunk)
    return b"".join(chunks)


_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation
_sync = getattr(os, "fdatasync", os.fsync)  # an append needs the data and the file's size


def _opened(descriptor: int | None) -> int:
    """`descriptor`, which the ledger opens (its lock file in `__enter__`, the ledger file in
    `load`) before any use of it."""
    if descriptor is None:
        raise RuntimeError("the sweep ledger was used outside its `with` block or before load().")
    return descriptor


class _Ledger:
    """The ledger file, its lock file `<ledger>.lock` and this process's trial claims.

    Byte 0 of the lock file (a POSIX record lock) guards every read and append of the
    ledger; byte `index + 1` is held while trial `index` trains, so another process can tell
    a live trial from one whose process died (the kernel drops a dead process's locks).
    The state read is kept: each `load` reads only the lines appended since the last one,
    unless the file was replaced (a version-1 ledger converted) or cut.
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
        self.descriptor: int | None = None  # the lock file's
        self._reader: int | None = None  # the ledger file read (`_identity`) and appended to
        self._writer: int | None = None
        self._identity: tuple[int, int] | None = None
        self._version, self._end, self._lines, self._torn = LEDGER_VERSION, 0, 0, 0
        self._state = _State({}, {})

    def __enter__(self) -> _Ledger:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        self.descriptor = open_descriptor(lock, os.O_RDWR | os.O_CREAT)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._forget()
        if self.descriptor is not None:
            os.close(self.descriptor)  # drops this process's claims too
            self.descriptor = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover
            yield
            return
        fcntl.lockf(_opened(self.descriptor), fcntl.LOCK_EX, 1, 0)
        try:
            yield
        finally:
            fcntl.lockf(_opened(self.descriptor), fcntl.LOCK_UN, 1, 0)

    def claim(self, index: int) -> bool:
        """Hold trial `index`'s lock; False when a live process holds it."""
        if fcntl is None:  # pragma: no cover
            return True
        try:
            fcntl.lockf(_opened(self.descriptor), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, index + 1)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def release(self, index: int) -> None:
        if fcntl is not None:
            fcntl.lockf(_opened(self.descriptor), fcntl.LOCK_UN, 1, index + 1)

    def clean(self) -> None:
        """Remove temporary files a process left when it died mid-write (under the lock)."""
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            middle = stale.name[len(self.path.name) + 2 : -len(".tmp")]
            if len(middle) == 32 and all(character in _HEX for character in middle):
                with contextlib.suppress(OSError):
                    stale.unlink()

    def _forget(self) -> None:
        for descriptor in (self._reader, self._writer):
            if descriptor is not None:
                os.close(descriptor)
        self._reader = self._writer = self._identity = None
        self._version, self._end, self._lines, self._torn = LEDGER_VERSION, 0, 0, 0
        self._state = _State({}, {})

    def load(self) -> _State:
        """Bring the ledger's state up to date (call under the lock) and return it: the
        state itself, which callers read and never change. An absent ledger is empty."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            self._forget()
            return self._state
        identity = (status.st_dev, status.st_ino)
        if identity != self._identity or status.st_size < self._end:
            self._forget()
            # Appended to in place: a symbolic link is refused (`dew._files`), not written through.
            self._reader = open_descriptor(self.path, os.O_RDONLY | _BINARY)
            self._writer = open_descriptor(self.path, os.O_WRONLY | os.O_APPEND | _BINARY)
            data = _read_range(self._reader, 0, os.fstat(self._reader).st_size)
            contents = self._parse(data)
            self._identity = identity
            self._state, self._version = contents.state, contents.version
            self._end, self._lines, size = contents.end, contents.lines, len(data)
        else:
            size = status.st_size
            if size > self._end and self._version == LEDGER_VERSION:
                data = _read_range(_opened(self._reader), self._end, size)
                end, self._lines = _read_events(
                    self.path, self._state, self.fields, data, self._lines
                )
                self._end += end
        self._torn = size - self._end if self._version == LEDGER_VERSION else 0
        return self._state

    def _parse(self, data: bytes) -> _Contents:
        """The ledger's contents checked for themselves (`_contents`), then against this
        sweep's search, direction, base configuration and space."""
        contents = _contents(self.path, data)
        stored = contents.data
        self._stored_config = stored["config"]  # a converted ledger keeps what it was written for
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
        return contents

    def begin(self) -> None:
        """Make the loaded ledger ready for this sweep's events (call under the lock, after
        `load`): create it when absent, convert a version-1 ledger to version 2 (whole, as
        `write_atomic` replaces a file), and record this sweep's budget when it is larger."""
        state = self._state
        if self._identity is not None and self._version == LEDGER_VERSION:
            if self.trials > (state.budget or 0):
                self._record({"budget": self.trials})
            return
        # The largest budget of the ledger's sweeps (an older ledger's, its highest index + 1).
        taken = (*state.finished, *state.running)
        budget = max(state.budget or 0, self.trials, *(index + 1 for index in taken))
        header = {"version": LEDGER_VERSION, "space": self.space, "search": self.search}
        config = getattr(self, "_stored_config", None) or self.config
        header.update(config=config, direction=self.direction, budget=budget)
        lines = [_dumps(header)]
        for _, trial in sorted(state.finished.items()):
            lines.append(_dumps(_finished_event(trial)))
        for index, overrides in sorted(state.running.items()):
            lines.append(_dumps({"running": {"index": index, "overrides": overrides}}))
        write_atomic(self.path, "".join(line + "\n" for line in lines))  # fsynced, folder too
        self.load()

    def start(self, index: int, point: dict[str, Any]) -> None:
        """Record trial `index` as running at `point` (under the lock, after `load`)."""
        self._record({"running": {"index": index, "overrides": point}})

    def finish(self, trial: Trial) -> None:
        """Record `trial` as finished, or as pruned (under the lock, after `load`)."""
        self._record(_finished_event(trial))

    def _record(self, event: dict[str, Any]) -> None:
        """Append `event` as one line, fsynced, and apply it to the state as `load` would
        read it back."""
        writer = _opened(self._writer)
        if self._torn:  # no process holds the lock mid-write: this one's writer died
            os.ftruncate(writer, self._end)
            warnings.warn(
                f"ledger {str(self.path)!r} ended in a torn line (a process died mid-write?); "
                f"cut it back to its last whole line ({self._torn} bytes dropped).",
                stacklevel=4,
            )
            self._torn = 0
        line = _dumps(event)
        append_line(writer, self.path, line + "\n")
        try:
            _sync(writer)
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(self.path)) from error
        self._end += len(line.encode("utf-8")) + 1
        self._lines += 1
        where = f"line {self._lines}"
        try:
            _apply(self._state, json.loads(line), where, self.fields)
        except _EntryError as error:
            raise _malformed(self.path, str(error)) from None


def _finished_event(trial: Trial) -> dict[str, Any]:
    """`{"finished": ...}`, or `{"pruned": ...}` for a trial its pruner stopped; with its
    reports as `[step, value]` pairs when it reported any (decision 0055)."""
    entry: dict[str, Any] = {
        "index": trial.index,
        "overrides": trial.overrides,
        "value": trial.value,
    }
    if trial.reports or trial.pruned:
        entry["reports"] = [[step, value] for step, value in sorted(trial.reports.items())]
    return {"pruned" if trial.pruned else "finished": entry}


def _dumps(value: Any) -> str:
    return json.dumps(encode_json_value(value), allow_nan=False)


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
