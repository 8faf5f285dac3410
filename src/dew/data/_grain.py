"""`map_dataset`: a user's Grain `MapDataset` (finite, each element a dict of arrays) as
step-indexed rows: dew reads it by index and takes over shuffling, epochs and batching."""

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.data._arrays import narrowed
from dew.data._dataset import Dataset
from dew.data._indexed import array_digest, fingerprint_of, indexed_dataset

__all__ = ["MapDatasetRows", "map_dataset"]

SAMPLED_ROWS = 8
"""The rows a derived fingerprint reads (evenly spaced, the first and the last among them)."""


def _element(source: str, dataset: Any, index: int) -> Mapping[str, Any]:
    element = dataset[index]
    if not isinstance(element, Mapping) or not all(isinstance(key, str) for key in element):
        raise TypeError(
            f"{source}: element {index} of the MapDataset is a {type(element).__name__}; dew "
            "reads rows as dicts of arrays: map it to one first (e.g. .map(lambda x: "
            '{"images": x[0], "labels": x[1]})).'
        )
    return element


class MapDatasetRows:
    """`Rows` over a finite Grain `MapDataset` whose elements are dicts of arrays:
    `read(indices)` reads `dataset[i]` for each index and stacks each field (64-bit
    fields narrowed as `dew.data.arrays` narrows them, values checked to fit).

    `fingerprint`: the one given, or one derived from the dataset's length and its
    `SAMPLED_ROWS` evenly spaced rows (their fields' names, dtypes, shapes and bytes)."""

    def __init__(self, dataset: Any, fingerprint: str | None = None) -> None:
        self.dataset = dataset
        self.count = len(dataset)
        self.keys = tuple(_element("map_dataset", dataset, 0)) if self.count else ()
        if fingerprint is None:
            sampled = np.unique(np.linspace(0, self.count - 1, SAMPLED_ROWS, dtype=np.int64))
            rows = self.read(sampled) if self.count else {}
            digests = [(key, array_digest(np.ascontiguousarray(rows[key]))) for key in self.keys]
            fingerprint = fingerprint_of("map_dataset", self.count, *digests)
        self.fingerprint = fingerprint

    def __len__(self) -> int:
        return self.count

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        elements = [_element("map_dataset", self.dataset, index) for index in indices.tolist()]
        batch = {}
        for key in self.keys:
            try:
                stacked = np.stack([np.asarray(element[key]) for element in elements])
            except KeyError:
                missing = next(
                    i for i, e in zip(indices.tolist(), elements, strict=True) if key not in e
                )
                raise KeyError(
                    f"map_dataset: element {missing} of the MapDataset has no {key!r} (element 0 "
                    f"has {list(self.keys)}); every element needs the same fields."
                ) from None
            batch[key] = narrowed(f"map_dataset: field {key!r}", stacked)
        return batch

    def __repr__(self) -> str:
        return f"MapDatasetRows({self.count} rows of {list(self.keys)})"


def map_dataset(
    dataset: Any,
    *,
    batch: int,
    val_fraction: float = 0.0,
    seed: int = 0,
    fingerprint: str | None = None,
) -> Dataset:
    """A Grain `MapDataset` you already have, as a dataset whose training batches are a
    function of the step.

    **Arguments:**

    - `dataset`: a finite `grain.MapDataset` (before any `.repeat()` or `.batch()`: dew
      draws epochs and batches itself) whose elements are dicts of arrays or numbers, one
      example each; dew reads it by index (`dataset[i]`), one call per row of a batch, and
      stacks each field.
    - `batch`: the rows of one process's batch.
    - `val_fraction`, `seed`: as in `dew.data.arrays`.
    - `fingerprint`: a string naming the dataset's contents (say, its source files and
      version). Without it dew derives one from the dataset's length and 8 evenly spaced
      rows, cheap and the same in every process, but blind to a change elsewhere in the
      rows: give one when rows can change while those stay the same.

    **Raises:** `TypeError` for anything but a `MapDataset` or for elements that are not
    dicts; `ValueError` for an infinite or empty dataset, or no training row left.
    """
    name = "map_dataset"
    try:
        import grain
    except ImportError:
        raise ImportError(
            f"{name} needs Grain: install dew-ml[grain] (pip install 'dew-ml[grain]')."
        ) from None
    if not isinstance(dataset, grain.MapDataset):
        raise TypeError(f"{name}: needs a grain.MapDataset, got {type(dataset).__name__}.")
    if len(dataset) >= sys.maxsize:
        raise ValueError(
            f"{name}: the MapDataset is infinite (len {len(dataset)}: a .repeat()?); give the "
            "finite one: dew repeats epochs itself."
        )
    if fingerprint is not None and (not isinstance(fingerprint, str) or not fingerprint):
        raise ValueError(f"{name}: fingerprint must be a non-empty string, got {fingerprint!r}.")
    rows = MapDatasetRows(dataset, fingerprint)
    return indexed_dataset(rows, batch=batch, seed=seed, val_fraction=val_fraction, source=name)
