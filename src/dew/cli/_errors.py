"""The `dew` command's errors: which are the user's to fix, and each as one line; and
dew's warnings, one line each."""

import contextlib
import difflib
import errno
import os
import pathlib
import select
import stat
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from dew._plugins import PLUGIN_GROUP, RegistrationImportError

_DEW = pathlib.Path(__file__).resolve().parents[1]


def _message(error: BaseException) -> str:
    """`error` as one line, its notes included but for JAX's note about the frames it left
    out of the traceback (the line shows no traceback); an OSError names its path first and,
    when a file stands where a folder should, which one."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        path = os.fsdecode(error.filename)
        text = f"{path}: {error.strerror}"
        if error.filename2 is not None:
            text = f"{path} -> {os.fsdecode(error.filename2)}: {error.strerror}"
        blocking = _file_in_the_way(path) if error.errno in (errno.ENOTDIR, errno.EEXIST) else None
        if blocking is not None:
            text += f" ({blocking} is a file, not a folder)"
    elif isinstance(error, KeyError) and error.args:
        text = str(error.args[0])
    else:
        text = str(error) or type(error).__name__
    notes = [note for note in getattr(error, "__notes__", ()) if not _about_the_traceback(note)]
    parts = [text, *notes]
    return " ".join(line.strip() for part in parts for line in part.splitlines() if line.strip())


REGISTRATION_ADVICE = (
    f"(a name you register reaches the command through --import MODULE, the run's "
    f"trainer.imports, or an installed {PLUGIN_GROUP} entry point)"
)


def advise(error: BaseException) -> None:
    """Add the command's advice to a user's error it has some for: a name no registry
    holds, and no registered name is close to (a typo's line lists the names), could be the
    user's own, registered in a module the command was not told of."""
    from dew._registry import NotRegisteredError

    if (
        isinstance(error, NotRegisteredError)
        and isinstance(error.requested, str)
        and not difflib.get_close_matches(error.requested, error.registered, n=1, cutoff=0.8)
    ):
        error.add_note(REGISTRATION_ADVICE)


def _about_the_traceback(note: str) -> bool:
    """Whether `note` is the one JAX adds to an error raised under a transformation (jit,
    eval_shape): that it removed its internal frames, and how to see them
    (`JAX_TRACEBACK_FILTERING`). The traceback it speaks of is kept for bugs alone."""
    return "JAX_TRACEBACK_FILTERING" in note


def _file_in_the_way(path: str) -> str | None:
    """The first existing component of `path` (itself included) that is not a folder."""
    candidate = pathlib.Path(path)
    for folder in [*reversed(candidate.parents), candidate]:
        if folder.exists() and not folder.is_dir():
            return str(folder)
        if not folder.exists():
            return None
    return None


def _caused_by_user(error: BaseException) -> bool:
    """Whether `error` is the user's to fix (a path, a value, a file, a missing extra)
    rather than a bug in dew, which keeps its traceback."""
    if isinstance(error, OSError | ValueError | RegistrationImportError):
        return True  # a module the user named that fails to import is theirs to fix
    if isinstance(error, KeyError):  # dew's lookups: undeclared paths, unregistered names
        return type(error).__module__.split(".")[0] == "dew"
    if isinstance(error, ImportError):  # a missing optional dependency, not a broken import
        return error.name is not None and error.name.split(".")[0] != "dew"
    return False


@contextlib.contextmanager
def one_line_warnings(command: str) -> Iterator[None]:
    """While the command runs, a warning dew raises is one line on stderr,
    `dew <command>: warning: <message>`, not the two lines (file, line, source) Python
    shows; other packages' warnings are shown as Python shows them."""
    shown = warnings.showwarning

    def show(
        message: Any, category: type[Warning], filename: str, *args: Any, **kwargs: Any
    ) -> None:
        if not pathlib.Path(filename).resolve().is_relative_to(_DEW):
            shown(message, category, filename, *args, **kwargs)
            return
        text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
        print(f"dew {command}: warning: {text}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def reader_gone() -> bool:
    """Whether standard output is a pipe whose reading end was closed (`dew runs | head`
    after its lines): a normal end of the command, not an error."""
    try:
        descriptor = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(descriptor).st_mode):
            return False
    except (AttributeError, OSError, ValueError):  # a captured or closed stream
        return False
    if not hasattr(select, "poll"):  # no poll (Windows): Python's own recipe's guess
        return True
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))


def stop_writing() -> None:
    """Point standard output at the null device, so the interpreter's last flush of what
    is buffered for a closed pipe raises nothing (Python's recipe for SIGPIPE)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
