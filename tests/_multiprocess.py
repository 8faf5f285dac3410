"""Launch real `jax.distributed` processes from a test: N local CPU processes of one worker
script on a free port, with a deadline that kills them all, so a dead peer or a hang fails
the test instead of hanging CI.

A worker script is run as `python WORKER RANK COUNT PORT OUT_DIR [ARGS...]`; it calls
`start()` (below, importable from the worker as `_multiprocess.start`) to initialize
`jax.distributed`, runs its scenarios, and writes what the test checks under `OUT_DIR`
(one file per rank). Batch scenarios into one launch: each costs ~2 s of imports and
start-up per process.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import pytest

TESTS = pathlib.Path(__file__).parent
SRC = TESTS.parent / "src"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


WATCHDOG = "DEW_TEST_WATCHDOG_SECONDS"
"""The variable that tells a worker how long it may run before it dumps its threads and exits."""


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: CPU only, one device a process, dew importable."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    # No device-count flag (one device a process), but the test run's compilation flags
    # (tests/conftest.py: LLVM optimisation level 0) stay: the workers compile as much as
    # the test process does, and at the default level each compiles several times slower.
    flags = [flag for flag in env.pop("XLA_FLAGS", "").split() if "device_count" not in flag]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(name, None)
    paths = [str(TESTS), str(SRC), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    env.update(extra or {})
    return env


def devices_env(count: int) -> dict[str, str]:
    """The environment of one CPU process with `count` devices
    (`--xla_force_host_platform_device_count`), the test run's other XLA flags kept and dew
    and the tests' helpers importable."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    flags = [flag for flag in env.get("XLA_FLAGS", "").split() if "device_count" not in flag]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
    env.pop("JAX_NUM_CPU_DEVICES", None)
    paths = [str(TESTS), str(SRC), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


def run_on_devices(worker: str, count: int, out: pathlib.Path, *, timeout: float = 600) -> Any:
    """Run `python TESTS/WORKER OUT` in one CPU process with `count` devices (`devices_env`),
    fail with its output when it fails, and return the JSON it wrote to `out`."""
    done = subprocess.run(
        [sys.executable, str(TESTS / worker), str(out)],
        env=devices_env(count),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def launch(
    worker: str | os.PathLike[str],
    count: int,
    out: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
    expect_success: bool = True,
) -> list[tuple[int, str]]:
    """Run `count` processes of `worker`; return each one's (exit code, output).

    Every process is killed (its whole process group) when the deadline passes or the
    test ends, and a deadline passed fails the test with every process's output so far.
    With `expect_success`, a process that exits non-zero fails the test with the outputs.
    """
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, os.fspath(worker)]
    processes = [
        subprocess.Popen(
            [*command, str(rank), str(count), str(port), os.fspath(out), *args],
            # A worker's own watchdog (a hang shows where) fires just before this deadline.
            env=worker_env({WATCHDOG: str(max(timeout - 10, 1)), **(env or {})}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in range(count)
    ]
    outputs = [""] * count
    deadline = time.monotonic() + timeout
    try:
        for rank, process in enumerate(processes):
            remaining = max(deadline - time.monotonic(), 0.1)
            try:
                outputs[rank] = process.communicate(timeout=remaining)[0]
            except subprocess.TimeoutExpired:
                for other in processes:
                    _kill(other)
                for index, other in enumerate(processes):
                    rest = other.stdout.read() if other.stdout else ""
                    outputs[index] = outputs[index] or rest
                shown = "\n".join(f"--- process {i}\n{text}" for i, text in enumerate(outputs))
                pytest.fail(f"{count} processes of {worker} passed {timeout:.0f} s:\n{shown}")
    finally:
        for process in processes:
            _kill(process)
    results = [(process.returncode, text) for process, text in zip(processes, outputs, strict=True)]
    if expect_success and any(code != 0 for code, _ in results):
        shown = "\n".join(f"--- process {i} (exit {c})\n{t}" for i, (c, t) in enumerate(results))
        pytest.fail(f"a process of {worker} failed:\n{shown}")
    return results


def start() -> tuple[int, int, pathlib.Path, list[str]]:
    """In a worker: read `RANK COUNT PORT OUT_DIR [ARGS...]`, initialize `jax.distributed`
    (gloo collectives, a 60 s initialization timeout), return (rank, count, out, args)."""
    rank, count, port = (int(value) for value in sys.argv[1:4])
    out = pathlib.Path(sys.argv[4])
    from dew.distributed import initialize

    initialize(f"127.0.0.1:{port}", count, rank, initialization_timeout=60)
    return rank, count, out, sys.argv[5:]
