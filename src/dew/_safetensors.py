"""`.safetensors` files read into NumPy and written from it through the `safetensors` package
(decision 0070).

Reading is what `safetensors.numpy.load` does: `safetensors.deserialize` parses and checks the
file, then each tensor's bytes become an array. The package checks the whole header before it
copies any tensor, as dew's own reader did before it (decision 0032): the header lies inside the
file and within the format's 100 MB, each entry names a known dtype, a shape and two data
offsets whose span is exactly the shape's bytes, the entries, in order of their offsets, cover
the data after the header exactly (no gap, no overlap, nothing past the end), and the metadata
maps names to strings. So the arrays read are exactly the file's data, never more. dew's parts
are the dtypes (the package's NumPy API has no array type for bfloat16 or float8 tensors, which
`ml_dtypes` has) and the one-line errors: a file the package refuses is a `WeightsError` giving
the package's reason. The package is imported on the first file read or written, never when
dew is.
"""

import os
from typing import Any

import ml_dtypes
import numpy as np

from dew._weights import WeightsError, check_shape

__all__ = ["SAFETENSORS_DTYPES", "read_safetensors", "safetensors_bytes"]

SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "C64": np.dtype(np.complex64),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
"""The safetensors dtype codes dew reads, and their NumPy dtypes (the data are little-endian)."""

_PREFIX = "Error while deserializing: "  # how the package begins a refusal


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The tensors of the `.safetensors` file at `path`, by name in the order of their data:
    each array a copy of the file's bytes, bfloat16 and float8 tensors as `ml_dtypes` arrays.

    A file the package refuses, or holding a tensor NumPy cannot (a dtype outside
    `SAFETENSORS_DTYPES`, more than 64 dimensions), raises `WeightsError` saying why.
    """
    from safetensors import SafetensorError, deserialize

    with open(path, "rb") as file:
        data = file.read()
    try:
        tensors = deserialize(data)
    except SafetensorError as error:
        reason = str(error).removeprefix(_PREFIX)
        raise WeightsError(f"the safetensors package refuses it ({reason})") from None
    del data  # each tensor holds a copy of its bytes
    arrays = {}
    for name, tensor in tensors:
        code, shape = tensor["dtype"], tuple(tensor["shape"])
        dtype = SAFETENSORS_DTYPES.get(code)
        if dtype is None:
            allowed = ", ".join(SAFETENSORS_DTYPES)
            raise WeightsError(f"tensor {name!r} has dtype {code}, not one of {allowed}")
        check_shape(name, shape, dtype.itemsize)
        array = np.frombuffer(tensor["data"], dtype).reshape(shape)
        arrays[name] = array if np.little_endian else array.byteswap()
    return arrays


def safetensors_bytes(arrays: dict[str, Any], metadata: dict[str, str]) -> bytes:
    """The `.safetensors` file of `arrays` (by name, each written C-ordered and little-endian)
    and the string `metadata`, as `safetensors.numpy.save` writes it: the header padded with
    spaces to a multiple of 8 bytes, so every tensor's data stays aligned. An array of a dtype
    the format lacks raises `ValueError` naming it."""
    from safetensors import SafetensorError
    from safetensors.numpy import save

    # The package reads each array's buffer as it lies in memory, so every array is C-ordered
    # first (np.ascontiguousarray would make a 0-d array 1-d).
    ordered = {name: np.asarray(array, order="C") for name, array in arrays.items()}
    try:
        return save(ordered, metadata=dict(metadata))
    except SafetensorError as error:
        raise ValueError(f"the safetensors package cannot write these arrays: {error}") from None
