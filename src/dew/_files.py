"""Opening the files dew writes in place (journals, plots, lock files) without following a
final symbolic link, and appending a line to one whole or not at all. Below the core: imports
no dew module.

A link where dew writes (a dangling `scalars.jsonl -> /elsewhere/x`) would otherwise make dew
create or append to a file outside the folder it writes in. `open_for_writing` opens the path
itself with `O_NOFOLLOW`, so a final link is refused with one `OSError` naming it and where it
points, and nothing is created. Folders above the file may be links (a run folder kept on
another disk is the user's choice). Files replaced atomically (`dew._json.write_atomic`) need
no such care: their temporary file is created with `O_EXCL`, which never follows a link, and
`os.replace` replaces a link at the destination rather than writing through it.
"""

import contextlib
import errno
import os
from typing import IO, Any

__all__ = ["append_line", "open_descriptor", "open_for_writing"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # POSIX; Windows has none: see `open_descriptor`
_FLAGS = {
    "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    "w": os.O_WRONLY | os.O_TRUNC | os.O_CREAT,
    "r+": os.O_RDWR,
}


def _refusal(path: str | os.PathLike[str]) -> OSError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return OSError(
        errno.ELOOP,
        f"is a symbolic link{target}, and dew never writes through a link; remove the link "
        "(nothing was written through it)",
        os.fspath(path),
    )


def open_descriptor(path: str | os.PathLike[str], flags: int, mode: int = 0o666) -> int:
    """`os.open(path, flags | O_NOFOLLOW, mode)`: a final symbolic link at `path` raises
    `OSError` (`ELOOP`) naming it and its target, and nothing is created. Where the
    platform has no `O_NOFOLLOW` (Windows), a link found just before opening is refused."""
    if not _NOFOLLOW and os.path.islink(path):
        raise _refusal(path)
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as error:
        # Linux and macOS say ELOOP; FreeBSD says EMLINK.
        if error.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise _refusal(path) from None
        raise


def open_for_writing(
    path: str | os.PathLike[str], mode: str = "a", *, encoding: str | None = None
) -> IO[Any]:
    """`open(path, mode)` for writing, never through a final symbolic link.

    **Arguments:**

    - `mode`: `"a"` (append, created when absent), `"w"` (truncate, created when absent)
      or `"r+"` (read and write an existing file), each with `"b"` for binary.
    - `encoding`: the text encoding (text modes only).

    **Raises:** `OSError` (`ELOOP`) naming `path` and its target when `path` is a symbolic
    link, dangling or not; nothing is created then.
    """
    kind = mode.replace("b", "")
    if kind not in _FLAGS:
        raise ValueError(f"open_for_writing takes mode 'a', 'w' or 'r+' (with 'b'), got {mode!r}.")
    descriptor = open_descriptor(path, _FLAGS[kind])
    try:
        return os.fdopen(descriptor, mode, encoding=encoding)
    except BaseException:
        os.close(descriptor)
        raise


def append_line(journal: Any, path: str | os.PathLike[str], line: str) -> bytes:
    """Append `line` (its newline included) to `journal` (an open file, or a descriptor,
    opened for appending) at `path`: whole, or not at all. A write that fails part-way (a
    full disk) is cut back, so the lines before it stay the file's last; the `OSError` names
    `path`. The bytes go to the file descriptor at once, past a file object's buffer, which
    would otherwise write a failed line's rest on a later flush. The journals of a
    `LocalTracker` folder and a sweep's ledger append through it. Returns the bytes
    appended."""
    data = line.encode("utf-8")
    descriptor = journal if isinstance(journal, int) else journal.fileno()
    written = 0
    try:
        while written < len(data):
            written += os.write(descriptor, data[written:])
    except OSError as error:
        if written:  # appended at the end: the journal was `written` bytes shorter
            with contextlib.suppress(OSError):
                os.ftruncate(descriptor, os.fstat(descriptor).st_size - written)
        raise OSError(error.errno, error.strerror, str(path)) from error
    return data
