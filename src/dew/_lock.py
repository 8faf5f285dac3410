"""An exclusive lock on a folder that the operating system releases when its holder dies.

`folder_lock(folder)` holds `flock(LOCK_EX)` on `<folder>/run.lock` for as long as its block
runs, and writes the holder's process ID into that file once it holds it; a second holder is
refused at once (it never waits) with `FolderLockedError`, which names the folder and the PID
that holds it. A process that dies, SIGKILL included, loses its lock with its open files, so a
killed run never blocks the next one. The lock file stays in the folder: removing it would let
two processes lock two different files of one name.

`flock` works on Linux and macOS (and on NFS through Linux's emulation with record locks). A
lock belongs to the open file, not the process: the same process locking the same folder twice
is refused like any other. On Windows, which has no `fcntl`, the folder is not locked: two runs
on one folder there are the user's to avoid.
"""

import contextlib
import errno
import os
import pathlib
from collections.abc import Iterator

from dew._files import open_descriptor
from dew._run_folder import LOCK_FILE

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "FolderLockedError", "check_unlocked", "folder_lock"]


class FolderLockedError(BlockingIOError):
    """The folder is locked by another live process (or another open of the lock in this
    one): `pid` is the holder's process ID (`None` when it had not written it yet)."""

    def __init__(self, folder: str | os.PathLike[str], pid: int | None, what: str) -> None:
        holder = "another process" if pid is None else f"process {pid}"
        if pid == os.getpid():
            holder += " (this process)"
        super().__init__(
            errno.EWOULDBLOCK,
            f"the {what} is in use by {holder}, which holds its lock {LOCK_FILE}; wait for "
            "that run to end (or stop it), or train under another trainer.name",
            os.fspath(folder),
        )
        self.pid = pid


def _holder(descriptor: int) -> int | None:
    text = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _try_lock(descriptor: int, folder: pathlib.Path, what: str) -> None:
    if fcntl is None:  # pragma: no cover - Windows (the callers return before this)
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FolderLockedError(folder, _holder(descriptor), what) from None
        raise


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], *, what: str = "run folder") -> Iterator[None]:
    """Hold `folder`'s lock (the folder must exist) for the block, with this process's ID
    written in the lock file; released when the block ends or the process dies.

    **Arguments:**

    - `what`: how the refusal names the folder (`"run folder"`).

    **Raises:** `FolderLockedError` (an `OSError`) naming the folder and the holder's PID
    when another holder has it; `OSError` when the lock file is a symbolic link.
    """
    folder = pathlib.Path(folder)
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    descriptor = open_descriptor(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        _try_lock(descriptor, folder, what)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        try:
            yield
        finally:
            os.ftruncate(descriptor, 0)  # no stale PID for a reader of the file
    finally:
        os.close(descriptor)  # releases the lock


def check_unlocked(folder: str | os.PathLike[str], *, what: str = "run folder") -> None:
    """Raise `FolderLockedError` when another holder has `folder`'s lock now (a check before
    starting the processes that would take it; nothing is created)."""
    folder = pathlib.Path(folder)
    if fcntl is None:  # pragma: no cover - Windows
        return
    try:
        descriptor = open_descriptor(folder / LOCK_FILE, os.O_RDWR)  # NFS locks need write
    except FileNotFoundError:
        return  # no lock file (or no folder): nobody holds it
    try:
        _try_lock(descriptor, folder, what)
    finally:
        os.close(descriptor)
