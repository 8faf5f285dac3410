"""A table of text the command prints: each cell on one line (control characters escaped),
columns padded to their widest cell, and, given a width, only the columns that fit it, chosen
in an order of importance (`dew runs`, decision 0033)."""

import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence

__all__ = ["Table", "output_width", "printable"]

_GAP = "  "
_CUT = "…"


def printable(text: str) -> str:
    """`text` on one line: each character Python does not print as itself (a newline, a tab,
    an escape, a zero-width space) written as its escape, so a run named `"a\\nb"` stays one
    row.

    ```python
    >>> printable("lr\\n0.1\\t\\x1b[31m")
    'lr\\\\n0.1\\\\t\\\\x1b[31m'

    ```
    """
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def output_width() -> int | None:
    """The characters a table printed to standard output may take: `COLUMNS` when set, the
    terminal's width when standard output is one, else `None` (no limit: a pipe or a file
    gets whole rows, as `ps` gives them)."""
    if os.environ.get("COLUMNS", "").strip().isdigit() or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


@dataclasses.dataclass(frozen=True)
class Table:
    """A table: `headers`, `rows` of cells (one per header), the column order of importance
    in which `lines` keeps columns to fit a width (`priority`, header indices; the first
    is always kept), and `cut`, the index of a column whose cells may be cut short with
    `…` to fit (a free-text column), or `None`."""

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    priority: Sequence[int]
    cut: int | None = None

    def lines(self, width: int | None) -> tuple[list[str], list[str]]:
        """The table's lines within `width` characters (`None`: every column), and the
        headers of the columns left out to fit it. Columns keep their order; a column is
        kept when it fits beside those of higher priority."""
        headers = [printable(header) for header in self.headers]
        rows = [[printable(cell) for cell in row] for row in self.rows]
        widths = [max(len(line[i]) for line in [headers, *rows]) for i in range(len(headers))]
        kept, room = set(), width
        for index in self.priority:
            need = widths[index] + (len(_GAP) if kept else 0)
            if room is None or need <= room or not kept:
                kept.add(index)
                room = None if room is None else room - need
            elif index == self.cut and room - len(_GAP) >= max(len(headers[index]), 8):
                widths[index] = room - len(_GAP)  # what is left, its cells cut to it
                kept.add(index)
                room = 0
        shown = [index for index in range(len(headers)) if index in kept]
        lines = [
            _GAP.join(_fitted(line[i], widths[i]) for i in shown).rstrip()
            for line in [headers, *rows]
        ]
        return lines, [self.headers[i] for i in range(len(headers)) if i not in kept]


def _fitted(cell: str, width: int) -> str:
    """`cell` padded to `width`, or cut to it with `…`."""
    return cell.ljust(width) if len(cell) <= width else cell[: width - len(_CUT)] + _CUT
