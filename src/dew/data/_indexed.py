"""A batch is a function of the step: random-access rows read in an order that depends only on
(the rows' fingerprint, the seed, the step, the global batch size).

A source of random-access rows (`Rows`: a length, a fingerprint and a vectorised `read`) becomes
a `dew.data.Dataset` through `indexed_dataset`: its validation rows are held out by
(fingerprint, seed, val_fraction), and its training rows are read by `StepBatches`:

- the global batch of step `s` (the batch the optimizer step from state step `s` to `s + 1`
  trains on) is the rows at global positions `s * B ... s * B + B - 1`, `B` the global batch;
- global position `g` lies in epoch `e = g // N` (`N` training rows), and epoch `e` is one
  permutation of the rows drawn from `(fingerprint, seed, e)`: NumPy's, computed once per
  epoch (4 bytes a row) and kept while its batches are read (decision 0034 says why not
  Grain's `index_shuffle`);
- process `p` of `P` takes the `p`-th of `P` equal slices of the global batch (`B = P * b`,
  `b` the rows of one process's batch, the `batch` the trainer is given).

So a resumed run reads batch `s` directly (no replay), and one process and N processes train on
the same global batches. `StepBatches` is still a callable of a `Partition` returning an
iterator (batch 0, 1, ...), so every consumer of `Dataset.train` keeps working; the trainer
reads `batch_at(step, partition)` where it is offered.
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dew._integers import check_integer
from dew.data._dataset import Dataset, Partition

__all__ = [
    "InOrder",
    "Rows",
    "StepBatches",
    "Subset",
    "array_digest",
    "check_fraction",
    "epoch_positions",
    "fingerprint_of",
    "hold_out",
    "indexed_dataset",
]

_WHOLE_DIGEST_BYTES = 64 << 20
_SAMPLES = 64
_SAMPLE_BYTES = 1 << 20


@runtime_checkable
class Rows(Protocol):
    """Random-access rows with a shared leading axis.

    - `len(rows)`: how many rows there are.
    - `rows.read(indices)`: the rows at `indices` (a 1-D int64 array, any order, repeats
      allowed) as a mapping of arrays whose leading axis is `len(indices)`.
    - `rows.fingerprint`: a string that changes whenever the rows could (a content hash, or
      the files' paths, sizes and modification times, and every argument that shapes a row).
    """

    @property
    def fingerprint(self) -> str:
        """A string that changes whenever the rows could."""
        ...

    def __len__(self) -> int: ...

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        """The rows at `indices` (1-D int64), each field's leading axis `len(indices)`."""
        ...


def fingerprint_of(*parts: object) -> str:
    """A short stable hex digest of `parts`' `repr`s (for a `Rows.fingerprint`)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def array_digest(array: np.ndarray) -> str:
    """A hex digest of `array`'s dtype, shape and contents: every byte up to 64 MiB, beyond
    that 64 evenly spaced 1 MiB stretches (a memory-mapped file is read there only). Two
    arrays that differ only between those stretches share a digest."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((array.dtype.str, array.shape)).encode())
    flat = array.reshape(-1) if array.flags.c_contiguous else np.ascontiguousarray(array).ravel()
    if flat.nbytes <= _WHOLE_DIGEST_BYTES:
        digest.update(np.ascontiguousarray(flat).view(np.uint8).data)
        return digest.hexdigest()
    span = max(1, _SAMPLE_BYTES // max(1, flat.itemsize))
    for start in np.linspace(0, flat.size - span, _SAMPLES, dtype=np.int64).tolist():
        digest.update(np.ascontiguousarray(flat[start : start + span]).view(np.uint8).data)
    return digest.hexdigest()


def check_fraction(source: str, value: Any) -> float:
    """`value` as a float in `[0, 1)` (a `val_fraction`), else a `ValueError` naming `source`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not 0 <= float(value) < 1
    ):
        raise ValueError(f"{source}: val_fraction must be a number in [0, 1), got {value!r}.")
    return float(value)


def _seed_words(*parts: object) -> list[int]:
    """NumPy seed words drawn from `parts` (a fingerprint, a seed, a purpose, an epoch)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


@functools.lru_cache(maxsize=4)
def _permutation(fingerprint: str, seed: int, epoch: int, count: int) -> np.ndarray:
    """Epoch `epoch`'s order of `count` rows: NumPy's permutation drawn from (fingerprint,
    seed, epoch), int32 where it fits (4 bytes a row), kept for the epoch's batches."""
    dtype = np.int32 if count < 2**31 else np.int64
    order = np.random.default_rng(_seed_words(fingerprint, seed, "epoch", epoch)).permutation(
        np.arange(count, dtype=dtype)
    )
    order.flags.writeable = False
    return order


def epoch_positions(fingerprint: str, seed: int, count: int, positions: np.ndarray) -> np.ndarray:
    """The rows at global `positions` of the training order over `count` rows: position `g`
    is entry `g % count` of epoch `g // count`'s permutation, drawn from
    `(fingerprint, seed, g // count)`."""
    positions = np.asarray(positions, np.int64)
    epochs, within = np.divmod(positions, count)
    if positions.size and epochs[0] == epochs[-1]:  # one epoch: every batch but a boundary's
        order = _permutation(fingerprint, seed, int(epochs[0]), count)
        return order[within].astype(np.int64)
    rows = np.empty_like(positions)
    for epoch in np.unique(epochs).tolist():
        chosen = epochs == epoch
        rows[chosen] = _permutation(fingerprint, seed, epoch, count)[within[chosen]]
    return rows


class Subset:
    """The rows of `rows` at `indices` (in that order), as `Rows`; `purpose` tells subsets
    of the same rows apart in their fingerprint."""

    def __init__(self, rows: Rows, indices: np.ndarray, purpose: str = "subset") -> None:
        self.rows = rows
        self.indices = np.asarray(indices, np.int64)
        self.purpose = purpose
        self.fingerprint = fingerprint_of(rows.fingerprint, purpose, self.indices.tobytes())

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        """The rows of `rows` at `self.indices[indices]`."""
        return self.rows.read(self.indices[np.asarray(indices, np.int64)])

    def __repr__(self) -> str:
        return f"Subset({self.purpose!r}, {len(self)} of {len(self.rows)} rows)"


def hold_out(
    count: int, *, fingerprint: str, seed: int, val_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """`(train, val)` row indices: `ceil(val_fraction * count)` rows drawn from
    (fingerprint, seed) are held out (both sorted, disjoint, together every row)."""
    held = math.ceil(val_fraction * count) if val_fraction > 0 else 0
    order = np.random.default_rng(_seed_words(fingerprint, seed, "validation")).permutation(count)
    return np.sort(order[held:]), np.sort(order[:held])


def _checked_partition(partition: Any) -> Partition:
    if not isinstance(partition, Partition):
        raise TypeError(f"batches take a dew.data.Partition, got {partition!r}.")
    return partition


class StepBatches:
    """The training batches of `rows` as a function of the step (see the module's docstring).

    **Arguments:**

    - `rows`: the training rows (`Rows`).
    - `batch`: the rows of one process's batch (the global batch is the process count times
      that, at most `len(rows)`).
    - `seed`: the order's seed (with the rows' fingerprint).
    - `source`: the name error messages start with.

    `batch_at(step, partition)` is this process's share of the global batch of `step`;
    called with a `Partition`, a `StepBatches` is an endless iterator of `batch_at(0)`,
    `batch_at(1)`, ... (the form every `Dataset.train` has).
    """

    def __init__(self, rows: Rows, batch: int, seed: int, *, source: str = "StepBatches") -> None:
        self.rows, self.source = rows, source
        self.batch = check_integer("StepBatches.batch", batch, minimum=1)
        self.seed = check_integer("StepBatches.seed", seed, minimum=0)
        self.count = len(rows)
        if self.count < 1:
            raise ValueError("StepBatches needs at least one training row, got 0.")
        self.fingerprint = fingerprint_of("StepBatches", rows.fingerprint, self.batch, self.seed)
        self._rows_fingerprint = rows.fingerprint

    def indices(self, step: int, partition: Partition) -> np.ndarray:
        """The training rows of this process's share of the global batch of `step`."""
        step = check_integer("step", step, minimum=0)
        if partition.count * self.batch > self.count:
            raise ValueError(
                f"{self.source}: a global batch of {partition.count * self.batch} rows "
                f"({partition.count} process(es) x {self.batch}) is more than the {self.count} "
                "training row(s); lower the batch or add rows."
            )
        first = (step * partition.count + partition.index) * self.batch
        positions = np.arange(first, first + self.batch, dtype=np.int64)
        return epoch_positions(self._rows_fingerprint, self.seed, self.count, positions)

    def batch_at(self, step: int, partition: Partition | None = None) -> Mapping[str, np.ndarray]:
        """This process's share of the global batch of `step` (`partition`: this
        process's, `Partition.current()` when `None`)."""
        partition = Partition.current() if partition is None else _checked_partition(partition)
        return self.rows.read(self.indices(step, partition))

    def __call__(self, partition: Partition) -> Iterator[Mapping[str, np.ndarray]]:
        """`batch_at(0, partition)`, `batch_at(1, partition)`, ... (endless)."""
        partition = _checked_partition(partition)
        self.indices(0, partition)  # a global batch larger than the rows raises at the call
        return self._from(0, partition)

    def _from(self, step: int, partition: Partition) -> Iterator[Mapping[str, np.ndarray]]:
        while True:
            yield self.batch_at(step, partition)
            step += 1

    def __repr__(self) -> str:
        return f"StepBatches({self.rows!r}, batch={self.batch}, seed={self.seed})"


class InOrder:
    """One pass over `rows` in order: each process reads its strided share in batches of
    `batch` rows (the last may be short)."""

    def __init__(self, rows: Rows, batch: int) -> None:
        self.rows = rows
        self.batch = check_integer("InOrder.batch", batch, minimum=1)

    def __call__(self, partition: Partition) -> Iterator[Mapping[str, np.ndarray]]:
        """This process's strided share of the rows, in order, in batches of `batch`."""
        partition = _checked_partition(partition)
        mine = np.arange(partition.index, len(self.rows), partition.count, dtype=np.int64)
        return (
            self.rows.read(mine[start : start + self.batch])
            for start in range(0, mine.size, self.batch)
        )

    def __repr__(self) -> str:
        return f"InOrder({self.rows!r}, batch={self.batch})"


def indexed_dataset(
    rows: Rows,
    *,
    batch: int,
    seed: int = 0,
    val_fraction: float = 0.0,
    val: Rows | None = None,
    source: str = "indexed_dataset",
) -> Dataset:
    """A `Dataset` over random-access `rows`, its training batches a function of the step.

    **Arguments:**

    - `rows`: the rows (`Rows`).
    - `batch`: the rows of one process's batch; `seed`: the training order's (and the
      split's) seed.
    - `val_fraction`: `ceil(val_fraction * len(rows))` rows held out for validation, drawn
      from (fingerprint, seed, val_fraction); the rest train. `0`: no validation data.
    - `val`: validation rows of their own (instead of `val_fraction`): `rows` all train.
    - `source`: the name error messages start with.

    **Raises:** `ValueError` when no training row is left, or both `val_fraction` and `val`
    are given.
    """
    batch = check_integer(f"{source}: batch", batch, minimum=1)
    seed = check_integer(f"{source}: seed", seed, minimum=0)
    val_fraction = check_fraction(source, val_fraction)
    count = len(rows)
    if count < 1:
        raise ValueError(f"{source}: the rows are empty; a dataset needs at least one row.")
    if val is not None and val_fraction:
        raise ValueError(
            f"{source}: give val_fraction or val rows of their own, not both (got "
            f"val_fraction={val_fraction} and {len(val)} val rows)."
        )
    training: Rows = rows
    if val_fraction:
        train, held = hold_out(
            count, fingerprint=rows.fingerprint, seed=seed, val_fraction=val_fraction
        )
        training, val = Subset(rows, train, "train"), Subset(rows, held, "validation")
    if len(training) < 1:
        raise ValueError(
            f"{source}: {count} row(s) leave no training row after holding out "
            f"val_fraction={val_fraction} for validation; add data or lower val_fraction."
        )
    if batch > len(training):
        raise ValueError(
            f"{source}: batch={batch} is more than the {len(training)} training row(s); "
            "lower the batch or add rows."
        )
    return Dataset(
        train=StepBatches(training, batch, seed, source=source),
        val=InOrder(val, batch) if val is not None and len(val) else None,
        records=len(training),
        batch=batch,
    )
