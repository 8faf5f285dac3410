"""Global arrays under `jax.distributed`: replicated leaves, and each batch checked on the
host, its outcome and layout agreed by every process, placed as one global batch."""

import hashlib
from collections.abc import Iterable, Iterator, Mapping
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
    paths_leaves, structure = jax.tree_util.tree_flatten_with_path(dict(batch))
    # written once per layout (a dtype's name is slow to spell, batch after batch)
    key = (structure, *((np.shape(leaf), _dtype(leaf)) for _, leaf in paths_leaves))
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(_LAYOUTS) > 256:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = ", ".join(
            f"{jax.tree_util.keystr(path)} {tuple(np.shape(leaf))} {np.result_type(leaf)}"
            for path, leaf in paths_leaves
        )
    return layout


_LAYOUTS: dict[tuple[Any, ...], str] = {}


def _dtype(leaf: Any) -> Any:
    dtype = getattr(leaf, "dtype", None)
    return dtype if isinstance(dtype, np.dtype) else np.result_type(leaf)


def _gather_texts(text: str) -> list[str]:
    """Every process's `text`, in process order."""
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    lengths = _allgather(np.array([len(data)], np.int64)).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: len(data)] = data
    rows = _allgather(padded)
    return [bytes(row[:n]).decode("utf-8", "replace") for row, n in zip(rows, lengths, strict=True)]


_BLOCK = 8
"""Batches each process reads ahead, checks and places before one exchange agrees on them
all (decision 0088): the processes meet once per block, not twice per batch. The first
block is this long; later ones as long as `_BLOCK_BYTES` of batches, up to `_MAX_BLOCK`."""
_MAX_BLOCK = 64  # (a count the exchanged row's one byte holds)
_BLOCK_BYTES = 64 * 2**20  # of placed batches a later block holds at most (below 8 of them)
_DIGEST = 8  # bytes of a batch layout's digest in the exchanged row

# Why a process stopped reading its block early (the row's second byte).
_FULL, _ENDED, _UNREADABLE, _REFUSED = 0, 1, 2, 3


def _digest(layout: str) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(layout.encode("utf-8")).digest()[:_DIGEST], np.uint8)


class AgreedBatches:
    """`AgreedBatches(objective, batches)`: this process's batches and their placed global
    batches, while every process has one, each checked on the host by the objective's
    own checks and its layout agreed with every process's batch of the same index.

    Each process reads a block of batches (`_BLOCK` at first, then as many as
    `_BLOCK_BYTES` hold, up to `_MAX_BLOCK`), checks and places each, and stops early at
    its shard's end, at a batch it cannot read, or at one its checks refuse; one exchange
    then tells every process how far each got, why it stopped, each batch's layout digest
    and whether it keeps the pass's first artifact (`keep_first`: any process's). The pass
    runs the batches every process holds, in order, and ends the same as checking batch by
    batch would: at the first index some process has no batch for (`uneven` when another
    had one), raising there the failure of a process that could not read it, or that of a
    process whose checks refused it when every process read one; batches before it whose
    layouts differ between the processes raise first.
    """

    def __init__(
        self, objective: Objective, batches: Iterable[Mapping[str, Any]], keep_first: bool = False
    ) -> None:
        self._objective = objective
        self._batches = iter(batches)
        self.uneven = False
        self.keep_first = keep_first  # any process's, once the first block is agreed

    def _read(
        self, size: int
    ) -> tuple[list[tuple[Mapping[str, Any], dict[str, Any], str]], int, BaseException | None]:
        """This process's next block of up to `size` batches: the batches read, checked and
        placed, with their layouts; why the block ended; the error that ended it, if one
        did."""
        block: list[tuple[Mapping[str, Any], dict[str, Any], str]] = []
        while len(block) < size:
            try:
                batch = next(self._batches)
            except StopIteration:
                return block, _ENDED, None
            except Exception as error:  # a failing loader: every process raises it
                return block, _UNREADABLE, error
            try:
                check_batch_keys(self._objective, batch, Split.VALIDATION)
                check_on_host(self._objective, batch)
                layout = _layout(batch)
                block.append((batch, global_batch(batch), layout))
            except Exception as error:
                return block, _REFUSED, error
        return block, _FULL, None

    def __iter__(self) -> Iterator[tuple[Mapping[str, Any], dict[str, Any]]]:
        start, size = 0, _BLOCK
        while True:
            block, why, error = self._read(size)
            row = np.zeros(3 + size * _DIGEST, np.uint8)
            row[:3] = len(block), why, self.keep_first
            for index, (_, _, layout) in enumerate(block):
                row[3 + index * _DIGEST : 3 + (index + 1) * _DIGEST] = _digest(layout)
            rows = _allgather(row)
            counts, whys = [int(count) for count in rows[:, 0]], [int(w) for w in rows[:, 1]]
            self.keep_first = bool(rows[:, 2].any())
            agreed = min(counts)
            for index in range(agreed):  # layouts differing before any failure raise first
                digests = rows[:, 3 + index * _DIGEST : 3 + (index + 1) * _DIGEST]
                if (digests != digests[0]).any():
                    _differ(block[index][2], start + index)
            # At index `agreed` (the block's end when every process filled it): who read a
            # batch there, and who failed there.
            here = [count == agreed and w != _FULL for count, w in zip(counts, whys, strict=True)]
            read_there = [
                count > agreed or (at and w == _REFUSED)
                for count, w, at in zip(counts, whys, here, strict=True)
            ]
            # This process's own failure, where the pass ends (`True` elsewhere).
            failure = error if error is not None and here[jax.process_index()] else None
            if any(at and w == _UNREADABLE for at, w in zip(here, whys, strict=True)):
                outcome = failure if why == _UNREADABLE and failure is not None else True
                agree_process_phase("reading a validation batch", outcome)
            if any(here) and all(read_there):
                outcome = failure if why == _REFUSED and failure is not None else True
                agree_process_phase(f"checking validation batch {start + agreed}", outcome)
            for local, placed, _ in block[:agreed]:
                yield local, placed
            if any(here):  # some process has no batch at `agreed`: the pass ends there
                self.uneven = any(read_there)
                return
            # Every process filled the block with batches of one layout: the next block
            # is as long on each (decision 0088).
            size = _next_size(block[0][0])
            start += agreed


def _next_size(batch: Mapping[str, Any]) -> int:
    """How many batches like `batch` a block after the first reads: `_BLOCK_BYTES` of them,
    at least `_BLOCK` and at most `_MAX_BLOCK` (one per process's layout: the same on every
    process)."""
    size = sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(dict(batch)))
    return int(min(_MAX_BLOCK, max(_BLOCK, _BLOCK_BYTES // max(size, 1))))


def _differ(layout: str, index: int) -> None:
    """Raise, on every process, that validation batch `index`'s layouts differ."""
    layouts = _gather_texts(layout)
    shown = "; ".join(f"process {i}: {text}" for i, text in enumerate(layouts))
    raise ValueError(
        f"validation batch {index} differs between the processes ({shown}): every "
        "process must read batches of the same fields, dtypes and row count (batch "
        "each shard with one batch size, and drop or pad a shorter last batch)."
    )
