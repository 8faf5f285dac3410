"""The summary of a scalars journal, `summary.json` beside it (decision 0046): each tag's
value at its greatest step, and how much of the journal that covers, so `dew runs` and a
reopening `LocalTracker` read only the journal's lines past it, never the whole journal."""

import contextlib
import dataclasses
import json
import os
import pathlib
import zlib
from collections.abc import Mapping
from typing import Any

from dew import _json
from dew.tracking._journal import SCALARS, SUMMARY, entries

__all__ = ["Summary", "summarize", "write_summary"]

FORMAT = 1
"""The summary's format; a summary of another format is not read (the journal is)."""

EVERY = 1000
"""A `LocalTracker` writes its summary every this many journal lines, and on closing."""


@dataclasses.dataclass
class Summary:
    """What a scalars journal's first `size` bytes (`lines` lines, the last of them `line`)
    hold: `last`, each tag's greatest step and the value last logged at it, as the journal
    writes it (non-finite values as `"NaN"`, `"+Inf"`, `"-Inf"`)."""

    size: int = 0
    lines: int = 0
    line: bytes = b""
    last: dict[str, tuple[int, Any]] = dataclasses.field(default_factory=dict)

    def add(self, step: int, values: Mapping[str, Any], line: bytes) -> None:
        """Cover one more journal line, `line`, holding `values` at `step`."""
        last = self.last
        for tag, value in values.items():
            seen = last.get(tag)
            if seen is None or step >= seen[0]:
                last[tag] = (step, value)
        self.size += len(line)
        self.lines += 1
        self.line = line

    @property
    def last_step(self) -> int:
        """The greatest step any tag has a value at; -1 when none has one."""
        return max((step for step, _ in self.last.values()), default=-1)

    def metrics(self) -> dict[str, tuple[int, float]]:
        """Each tag's greatest step and its value there, as a float."""
        return {tag: (step, float(_json.decode(value))) for tag, (step, value) in self.last.items()}

    def text(self) -> str:
        """The summary as `summary.json` holds it."""
        last = {tag: [step, value] for tag, (step, value) in self.last.items()}
        stored = {
            "format": FORMAT,
            "journal": SCALARS,
            "bytes": self.size,
            "lines": self.lines,
            "last_line": {"bytes": len(self.line), "crc32": zlib.crc32(self.line)},
            "last": last,
        }
        return json.dumps(stored, allow_nan=False) + "\n"


def _natural(value: Any) -> bool:
    return type(value) is int and value >= 0


def _value(value: Any) -> bool:
    return value in _json.NON_FINITE if isinstance(value, str) else type(value) in (int, float)


def _stored(folder: pathlib.Path, size: int) -> Summary | None:
    """The summary `summary.json` holds, when it holds for the journal as it is now: of this
    format, covering at most the journal's `size` bytes, and ending on the line the journal
    has there. `None` otherwise: a missing, unreadable or foreign summary, or a journal
    rewritten since (shorter, or another line where the summary's last line was)."""
    try:
        stored = json.loads((folder / SUMMARY).read_bytes())
        covered, lines, tail = stored["bytes"], stored["lines"], stored["last_line"]
        length, crc, last = tail["bytes"], tail["crc32"], stored["last"]
        if not (
            stored["format"] == FORMAT
            and stored["journal"] == SCALARS
            and all(_natural(number) for number in (covered, lines, length, crc))
            and length <= covered <= size
            and (covered == 0) == (length == 0)
            and isinstance(last, dict)
            and all(
                isinstance(pair, list) and len(pair) == 2 and _natural(pair[0]) and _value(pair[1])
                for pair in last.values()
            )
        ):
            return None
        with open(folder / SCALARS, "rb") as journal:
            journal.seek(covered - length)
            line = journal.read(length)
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None
    if zlib.crc32(line) != crc or (line and not line.endswith(b"\n")):
        return None
    return Summary(
        covered, lines, line, {tag: (step, value) for tag, (step, value) in last.items()}
    )


def summarize(path: str | os.PathLike[str], *, malformed: list[str] | None = None) -> Summary:
    """The summary of a `LocalTracker` folder's scalars journal as it is now: its stored
    summary when one holds (`_stored`), brought up to date by streaming only the lines past
    it; else the whole journal, streamed. Nothing is written.

    A malformed line past the summary raises `ValueError` naming it (given a `malformed`
    list, it is noted there and skipped); a torn last line is skipped with a warning.
    """
    folder = pathlib.Path(path)
    journal = folder / SCALARS
    try:
        size = journal.stat().st_size
    except FileNotFoundError:
        return Summary()
    summary = _stored(folder, size) or Summary()
    if summary.size == size:
        return summary
    for number, end, line, entry in entries(
        journal, start=summary.size, first=summary.lines + 1, malformed=malformed
    ):
        # The lines skipped before this one (blank, or malformed and noted) are covered too.
        summary.size, summary.lines = end - len(line), number - 1
        summary.add(entry["step"], entry["values"], line)
    return summary


def write_summary(folder: pathlib.Path, summary: Summary) -> None:
    """Replace `folder`'s `summary.json` with `summary`, atomically. A summary saves reading
    and nothing else: a disk that refuses it (full, read-only) leaves the old one, which
    still holds for the journal's lines it covers."""
    with contextlib.suppress(OSError):
        _json.write_atomic(folder / SUMMARY, summary.text(), durable=False)
