"""orbax-checkpoint as dew uses it: imported on demand, its failures told once by dew.

orbax writes a checkpoint in background threads and raises a failed save's error again
from the caller's next `save`, `wait_until_finished` or `close`; on its way it logs the
same failure with its traceback through absl, once per thread it crossed (hundreds of
lines on a full disk), and TensorStore's callbacks into orbax's closed event loops print
`RuntimeError: Event loop is closed` tracebacks as unraisable exceptions. dew raises each
failure once, as one error, so `quiet_orbax` keeps out of the console:

- orbax's log records that carry a traceback (`logging.exception`: a failure orbax
  raises again to its caller) or a `KeyboardInterrupt` (Ctrl-C in orbax's wait);
- every orbax record while dew reads a checkpoint directory that may hold damaged steps
  (`reading`: listing its steps, restoring one): a damaged step is dew's to report;
- asyncio's "exception was never retrieved" for a future of orbax's or TensorStore's,
  and the unraisable `Event loop is closed` errors.

Anything else orbax logs (its warnings about a run) is left as it is.
"""

import contextlib
import errno
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from types import TracebackType
from typing import Any

__all__ = ["disk_error", "orbax", "quiet_orbax", "reading", "transient"]

_ORBAX_FOLDER = os.sep + os.path.join("orbax", "checkpoint") + os.sep
_TENSORSTORE = "[tensorstore_spec="  # how every TensorStore error message ends


def orbax() -> Any:
    """`orbax.checkpoint`, imported on first use."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import orbax.checkpoint as ocp
    except ImportError as error:  # pragma: no cover - a core dependency
        raise ImportError(
            "checkpoints need orbax-checkpoint, a dependency of dew-ml that is missing: "
            'pip install "orbax-checkpoint>=0.12.8" (or reinstall dew-ml).'
        ) from error
    return ocp


def _through_orbax(traceback: TracebackType | None) -> bool:
    while traceback is not None:
        if _ORBAX_FOLDER in traceback.tb_frame.f_code.co_filename:
            return True
        traceback = traceback.tb_next
    return False


class _Reads:
    """How many reads of a checkpoint directory are in progress (any thread may log for
    one)."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()


_READS = _Reads()


def _orbax_record_shown(record: logging.LogRecord) -> bool:
    """Whether an absl record reaches the console (see the module's docstring)."""
    if _ORBAX_FOLDER not in record.pathname:
        return True
    if _READS.count:
        return False
    return not record.exc_info


def _asyncio_record_shown(record: logging.LogRecord) -> bool:
    """Whether an asyncio record reaches the console: not while dew reads checkpoints,
    nor a lost exception of orbax's or TensorStore's (which orbax raised once already)."""
    if _READS.count:
        return False
    exc_info = record.exc_info
    if not exc_info or exc_info[1] is None:
        return True
    return not (_through_orbax(exc_info[2]) or _TENSORSTORE in str(exc_info[1]))


def _loop_closed(unraisable: Any) -> bool:
    value = unraisable.exc_value
    return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"


class _Quiet:
    installed = False
    lock = threading.Lock()


def quiet_orbax() -> None:
    """Install the filters the module's docstring describes, once per process."""
    with _Quiet.lock:
        if _Quiet.installed:
            return
        _Quiet.installed = True
    logging.getLogger("absl").addFilter(_orbax_record_shown)
    logging.getLogger("asyncio").addFilter(_asyncio_record_shown)
    previous = sys.unraisablehook

    def unraisable(report: Any) -> None:
        if not _loop_closed(report):
            previous(report)

    sys.unraisablehook = unraisable


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """While dew reads a checkpoint directory, orbax's log records are dropped: dew
    reports a damaged step itself, and a step that restores needs no commentary."""
    with _READS.lock:
        _READS.count += 1
    try:
        yield
    finally:
        with _READS.lock:
            _READS.count -= 1


_OS_ERROR_CODE = re.compile(r"\[os_error_code='(\d+)'\]")
_STATUS = re.compile(r"^([A-Z_]+): ")
_TRANSIENT = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "PERMISSION_DENIED"}


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def disk_error(error: BaseException, path: str) -> OSError | None:
    """The operating system's error behind an orbax or TensorStore failure (a full or
    read-only disk, a missing permission) as an `OSError` naming `path`; `None` when the
    failure is not the operating system's."""
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno is not None:
            return OSError(link.errno, link.strerror or os.strerror(link.errno), path)
        found = _OS_ERROR_CODE.search(str(link))
        if found is not None:
            code = int(found.group(1))
            return OSError(code, os.strerror(code), path)
    return None


def transient(error: BaseException) -> bool:
    """Whether a TensorStore failure says the store could not be reached or read now (a
    network, credential or permission failure) rather than that the files are damaged."""
    status = _STATUS.match(str(error))
    if status is not None and status.group(1) in _TRANSIENT:
        return True
    code = disk_error(error, "")
    return code is not None and code.errno in (errno.EACCES, errno.EPERM, errno.EIO)
