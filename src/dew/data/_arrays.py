"""`arrays`: a mapping of arrays with a shared leading row axis (in memory, or an `.npz` or
`.npy` file) as step-indexed rows."""

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from dew.data._dataset import Dataset
from dew.data._files import local_path
from dew.data._indexed import array_digest, fingerprint_of, indexed_dataset

__all__ = ["ArrayRows", "arrays", "check_fits", "narrowed", "target_dtype"]

_NARROWED = {
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}
_CHUNK_ROWS = 1 << 20


class ArrayRows:
    """`Rows` over named arrays of one length: `read(indices)` indexes each array's leading
    axis, in the dtype `dtypes` names for it. `fingerprint` digests the names, dtypes,
    shapes and contents (`dew.data._indexed.array_digest`)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], dtypes: Mapping[str, np.dtype]) -> None:
        self.arrays, self.dtypes = dict(arrays), dict(dtypes)
        self.count = next(iter(self.arrays.values())).shape[0]
        self.fingerprint = fingerprint_of(
            "arrays",
            *(
                (key, self.dtypes[key].str, array_digest(value))
                for key, value in self.arrays.items()
            ),
        )

    def __len__(self) -> int:
        return self.count

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        return {
            key: np.asarray(value[indices], self.dtypes[key]) for key, value in self.arrays.items()
        }

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{key}: {self.dtypes[key]}{value.shape[1:]}" for key, value in self.arrays.items()
        )
        return f"ArrayRows({self.count} rows; {shapes})"


def _loaded(source: str, value: Any) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` file (in memory) or a `.npy` file (memory-mapped, under its
    file name's stem)."""
    path = local_path(source, value, "a .npz or .npy file of arrays")
    shown = repr(os.fspath(value))
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                return {key: archive[key] for key in archive.files}
        if path.suffix == ".npy":
            return {path.stem: np.load(path, mmap_mode="r", allow_pickle=False)}
    except ValueError as error:  # pickled objects, a damaged file
        raise ValueError(f"{source}: cannot read {shown}: {error}") from None
    raise ValueError(f"{source}: {shown} is neither a .npz nor a .npy file.")


def target_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype rows of `dtype` are read in: `dtype` itself, but for 64-bit types while JAX
    keeps 32-bit ones (`jax_enable_x64` off), which narrow to their 32-bit kin."""
    return dtype if jax.config.read("jax_enable_x64") else _NARROWED.get(dtype, dtype)


def check_fits(where: str, array: np.ndarray, target: np.dtype) -> None:
    """Every value of the integer `array` fits `target`, read `_CHUNK_ROWS` rows at a time;
    else a `ValueError` naming `where`, the value and its row."""
    if target.kind not in "iu" or target == array.dtype or not array.size:
        return
    info = np.iinfo(target)
    for start in range(0, array.shape[0], _CHUNK_ROWS):
        chunk = np.asarray(array[start : start + _CHUNK_ROWS])
        low, high = chunk.min(), chunk.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            row = start + int(np.argwhere(chunk == bad)[0][0])
            raise ValueError(
                f"{where} holds {int(bad)} at row {row}, outside {target} ([{info.min}, "
                f"{info.max}]), the type JAX holds {array.dtype} in without jax_enable_x64; "
                "rescale it, or enable x64."
            )


def _dtype(where: str, array: np.ndarray) -> np.dtype:
    if array.dtype.kind not in "biufc":
        raise ValueError(
            f"{where} has dtype {array.dtype}; rows hold numbers or booleans (decode strings "
            "and objects into arrays first)."
        )
    target = target_dtype(array.dtype)
    check_fits(where, array, target)
    return target


def narrowed(where: str, array: np.ndarray) -> np.ndarray:
    """`array` in the dtype its rows are read in (see `target_dtype`), values checked."""
    return np.asarray(array, _dtype(where, array))


def arrays(
    source: Mapping[str, Any] | str | os.PathLike[str],
    *,
    batch: int,
    val_fraction: float = 0.0,
    seed: int = 0,
) -> Dataset:
    """A dataset of named arrays sharing a leading row axis: row `i` of every array is one
    example (scikit-learn's `X[i]` and `y[i]`), and each batch maps every name to its rows.

    **Arguments:**

    - `source`: a mapping of names to arrays (NumPy or anything `np.asarray` takes), or the
      path of an `.npz` file (its names as `np.savez` saved them; read into memory) or of one
      `.npy` array (memory-mapped, named by the file's stem: `images.npy` gives
      `batch["images"]`). A path is kept as given: a relative one is read from the working
      directory.
    - `batch`: the rows of one process's batch.
    - `val_fraction`: `ceil(val_fraction * rows)` rows held out for validation, chosen by
      (the arrays' contents, `seed`, `val_fraction`); `0` gives no validation data.
    - `seed`: the split's and the training order's seed.

    Each array keeps its dtype, but for 64-bit types while JAX holds 32-bit ones
    (`jax_enable_x64` off, its default): `float64` rows are read as `float32`, `int64` as
    `int32` (every value checked to fit when the dataset is built), `uint64` as `uint32`,
    `complex128` as `complex64`, as JAX would convert them anyway.

    The training batch of step `s` is a function of (the arrays' contents, `seed`, `s`, the
    global batch): see `dew.data.StepBatches`.

    **Raises:** `ValueError` when the arrays' leading axes differ (naming each array and its
    length), an array has no row axis or holds no numbers, an `int64` value does not fit
    `int32`, or no training row is left; `FileNotFoundError` for a missing file.

    ```python
    >>> import numpy as np
    >>> from dew.data import Partition
    >>> data = arrays({"inputs": np.ones((10, 3)), "labels": np.arange(10)}, batch=4,
    ...               val_fraction=0.2)
    >>> batch = data.train.batch_at(0, Partition())
    >>> data.records, batch["inputs"].dtype.name, batch["labels"].shape
    (8, 'float32', (4,))

    ```
    """
    name = "arrays"
    if isinstance(source, Mapping):
        loaded = {}
        for key, value in source.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"{name}: array names must be non-empty strings, got {key!r}.")
            loaded[key] = value if isinstance(value, np.ndarray) else np.asarray(value)
    elif isinstance(source, str | os.PathLike):
        loaded = _loaded(name, source)
    else:
        raise TypeError(
            f"{name}: give a mapping of names to arrays, or the path of an .npz or .npy file; "
            f"got {type(source).__name__}."
        )
    if not loaded:
        raise ValueError(f"{name}: no arrays given; rows need at least one named array.")
    flat = [key for key, value in loaded.items() if value.ndim == 0]
    if flat:
        raise ValueError(f"{name}: array {flat[0]!r} is a scalar; every array needs a row axis.")
    lengths = {key: int(value.shape[0]) for key, value in loaded.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{key} {length}" for key, length in lengths.items())
        raise ValueError(
            f"{name}: the arrays' leading axes differ ({shown}); every array needs one row per "
            "example."
        )
    dtypes = {key: _dtype(f"{name}: array {key!r}", value) for key, value in loaded.items()}
    rows = ArrayRows(loaded, dtypes)
    return indexed_dataset(rows, batch=batch, seed=seed, val_fraction=val_fraction, source=name)
