"""Joining a multi-process run: the `--processes` and cluster flags' checks, the settings the
flags and `JAX_*` variables ask for, and `dew.distributed.initialize` with them."""

import argparse
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from dew.cli._errors import _message

_JAX_GRACE_SECONDS = 5
"""How much longer than `--initialization-timeout` JAX's own deadline is: dew's comes first."""
_CLUSTER_FLAGS = ("coordinator_address", "num_processes", "process_id", "distributed")
_CLUSTER_ENV = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_processes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad `--processes`, `--process-timeout`, `--initialization-timeout` and cluster
    flag values (exit 2)."""
    if args.processes is not None:
        if args.processes < 1:
            parser.error(f"--processes must be >= 1, got {args.processes}")
        given = [_flag(name) for name in _CLUSTER_FLAGS if getattr(args, name) not in (None, False)]
        if given:
            parser.error(
                f"--processes starts local processes; it does not combine with {', '.join(given)}"
                " (a cluster's processes each run the command with those instead)"
            )
    if not args.process_timeout > 0:  # NaN too
        parser.error(f"--process-timeout must be > 0 seconds, got {args.process_timeout}")
    if args.initialization_timeout < 1:
        parser.error(
            f"--initialization-timeout must be >= 1 second, got {args.initialization_timeout}"
        )
    if args.num_processes is not None and args.num_processes < 1:
        parser.error(f"--num-processes must be >= 1, got {args.num_processes}")
    if args.process_id is not None and args.process_id < 0:
        parser.error(f"--process-id must be >= 0, got {args.process_id}")
    if args.coordinator_address is not None:
        problem = _address_problem(args.coordinator_address)
        if problem:
            parser.error(f"--coordinator-address {problem}")


def _address_problem(text: str) -> str | None:
    """What is wrong with `text` as a coordinator's HOST:PORT, or None."""
    host, separator, port = text.rpartition(":")
    if not separator or not host or host in ("[", "[]") or not port.isdigit():
        return f"must be HOST:PORT (e.g. 10.0.0.1:1234), got {text!r}"
    if not 0 < int(port) < 65536:
        return f"has port {port}; a port is 1 to 65535 (got {text!r})"
    return None


def cluster_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The arguments of `dew.distributed.initialize` the flags and environment ask for, or
    `None` when this is a one-process run: the cluster flags win over the
    `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` variables, and
    `--distributed` with nothing else leaves everything to JAX's cluster detection.

    **Raises:** `ValueError` naming the flag or variable when a value is malformed, an index
    is out of range, or a count or index is missing without `--distributed`.
    """
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, variable in _CLUSTER_ENV.items():
        value = getattr(args, name, None)
        if value is not None:
            settings[name], sources[name] = value, _flag(name)
            continue
        text = environ.get(variable, "").strip()
        if not text:
            continue
        sources[name] = variable
        if name == "coordinator_address":
            problem = _address_problem(text)
            if problem:
                raise ValueError(f"{variable} {problem}.")
            settings[name] = text
        else:
            try:
                settings[name] = int(text)
            except ValueError:
                raise ValueError(f"{variable} must be a whole number, got {text!r}.") from None
    detect = bool(getattr(args, "distributed", False))
    if not settings and not detect:
        return None
    count, index = settings.get("num_processes"), settings.get("process_id")
    if count is not None and count < 1:
        raise ValueError(f"{sources['num_processes']} must be >= 1, got {count}.")
    if index is not None and not (index >= 0 and (count is None or index < count)):
        allowed = "0 or more" if count is None else f"0 to {count - 1} ({count} processes)"
        raise ValueError(f"{sources['process_id']} must be {allowed}, got {index}.")
    missing = [name for name in _CLUSTER_ENV if name not in settings]
    if missing and not detect:
        wanted = ", ".join(f"{_flag(name)} (or {_CLUSTER_ENV[name]})" for name in missing)
        given = ", ".join(sources.values())
        raise ValueError(
            f"{given} joins a multi-process run, which also needs {wanted}; or pass "
            "--distributed to let JAX detect them from the cluster (SLURM, Cloud TPU, Open MPI)."
        )
    return {name: settings.get(name) for name in _CLUSTER_ENV}


def _join(settings: Mapping[str, Any], timeout: int = 300, label: str = "dew") -> None:
    """`dew.distributed.initialize` with `settings`, its failures as one clear error.

    When the coordinator or a peer has not joined within `timeout` seconds, the process
    prints one line (headed `label`) and exits with status 2: JAX's own deadline, which
    is set a little later, would end the process with a C++ check failure and a stack
    trace, past any Python handler."""
    from dew.distributed import initialize

    where = settings["coordinator_address"] or "the address JAX detects"
    count = settings["num_processes"]
    processes = f"all {count} processes" if count else "every process"

    def give_up() -> None:
        print(
            f"{label}: cannot join the multi-process run at {where}: the coordinator and "
            f"{processes} did not join within {timeout} s (--initialization-timeout); start "
            "every process of the run, or allow them longer",
            file=sys.stderr,
        )
        sys.stderr.flush()
        os._exit(2)

    watchdog = threading.Timer(timeout, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        initialize(**settings, initialization_timeout=timeout + _JAX_GRACE_SECONDS)
    except ValueError as error:  # JAX's: nothing detected, or values it refuses
        raise ValueError(
            f"cannot join the multi-process run ({error}); give --coordinator-address, "
            "--num-processes and --process-id (or their JAX_* variables), or run under a "
            "cluster JAX detects (SLURM, Cloud TPU, Open MPI) with --distributed."
        ) from error
    except RuntimeError as error:  # the coordinator refused this process
        raise ConnectionError(
            f"cannot join the multi-process run at {where}: {_message(error)}"
        ) from error
    finally:
        watchdog.cancel()
