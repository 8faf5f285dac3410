"""A batch is a function of the step: random-access rows read in an order that depends only on
(the rows' fingerprint, the seed, the step, the global batch size).

A source of random-access rows (`Rows`: a length, a fingerprint and a vectorised `read`) becomes
a `dew.data.Dataset` through `indexed_dataset`: its validation rows are held out by
(fingerprint, seed, val_fraction), and its training rows are read by `StepBatches`:

- the global batch of step `s` (the batch the optimizer step from state step `s` to `s + 1`
  trains on) is the rows at global positions `s * B ... s * B + B - 1`, `B` the global batch;
- global position `g` lies in epoch `e = g // N` (`N` training rows), and epoch `e` is one
  permutation of the rows drawn from `(seed, e)`;
- process `p` of `P` takes the `p`-th of `P` equal slices of the global batch (`B = P * b`,
  `b` the rows of one process's batch, the `batch` the trainer is given).

So a resumed run reads batch `s` directly (no replay), and one process and N processes train on
the same global batches. `StepBatches` is still a callable of a `Partition` returning an
iterator (batch 0, 1, ...), so every consumer of `Dataset.train` keeps working; the trainer
reads `batch_at(step, partition)` where it is offered.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Iterator, Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from dew._checks import check_integer
from dew.data._dataset import Dataset, Partition

__all__ = [
    "InOrder",
    "Rows",
    "StepBatches",
    "Subset",
    "epoch_positions",
    "fingerprint_of",
    "hold_out",
    "indexed_dataset",
]


@runtime_checkable
class Rows(Protocol):
    """Random-access rows with a shared leading axis.

    - `len(rows)`: how many rows there are.
    - `rows.read(indices)`: the rows at `indices` (a 1-D int64 array, any order, repeats
      allowed) as a mapping of arrays whose leading axis is `len(indices)`.
    - `rows.fingerprint`: a string that changes whenever the rows could (a content hash, or
      the files' paths, sizes and modification times, and every argument that shapes a row).
    """

    fingerprint: str

    def __len__(self) -> int: ...

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]: ...


def fingerprint_of(*parts: object) -> str:
    """A short stable hex digest of `parts`' `repr`s (for a `Rows.fingerprint`)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def _seed_words(*parts: object) -> list[int]:
    """NumPy seed words drawn from `parts` (a fingerprint, a seed, a purpose, an epoch)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


@functools.lru_cache(maxsize=4)
def _permutation(fingerprint: str, seed: int, epoch: int, count: int) -> np.ndarray:
    order = np.random.default_rng(_seed_words(fingerprint, seed, "epoch", epoch)).permutation(count)
    order.flags.writeable = False
    return order


def epoch_positions(fingerprint: str, seed: int, count: int, positions: np.ndarray) -> np.ndarray:
    """The rows at global `positions` of the training order over `count` rows: position `g`
    is row `permutation(seed, g // count)[g % count]`."""
    positions = np.asarray(positions, np.int64)
    epochs, within = np.divmod(positions, count)
    rows = np.empty_like(positions)
    for epoch in np.unique(epochs):
        chosen = epochs == epoch
        rows[chosen] = _permutation(fingerprint, seed, int(epoch), count)[within[chosen]]
    return rows


@dataclasses.dataclass(frozen=True, eq=False)
class Subset:
    """The rows of `rows` at `indices` (in that order), as `Rows`."""

    rows: Rows
    indices: np.ndarray
    purpose: str = "subset"

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.rows.fingerprint, self.purpose, self.indices.tobytes())

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        return self.rows.read(self.indices[np.asarray(indices, np.int64)])


def hold_out(
    count: int, *, fingerprint: str, seed: int, val_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """`(train, val)` row indices: `ceil(val_fraction * count)` rows drawn from
    (fingerprint, seed) are held out (both sorted, disjoint, together every row)."""
    held = math.ceil(val_fraction * count) if val_fraction > 0 else 0
    order = np.random.default_rng(_seed_words(fingerprint, seed, "validation")).permutation(count)
    return np.sort(order[held:]), np.sort(order[:held])


@dataclasses.dataclass(frozen=True, eq=False)
class StepBatches:
    """The training batches of `rows` as a function of the step (see the module's docstring).

    - `rows`: the training rows; `batch`: the rows of one process's batch; `seed`: the order's.
    - `batch_at(step, partition)`: this process's share of the global batch of `step`.
    - Called with a `Partition`, an iterator of `batch_at(0)`, `batch_at(1)`, ... (the form
      every `Dataset.train` has).
    """

    rows: Rows
    batch: int
    seed: int

    def __post_init__(self) -> None:
        check_integer("StepBatches.batch", self.batch, minimum=1)
        check_integer("StepBatches.seed", self.seed, minimum=0)
        if len(self.rows) < 1:
            raise ValueError("StepBatches needs at least one training row, got 0.")

    def indices(self, step: int, partition: Partition) -> np.ndarray:
        """The training rows of this process's share of the global batch of `step`."""
        step = check_integer("step", step, minimum=0)
        first = (step * partition.count + partition.index) * self.batch
        positions = np.arange(first, first + self.batch, dtype=np.int64)
        return epoch_positions(self.rows.fingerprint, self.seed, len(self.rows), positions)

    def batch_at(self, step: int, partition: Partition | None = None) -> Mapping[str, np.ndarray]:
        """This process's share of the global batch of `step`."""
        partition = Partition.current() if partition is None else partition
        return self.rows.read(self.indices(step, partition))

    def __call__(self, partition: Partition) -> Iterator[Mapping[str, np.ndarray]]:
        step = 0
        while True:
            yield self.batch_at(step, partition)
            step += 1


@dataclasses.dataclass(frozen=True, eq=False)
class InOrder:
    """One pass over `rows` in order: each process reads its strided share in batches of
    `batch` rows (the last may be short)."""

    rows: Rows
    batch: int

    def __call__(self, partition: Partition) -> Iterator[Mapping[str, np.ndarray]]:
        mine = np.arange(partition.index, len(self.rows), partition.count, dtype=np.int64)
        for start in range(0, mine.size, self.batch):
            yield self.rows.read(mine[start : start + self.batch])


def indexed_dataset(rows: Rows, *, batch: int, seed: int, val_fraction: float = 0.0) -> Dataset:
    """A `Dataset` over random-access `rows`: `ceil(val_fraction * len(rows))` rows held out
    for validation by (fingerprint, seed, val_fraction), the rest read by `StepBatches`."""
    train, val = hold_out(
        len(rows), fingerprint=rows.fingerprint, seed=seed, val_fraction=val_fraction
    )
    training = Subset(rows, train, "train") if val.size else rows
    return Dataset(
        train=StepBatches(training, batch, seed),
        val=InOrder(Subset(rows, val, "validation"), batch) if val.size else None,
        records=len(training),
        batch=batch,
    )
