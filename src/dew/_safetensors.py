"""`.safetensors` files read into NumPy and written from it: an 8-byte header length, a JSON
header, then the tensors' bytes.

The header is checked as the `safetensors` package's own reader checks it, before anything is
allocated: the header lies inside the file, each entry names a known dtype, a shape and two data
offsets whose span is exactly the shape's bytes, and the entries, in order of their offsets,
cover the data after the header exactly, with no gap, no overlap and nothing past the end. So
the arrays read are exactly the file's data, never more.
"""

import json
import math
import struct
from typing import Any

import ml_dtypes
import numpy as np

from dew import _json
from dew._weights import WeightsError, check_shape, shown

__all__ = ["SAFETENSORS_DTYPES", "read_safetensors", "safetensors_bytes"]

SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
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

_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, entry: Any) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """One header entry's dtype, shape and data offsets, each checked."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise WeightsError(
            f"tensor {name!r} has the entry {shown(entry)}, not "
            '{"dtype": ..., "shape": [...], "data_offsets": [begin, end]}'
        )
    code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        allowed = ", ".join(SAFETENSORS_DTYPES)
        raise WeightsError(f"tensor {name!r} has dtype {shown(code)}, not one of {allowed}")
    dtype = SAFETENSORS_DTYPES[code]
    if not isinstance(shape, list) or not all(map(_natural, shape)):
        raise WeightsError(f"tensor {name!r} has shape {shown(shape)}, not a list of ints >= 0")
    check_shape(name, tuple(shape), dtype.itemsize)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_natural, offsets)):
        raise WeightsError(
            f"tensor {name!r} has data_offsets {shown(offsets)}, not [begin, end] of ints >= 0"
        )
    begin, end = offsets
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
        raise WeightsError(
            f"tensor {name!r} of dtype {code} and shape {shown(shape)} holds {nbytes:,} bytes, "
            f"but its data_offsets [{begin}, {end}] span {end - begin:,}"
        )
    return dtype, tuple(shape), begin, end


def _header(file, file_size: int) -> tuple[int, dict[str, Any]]:
    """The header's length and its tensors' entries (the metadata checked and left out)."""
    start = file.read(8)
    if len(start) < 8:
        raise WeightsError(f"it holds {len(start)} bytes, fewer than a header length: truncated")
    (length,) = struct.unpack("<Q", start)
    if length > _MAX_HEADER:
        raise WeightsError(
            f"its header length {length:,} is past the format's limit of {_MAX_HEADER:,} bytes"
        )
    if 8 + length > file_size:
        raise WeightsError(
            f"its header length {length:,} reaches past the end of the {file_size:,}-byte "
            "file: truncated"
        )
    try:
        header = _json.loads(file.read(length), "its header", "JSON")
    except ValueError as error:
        raise WeightsError(str(error).rstrip(".")) from None
    if not isinstance(header, dict):
        raise WeightsError(f"its header holds a {type(header).__name__}, not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise WeightsError(f"its __metadata__ is {shown(metadata)}, not strings by name")
    return length, header


def read_safetensors(file, file_size: int) -> dict[str, np.ndarray]:
    """The tensors of the `.safetensors` file `file` (open at its start, `file_size` bytes
    long), by name in the header's order."""
    length, header = _header(file, file_size)
    data_size = file_size - 8 - length
    entries = {name: _entry(name, entry) for name, entry in header.items()}
    covered, last = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if end > data_size:
            raise WeightsError(
                f"tensor {name!r} ends at byte {end:,} of the data, past the {data_size:,} "
                "bytes after the header: truncated"
            )
        if begin != covered:
            relation = f"overlaps tensor {last!r}" if begin < covered else "leaves a gap after"
            if begin > covered:
                relation += f" byte {covered:,}" if last is None else f" tensor {last!r}"
            raise WeightsError(
                f"tensor {name!r} (data_offsets [{begin}, {end}]) {relation}; a file's tensors "
                "cover its data once, in order"
            )
        covered, last = end, name
    if covered != data_size:
        raise WeightsError(
            f"its tensors cover {covered:,} of the {data_size:,} bytes after the header; the "
            "rest belongs to no tensor"
        )
    arrays = {}
    for name, (dtype, shape, begin, end) in entries.items():
        file.seek(8 + length + begin)
        array = np.empty(shape, dtype)
        if file.readinto(memoryview(array.reshape(-1).view(np.uint8))) != end - begin:
            raise WeightsError(f"it ends inside tensor {name!r}: truncated")
        arrays[name] = array if np.little_endian else array.byteswap()
    return arrays


def safetensors_bytes(arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """The `.safetensors` file of `arrays` (by name, in this order, each little-endian and
    C-ordered) and the string `metadata`: the header padded with spaces to a multiple of 8
    bytes, as the `safetensors` package writes it, so every tensor's data stays aligned."""
    codes = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    chunks, offset = [], 0
    for name, array in arrays.items():
        array = np.asarray(array, order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
        dtype = array.dtype.newbyteorder("=")
        if dtype not in codes:
            raise ValueError(f"tensor {name!r} has dtype {array.dtype}, which safetensors lacks")
        data = array.astype(dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": codes[dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)
