"""A cache folder that is whole or absent: built under a temporary name, fsynced, renamed.

The data caches (`dew.data.text`'s tokens, `dew.data.image_folder`'s decoded images) are
folders `<kind>-<key>` under a cache folder. `cached_folder` reads one where a whole one with
the key exists, else builds it: the builder writes a temporary folder beside it
(`.<kind>-<key>.building-<host>-<pid>-<random>`), the files and the folder are fsynced, and
the folder is renamed into place, so a build that dies midway (an exception, Ctrl-C, a kill)
leaves no folder that is read. A killed build's temporary folder is removed by the next build
of the same key on the same machine once its process is gone. Two processes building the same
key (the processes of one run) both write; the second rename fails against the first's folder,
which both read.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import uuid
from collections.abc import Callable
from typing import TypeVar

from dew._cache_dir import default_cache_dir

__all__ = ["cached_folder", "default_cache_dir", "fsync"]

_T = TypeVar("_T")


def fsync(path: pathlib.Path) -> None:
    """Flush a file's or a folder's contents to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(cache_dir: pathlib.Path, name: str, host: str) -> None:
    """Remove the temporary folders of builds of `name` on this machine whose process died."""
    for leftover in cache_dir.glob(f".{name}.building-{host}-*"):
        pid = leftover.name.removeprefix(f".{name}.building-{host}-").split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def cached_folder(
    owner: str,
    cache_dir: pathlib.Path,
    name: str,
    *,
    load: Callable[[pathlib.Path], _T | None],
    write: Callable[[pathlib.Path], None],
    what: str,
) -> tuple[_T, bool]:
    """`(load(cache_dir / name), built)`: the folder read where `load` finds it whole, else
    built by `write(temporary folder)` (which writes and fsyncs its files), renamed into
    place and read (`built` is `True`). `load` returns `None` for a folder that is absent or
    not whole (a damaged one is replaced). `what` names the cache in errors."""
    final = cache_dir / name
    if final.is_dir() and (found := load(final)) is not None:
        return found, False
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OSError(
            f"{owner}: cannot create the {what} folder {os.fspath(cache_dir)!r} "
            f"({error.strerror or error}); pass cache_dir= naming a writable folder."
        ) from None
    host = socket.gethostname().replace("-", "_")
    _sweep(cache_dir, name, host)
    building = cache_dir / f".{name}.building-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    building.mkdir()
    try:
        write(building)
        fsync(building)
        # Another process may have finished the same cache meanwhile: theirs is read, ours
        # removed. A folder there that does not read back whole is damaged: replaced.
        if final.exists() and load(final) is None:
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(building, final)
        except OSError:
            if not final.is_dir():
                raise
        fsync(cache_dir)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    found = load(final)
    if found is None:
        raise OSError(f"{owner}: the {what} at {os.fspath(final)!r} did not read back.")
    return found, True
