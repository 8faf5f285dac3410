"""`dew <command> --processes N`: N local processes of one command, for a quick
multi-process run on one machine.

Each child runs the same command line with `JAX_COORDINATOR_ADDRESS` (a free port on
127.0.0.1), `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` set, which `dew.distributed.initialize`
reads, and `LAUNCHED_ENV`, which tells it not to launch again. Process zero's output goes
to the terminal; the others' is kept and shown, each line prefixed with the process index,
only when that process fails. One failing child stops the others; Ctrl-C reaches every
child; a deadline stops a run whose process hangs. Process zero exiting with status 2 has
said why on one line (a user's error, which every process agreed on): nothing is added.

The children die with their launcher, however it ends (SIGKILL included): each holds the
read end of a pipe whose only write end the launcher holds, and `watch_launcher` (which
`dew.cli.main` starts in every launched process) kills the child's process group when the
pipe reports end of file, which the operating system does when the launcher dies. This
works wherever the launcher runs (Linux and macOS: POSIX process groups and sessions).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import IO

__all__ = ["LAUNCHED_ENV", "LAUNCHER_PIPE_ENV", "launch", "child_command", "free_port"]

LAUNCHED_ENV = "DEW_LAUNCHED_PROCESS"
"""Set in each child of `launch`: the child runs its part instead of launching, and leaves
the one Ctrl-C line to the launcher."""
LAUNCHER_PIPE_ENV = "DEW_LAUNCHER_PIPE"
"""Set in each child of `launch`: the descriptor of the pipe whose end of file says that the
launcher is gone (`watch_launcher`)."""

SETTLE_SECONDS = 2.0  # after a failure, how long the others get to fail by themselves
STRAGGLER_SECONDS = 120.0  # after one process ends well, how long the others get to end
INTERRUPT_SECONDS = 10.0  # after Ctrl-C, how long the children get to stop by themselves
SHOWN_LINES = 200  # the last lines of a failing process's output that are shown
USER_ERROR = 2  # the exit status of a user's error, which the command prints on one line


class _TerminatedError(Exception):
    """SIGTERM or SIGHUP reached the launcher: its children go with it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, frame: object) -> None:
    raise _TerminatedError(signum)


@contextlib.contextmanager
def _stopping_on_termination() -> Iterator[None]:
    """While inside (in the main thread), SIGTERM and SIGHUP raise `_TerminatedError`, so the
    children, which lead their own sessions, are stopped rather than left running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_command(argv: Sequence[str]) -> list[str]:
    """The command line of a child running `dew ARGV` with this Python."""
    return [sys.executable, "-c", "import sys; from dew.cli import main; sys.exit(main())", *argv]


def watch_launcher(environ: MutableMapping[str, str] | None = None) -> bool:
    """In a launched child: watch the launcher's pipe (`LAUNCHER_PIPE_ENV`) in a daemon
    thread, and kill this process's group (the child and anything it started) with
    SIGKILL once the launcher is gone. The variable is removed from `environ` (default:
    this process's environment), so a process this one starts does not watch it. Returns
    whether a watch started (no variable, or a descriptor that is not a pipe: none)."""
    environ = os.environ if environ is None else environ
    text = environ.pop(LAUNCHER_PIPE_ENV, "")
    if not text.isdigit():
        return False
    descriptor = int(text)
    try:
        if not stat.S_ISFIFO(os.fstat(descriptor).st_mode):
            return False
    except OSError:
        return False

    def watch() -> None:
        try:
            while os.read(descriptor, 1):  # the launcher never writes: only end of file
                pass
        except OSError:
            return  # the descriptor was closed here: nothing to watch
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="dew-launcher-watch", daemon=True).start()
    return True


def _kill(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to `process`'s whole process group (it leads its own session)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


def _reap(processes: Sequence[subprocess.Popen]) -> None:
    """Kill every process still running and wait for all of them: none outlives `launch`."""
    for process in processes:
        _kill(process)
    for process in processes:
        process.wait()


def _tail(log: IO[bytes] | None) -> list[str]:
    if log is None:
        return []
    log.seek(0)
    lines = log.read().decode("utf-8", "replace").splitlines()
    return lines[-SHOWN_LINES:]


def _show(index: int, log: IO[bytes] | None, noun: str = "process") -> None:
    lines = _tail(log)
    for line in lines:
        print(f"[{noun} {index}] {line}", file=sys.stderr)
    sys.stderr.flush()


def launch(
    command: Sequence[str],
    count: int,
    *,
    label: str = "dew",
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    straggler: float | None = STRAGGLER_SECONDS,
    distributed: bool = True,
) -> int:
    """Run `count` local processes of `command` (an argument list) as one
    `jax.distributed` run and return the exit status for the whole.

    **Arguments:**

    - `command`: each child's command line (`child_command(argv)` for `dew ARGV`).
    - `count`: the number of processes (>= 1).
    - `label`: how messages name the command (`"dew train"`).
    - `timeout`: seconds the whole run may take (`None`: no limit); past it every process
      is stopped and the status is 1.
    - `env`: the children's environment (default: this process's), to which the
      coordinator address, process count and index are added.
    - `straggler`: seconds the others get to end once one process has ended well (`None`:
      no limit).
    - `distributed`: `False` starts independent processes (`dew sweep --workers N`: each a
      sweep worker of its own) without the `JAX_*` variables, named "worker" in messages.

    **Returns:** 0 when every process exits 0; else the failing process's status (1 when a
    signal ended it or a deadline passed), after stopping every other process and printing
    one line naming the failing process and its output, and 130 after Ctrl-C. SIGTERM or
    SIGHUP to the launcher stops every child and returns 128 + the signal's number.
    """
    if count < 1:
        flag = "--processes" if distributed else "--workers"
        raise ValueError(f"{flag} must be >= 1, got {count}.")
    base = dict(os.environ if env is None else env)
    base.setdefault("JAX_PLATFORMS", "cpu")  # a local run's processes share this machine's CPU
    processes: list[subprocess.Popen] = []
    logs: list[IO[bytes] | None] = []
    started = time.monotonic()
    # The children watch the read end; the write end, which no child inherits, closes when
    # this process ends, however it ends.
    watched, alive = os.pipe()
    try:
        with _stopping_on_termination():
            try:
                _start(command, count, base, processes, logs, watched, distributed)
            finally:
                os.close(watched)
            noun = "process" if distributed else "worker"
            return _watch(processes, logs, label, started, timeout, straggler, noun)
    except KeyboardInterrupt:
        _interrupt(processes)
        print(f"{label}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except _TerminatedError as stop:
        _reap(processes)
        name = signal.Signals(stop.signum).name
        noun = "process" if distributed else "worker"
        print(f"{label}: stopped by {name}; stopped every {noun}", file=sys.stderr)
        return 128 + stop.signum
    finally:
        _reap(processes)
        os.close(alive)
        for log in logs:
            if log is not None:
                log.close()


def _start(
    command: Sequence[str],
    count: int,
    base: Mapping[str, str],
    processes: list[subprocess.Popen],
    logs: list[IO[bytes] | None],
    watched: int,
    distributed: bool = True,
) -> None:
    """Start the children (appended as they start, so any started is stopped with them),
    each holding `watched`, the read end of the launcher's pipe."""
    address = f"127.0.0.1:{free_port()}"
    for index in range(count):
        child_env = {**base, LAUNCHED_ENV: "1", LAUNCHER_PIPE_ENV: str(watched)}
        if distributed:
            child_env["JAX_COORDINATOR_ADDRESS"] = address
            child_env["JAX_NUM_PROCESSES"] = str(count)
            child_env["JAX_PROCESS_ID"] = str(index)
        else:  # independent workers: none joins a jax.distributed run
            for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
                child_env.pop(name, None)
        log = None if index == 0 else tempfile.TemporaryFile()  # noqa: SIM115 (closed by launch)
        logs.append(log)
        processes.append(
            subprocess.Popen(
                list(command),
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=None if log is None else subprocess.STDOUT,
                start_new_session=True,  # its own group: killed whole, Ctrl-C forwarded
                pass_fds=(watched,),
            )
        )


def _watch(
    processes: Sequence[subprocess.Popen],
    logs: Sequence[IO[bytes] | None],
    label: str,
    started: float,
    timeout: float | None,
    straggler: float | None,
    noun: str = "process",
) -> int:
    first_done: float | None = None
    while True:
        codes = [process.poll() for process in processes]
        failed = [index for index, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return _failed(processes, logs, label, failed[0], noun)
        if all(code == 0 for code in codes):
            return 0
        now = time.monotonic()
        if first_done is None and any(code == 0 for code in codes):
            first_done = now
        late = [index for index, code in enumerate(codes) if code is None]
        if timeout is not None and now - started > timeout:
            return _hung(
                processes,
                logs,
                label,
                late,
                f"still running after the {timeout:g} s deadline (--process-timeout)",
                noun,
            )
        if straggler is not None and first_done is not None and now - first_done > straggler:
            return _hung(
                processes,
                logs,
                label,
                late,
                f"still running {straggler:g} s after another process of the run ended",
                noun,
            )
        time.sleep(0.05)


def _failed(
    processes: Sequence[subprocess.Popen],
    logs: Sequence[IO[bytes] | None],
    label: str,
    first: int,
    noun: str = "process",
) -> int:
    """One process failed: give the others a moment to fail by themselves (an error every
    process agreed on ends them all), stop the rest, and report, unless process zero ended
    with status 2: it has printed the user's error on one line, which says it all."""
    settle = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < settle and any(process.poll() is None for process in processes):
        time.sleep(0.05)
    if processes[0].poll() == USER_ERROR:
        _reap(processes)
        return USER_ERROR
    codes = [process.poll() for process in processes]
    others = [index for index, code in enumerate(codes) if code not in (None, 0) and index != first]
    _reap(processes)
    for index in [first, *others]:
        if index != 0:  # process zero's output is already on the terminal
            _show(index, logs[index], noun)
    code = processes[first].returncode
    how = f"exit status {code}" if code > 0 else f"signal {signal.Signals(-code).name}"
    also = f" ({noun} {', '.join(map(str, others))} failed too)" if others else ""
    plural = "processes" if noun == "process" else f"{noun}s"
    print(
        f"{label}: {noun} {first} of {len(processes)} failed ({how}){also}; stopped the "
        f"other {plural}",
        file=sys.stderr,
    )
    return code if code > 0 else 1


def _hung(
    processes: Sequence[subprocess.Popen],
    logs: Sequence[IO[bytes] | None],
    label: str,
    late: Sequence[int],
    why: str,
    noun: str = "process",
) -> int:
    _reap(processes)
    for index in late:
        if index != 0:
            _show(index, logs[index], noun)
    names = ", ".join(map(str, late))
    if len(late) > 1:
        noun = "processes" if noun == "process" else f"{noun}s"
    print(f"{label}: {noun} {names} of {len(processes)} {why}; stopped them all", file=sys.stderr)
    return 1


def _interrupt(processes: Sequence[subprocess.Popen]) -> None:
    """Forward Ctrl-C to every child, give them a moment to stop (a run checkpoints and
    exits), then kill those left; a second Ctrl-C kills them at once."""
    for process in processes:
        _kill(process, signal.SIGINT)
    deadline = time.monotonic() + INTERRUPT_SECONDS
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in processes):
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    _reap(processes)
