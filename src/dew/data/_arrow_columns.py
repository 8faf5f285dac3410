"""Columns of a Hugging Face dataset as `Rows`: which columns can be batch arrays (checked once,
vectorised, on the Arrow table), and the rows read by index through `datasets`' own access."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.data._arrays import target_dtype
from dew.data._indexed import fingerprint_of
from dew.data._optional import optional

__all__ = ["ColumnRows", "column_dtype", "text_column"]


def _arrow(owner: str) -> tuple[Any, Any]:
    return optional("pyarrow", "hf", owner), optional("pyarrow.compute", "hf", owner)


def _feature_name(feature: Any) -> str:
    return f"datasets.{type(feature).__name__}" if feature is not None else "an Arrow column"


def _first_null(pc: Any, array: Any) -> int:
    return int(pc.index(pc.is_null(array), True).as_py())


def _no_nulls(owner: str, name: str, array: Any, pc: Any, depth: int) -> None:
    if array.null_count:
        where = f"at row {_first_null(pc, array)}" if depth == 0 else "inside its lists"
        raise ValueError(
            f"{owner}: column {name!r} holds a null {where}; a batch array has a value at "
            "every position."
        )


def _values(owner: str, name: str, array: Any, pa: Any, pc: Any) -> tuple[Any, tuple[int, ...]]:
    """The column's innermost values (flattened through its list levels) and the shape of one
    row (`()` for a scalar column), where every row has that shape; else a `ValueError`."""
    shape: list[int] = []
    while True:
        kind = array.type
        if isinstance(kind, pa.ExtensionType):  # datasets' Array2D ... Array5D: fixed lists
            array = pa.chunked_array([chunk.storage for chunk in array.chunks], kind.storage_type)
            continue
        _no_nulls(owner, name, array, pc, len(shape))
        if not (
            pa.types.is_list(kind)
            or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)
        ):
            return array, tuple(shape)
        lengths = pc.list_value_length(array)
        low, high = (value.as_py() for value in pc.min_max(lengths).values())
        if low != high:
            short, long = (int(pc.index(lengths, value).as_py()) for value in (low, high))
            where = f"rows {short} and {long}" if not shape else f"lists at depth {len(shape)}"
            raise ValueError(
                f"{owner}: column {name!r} holds lists of different lengths ({where} hold "
                f"{low} and {high} items); a batch array needs one length: pad or cut them "
                "first (dataset.map)."
            )
        shape.append(int(low or 0))
        array = pc.list_flatten(array)


def column_dtype(owner: str, name: str, array: Any, feature: Any) -> tuple[np.dtype, tuple]:
    """The NumPy dtype a column's rows are read in and one row's shape, checked on its Arrow
    data: numbers or booleans (in lists of one length at every level), no nulls, 64-bit
    integers within 32 bits.

    **Raises:** `ValueError` naming the column: strings (with the way to train on text),
    images or other values that are no numbers, a null, lists of different lengths, an
    integer outside the 32-bit range.
    """
    pa, pc = _arrow(owner)
    kind = type(feature).__name__ if feature is not None else ""
    if kind in ("Image", "Audio", "Video", "Pdf"):
        raise ValueError(
            f"{owner}: column {name!r} holds {_feature_name(feature)} values, which "
            f"dew.data.huggingface does not decode; map them to arrays first (dataset.map), or "
            "write images into class folders for dew.data.image_folder."
        )
    values, shape = _values(owner, name, array, pa, pc)
    value_type = values.type
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        raise ValueError(
            f"{owner}: column {name!r} holds strings, and batches hold numbers; to train a "
            f"language model on it pass text_column={name!r} (with seq_len=), or map it to "
            "numbers first (dataset.map)."
        )
    if not (
        pa.types.is_integer(value_type)
        or pa.types.is_floating(value_type)
        or pa.types.is_boolean(value_type)
    ):
        raise ValueError(
            f"{owner}: column {name!r} holds {value_type} values ({_feature_name(feature)}); "
            "batches hold numbers or booleans: map it to numbers first (dataset.map)."
        )
    dtype = np.dtype(value_type.to_pandas_dtype())
    target = target_dtype(dtype)  # 64-bit read as JAX's 32-bit kin, values checked to fit
    if target.kind in "iu" and target != dtype and len(values):
        info = np.iinfo(target)
        low, high = (value.as_py() for value in pc.min_max(values).values())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise ValueError(
                f"{owner}: column {name!r} holds {bad}, outside {target} ([{info.min}, "
                f"{info.max}]), the type JAX holds {dtype} in without jax_enable_x64; rescale "
                "it, or enable x64."
            )
    return target, shape


def text_column(owner: str, name: str, array: Any, feature: Any) -> None:
    """Check that a column holds one string a row (no nulls), for `text_column=`."""
    pa, pc = _arrow(owner)
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise ValueError(
            f"{owner}: text_column {name!r} holds {array.type} values ({_feature_name(feature)}), "
            "not strings."
        )
    if array.null_count:
        raise ValueError(
            f"{owner}: text_column {name!r} holds a null at row {_first_null(pc, array)}, not a "
            "string."
        )


class ColumnRows:
    """`Rows` of chosen columns of a `datasets.Dataset`: `read(indices)` is `datasets`' own
    `dataset[indices]` in its NumPy format (one vectorised call a batch), each batch key its
    column's values in the checked dtype (`column_dtype`).

    **Arguments:** `dataset`, a `datasets.Dataset`; `columns`, `{batch key: column}`; `dtypes`,
    `{batch key: dtype}`; `fingerprint`, the rows' (changing whenever the rows could).
    """

    def __init__(
        self,
        dataset: Any,
        columns: Mapping[str, str],
        dtypes: Mapping[str, np.dtype],
        fingerprint: str,
    ) -> None:
        chosen = list(dict.fromkeys(columns.values()))
        self.dataset = dataset.select_columns(chosen).with_format("numpy")
        self.columns, self.dtypes = dict(columns), dict(dtypes)
        self.fingerprint = fingerprint_of(
            "huggingface columns", fingerprint, sorted(columns.items())
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        found = self.dataset[np.asarray(indices, np.int64).reshape(-1)]
        return {
            key: np.asarray(found[column], self.dtypes[key]) for key, column in self.columns.items()
        }

    def __repr__(self) -> str:
        shown = ", ".join(f"{key}: {column!r}" for key, column in self.columns.items())
        return f"ColumnRows({len(self)} rows; {shown})"
