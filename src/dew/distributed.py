"""Multi-process runs on JAX's own multi-controller runtime, `jax.distributed`.

Every process runs the same program: it calls `initialize` first (before any other JAX
call), reads its own `dew.data.Partition` of the data, and takes part in every compiled
step and every gather; only process zero computes host metrics, decodes previews and
writes tracking output, run records and ledgers (`is_process_zero`).

```python
>>> from dew import distributed
>>> distributed.process_count(), distributed.is_process_zero()  # one process here
(1, True)

```
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax

from dew._processes import (
    PhaseFailedError,
    agree_process_phase,
    broadcast_json,
    coordinated,
    data_mesh,
    global_batch,
    is_multiprocess,
    is_process_zero,
    replicated,
)

__all__ = [
    "PhaseFailedError",
    "agree_process_phase",
    "broadcast_json",
    "coordinated",
    "data_mesh",
    "global_batch",
    "initialize",
    "is_multiprocess",
    "is_process_zero",
    "process_count",
    "process_index",
    "replicated",
]


def process_count() -> int:
    """How many processes the run has (1 without `jax.distributed`)."""
    return jax.process_count()


def process_index() -> int:
    """This process's index, 0 to `process_count() - 1`."""
    return jax.process_index()


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    initialization_timeout: int = 300,
    **options: Any,
) -> None:
    """Start `jax.distributed` for this process: `jax.distributed.initialize` with CPU
    collectives over gloo (JAX's CPU backend has none by default, and a CPU run's
    gathers need them).

    Arguments left `None` are found as `jax.distributed.initialize` finds them:
    `JAX_COORDINATOR_ADDRESS` (and `JAX_COORDINATOR_PORT`, ...), SLURM's and Cloud TPU's
    variables, Open MPI's; dew also reads `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`, which
    `dew train --processes N` sets for its local processes. `options` go to
    `jax.distributed.initialize` (`heartbeat_timeout_seconds`, `local_device_ids`, ...).
    A process whose peers never arrive fails after `initialization_timeout` seconds.

    Over gloo, the processes connect to each other at once, in one small gather, with this
    process's standard output closed to gloo's own "Rank 0 is connected to 1 peer ranks"
    line (which it would print at the run's first collective, in the middle of the user's).

    **Raises:** `ValueError` when a process count or index is not a whole number.
    """
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = _whole("JAX_NUM_PROCESSES", os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = _whole("JAX_PROCESS_ID", os.environ["JAX_PROCESS_ID"])
    # JAX's config sets its flags as attributes at run time, which a type checker cannot see.
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):  # pyright: ignore[reportAttributeAccessIssue]
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address,
        num_processes,
        process_id,
        initialization_timeout=initialization_timeout,
        **options,
    )
    collectives = jax.config.jax_cpu_collectives_implementation  # pyright: ignore[reportAttributeAccessIssue]
    if jax.process_count() > 1 and collectives == "gloo":
        _connect_quietly()


def _connect_quietly() -> None:
    """One gather of a single number, which makes gloo connect this process to its peers,
    with file descriptor 1 pointed at the null device meanwhile: gloo prints its connection
    line from C++ to standard output, past Python's `sys.stdout`."""
    import numpy as np
    from jax.experimental import multihost_utils

    sys.stdout.flush()
    kept = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        multihost_utils.process_allgather(np.zeros(1, np.int32))
    finally:
        os.dup2(kept, 1)
        os.close(kept)


def _whole(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {text!r}.") from None
