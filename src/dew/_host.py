"""Pytrees on the host, in one process or several: `host` fetches a process's own arrays,
`collective_host` gathers global ones on every process at the same point (how process zero
gets a preview or a host metric's artifact under `jax.distributed`). `dew.artifacts`
re-exports both; they take any pytree of arrays, artifacts first among them."""

import hashlib
from typing import Any, TypeVar

import jax
import numpy as np

from dew._processes import _allgather, agree_process_phase

__all__ = ["collective_host", "host"]

_T = TypeVar("_T")


def host(artifact: _T) -> _T:
    """`artifact` with every array leaf fetched to the host as a NumPy array.

    The plain, local transfer: it needs every array on this process's devices, which is
    always so in one process, and under `jax.distributed` for arrays a process made
    itself (process zero decoding its own local arrays). A global array sharded over
    several processes needs `collective_host`, called on every process.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew.artifacts import TokenScores
    >>> type(host(TokenScores(losses=jnp.ones((1, 2)), weights=jnp.ones((1, 2)))).losses)
    <class 'numpy.ndarray'>

    ```

    **Raises:** `ValueError` naming the field when an array is not fully addressable here.
    """

    def fetch(path: Any, leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            raise ValueError(
                f"{type(artifact).__name__}{jax.tree_util.keystr(path)} is a global array "
                f"of shape {leaf.shape} spread over several processes: fetch it with "
                "dew.artifacts.collective_host(artifact), called on every process."
            )
        return np.asarray(leaf)

    return jax.tree_util.tree_map_with_path(fetch, artifact)


def _plan_of(path: Any, leaf: Any) -> str:
    """One leaf's part of a gather plan: how it is fetched, its shape and dtype."""
    if isinstance(leaf, jax.Array):
        if leaf.is_deleted():
            raise ValueError(f"field {jax.tree_util.keystr(path)} is a deleted (donated) array.")
        if leaf.is_fully_replicated or (leaf.is_fully_addressable and jax.process_count() == 1):
            how = "copy"
        elif leaf.is_fully_addressable:
            how = "rows"  # process-local rows: joined in process order
        else:
            how = "gather"
            for shard in leaf.addressable_shards:  # every local shard must be readable
                shard.data.shape  # noqa: B018
        return f"{how} {leaf.dtype} {tuple(leaf.shape) if how != 'rows' else tuple(leaf.shape[1:])}"
    array = np.asarray(leaf)  # a local conversion that fails here fails before any gather
    if array.dtype == object:
        raise ValueError(
            f"field {jax.tree_util.keystr(path)} holds Python objects, not an array "
            f"({type(leaf).__name__})."
        )
    how = "rows" if jax.process_count() > 1 and array.ndim else "copy"
    return f"{how} {array.dtype} {array.shape if how == 'copy' else array.shape[1:]}"


def _join_rows(local: np.ndarray) -> np.ndarray:
    """Every process's rows of a process-local array, joined in process order (padded to
    the longest for the gather, which needs one shape everywhere)."""
    counts = _allgather(np.array([len(local)], np.int32)).reshape(-1)
    padded = np.zeros((int(counts.max()), *local.shape[1:]), local.dtype)
    padded[: len(local)] = local
    gathered = _allgather(padded)
    return np.concatenate([rows[:count] for rows, count in zip(gathered, counts, strict=True)])


def _received(value: Any) -> np.ndarray:
    """A transferred leaf as this process keeps it (a seam the failure tests patch)."""
    return np.asarray(value)


def collective_host(artifact: _T) -> _T:
    """`artifact` on the host of every process, its global arrays gathered: the
    collective counterpart of `host`, called on every process at the same point.

    Under `jax.distributed` it first checks, on each process, that every leaf converts
    locally and that its addressable shards are readable; then the processes agree on the
    gather plan (each leaf's kind, dtype and shape); then it gathers leaf by leaf, sharing
    each transfer's outcome before the next gather, so a failure on one process raises
    the same error on all of them instead of leaving the others blocked in a gather. A
    global array is gathered whole; a replicated one is copied; process-local arrays (a
    process's own rows, not a global array) are joined along their row axis in process
    order. In one process it is `host`.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew.artifacts import Images
    >>> images = Images(generated=jnp.zeros((2, 4, 4, 3)))
    >>> collective_host(images).generated.shape
    (2, 4, 4, 3)

    ```

    **Raises:** `ValueError` (or `dew.artifacts.PhaseFailedError` for a failure that is
    not bad input) on every process, naming the phase, the process and the field.
    """
    if jax.process_count() == 1:
        return host(artifact)
    from jax.experimental import multihost_utils

    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(artifact)
    plan: list[str] = []
    outcome: bool | BaseException = True
    try:
        plan = [_plan_of(path, leaf) for path, leaf in paths_leaves]
    except Exception as error:
        outcome = error
    kind = type(artifact).__name__
    agree_process_phase(f"collective_host({kind}): local conversions", outcome)
    digest = hashlib.sha256("\n".join(plan).encode()).digest()[:16]
    digests = _allgather(np.frombuffer(digest, np.uint8))
    differing = [index for index, row in enumerate(digests) if bytes(row) != bytes(digests[0])]
    if differing:
        raise ValueError(
            f"collective_host({kind}): process {', '.join(map(str, differing))} holds an "
            "artifact whose fields, dtypes or shapes differ from process 0's; every process "
            "must pass an artifact of the same structure (only the rows of process-local "
            "arrays may differ)."
        )
    values = []
    for (path, leaf), step in zip(paths_leaves, plan, strict=True):
        value: Any = None
        outcome = True
        try:
            if step.startswith("copy"):
                value = leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf
            elif step.startswith("rows"):
                value = _join_rows(np.asarray(leaf))
            else:
                value = multihost_utils.process_allgather(leaf, tiled=True)
            value = _received(value)
        except Exception as error:
            outcome = error
        agree_process_phase(
            f"collective_host({kind}): transfer of {jax.tree_util.keystr(path)}", outcome
        )
        values.append(value)
    return jax.tree_util.tree_unflatten(treedef, values)
