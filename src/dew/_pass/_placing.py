"""Global arrays under `jax.distributed`: replicated leaves, and each batch checked on the
host, its outcome and layout agreed by every process, placed as one global batch."""

import hashlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jaxtyping import PyTree

from dew._processes import _allgather, agree_process_phase, global_batch, replicated
from dew.naming import Split
from dew.objectives.base import Objective, check_batch_keys, check_on_host


def _everywhere(tree: PyTree) -> PyTree:
    """`tree` as global arrays: arrays already spread over the processes stay as they are
    (a user-given sharding), every other array is replicated over the data mesh."""

    def place(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return leaf
        return replicated(leaf)

    return jax.tree.map(place, tree)


def _local(leaf: Any) -> Any:
    """This process's copy of a replicated global array (what finalizing reads)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return leaf.addressable_data(0)
    return leaf


def _layout(batch: Mapping[str, Any]) -> str:
    """A batch's fields, shapes and dtypes: what every process's batch must share."""
    paths_leaves = jax.tree_util.tree_flatten_with_path(dict(batch))[0]
    return ", ".join(
        f"{jax.tree_util.keystr(path)} {tuple(np.shape(leaf))} {np.result_type(leaf)}"
        for path, leaf in paths_leaves
    )


def _gather_texts(text: str) -> list[str]:
    """Every process's `text`, in process order."""
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    lengths = _allgather(np.array([len(data)], np.int64)).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: len(data)] = data
    rows = _allgather(padded)
    return [bytes(row[:n]).decode("utf-8", "replace") for row, n in zip(rows, lengths, strict=True)]


def _place(objective: Objective, batch: Mapping[str, Any], index: int) -> dict[str, Any]:
    """This process's batch `index`, checked on the host by the objective's own checks,
    the outcome and the batch's layout agreed by every process, placed as one global
    batch. A bad batch on any process raises the same `ValueError` on every process."""
    outcome: bool | BaseException = True
    placed: dict[str, Any] = {}
    layout = ""
    try:
        check_batch_keys(objective, batch, Split.VALIDATION)
        check_on_host(objective, batch)
        layout = _layout(batch)
        placed = global_batch(batch)
    except Exception as error:
        outcome = error
    # One exchange in the common case: each process's outcome beside its layout's digest;
    # only when some process failed do they agree on (and raise) its error.
    row = np.zeros(17, np.uint8)
    row[0] = outcome is not True
    row[1:] = np.frombuffer(hashlib.sha256(layout.encode("utf-8")).digest()[:16], np.uint8)
    rows = _allgather(row)
    if rows[:, 0].any():
        agree_process_phase(f"checking validation batch {index}", outcome)
    if any(bytes(digest) != bytes(rows[0, 1:]) for digest in rows[:, 1:]):
        layouts = _gather_texts(layout)
        shown = "; ".join(f"process {i}: {text}" for i, text in enumerate(layouts))
        raise ValueError(
            f"validation batch {index} differs between the processes ({shown}): every "
            "process must read batches of the same fields, dtypes and row count (batch "
            "each shard with one batch size, and drop or pad a shorter last batch)."
        )
    return placed
