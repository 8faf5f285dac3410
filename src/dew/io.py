"""Weight files read into NumPy without PyTorch: both `.pth` formats and `.safetensors`.

A `.pth` file is a pickle, and unpickling runs whatever callables the file names. Here the
unpickler is allow-listed (the globals PyTorch's own `weights_only` loader allows for plain
tensors, see `ALLOWED_GLOBALS`): a file naming any other global is refused before anything in
it runs. Only the array data of the file is trusted, and every view is checked to lie inside
its storage before it is read.
"""

import collections
import dataclasses
import hashlib
import io
import json
import math
import os
import pathlib
import pickle
import struct
import sys
import zipfile
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "ALLOWED_GLOBALS",
    "check_sha256",
    "load_torch_state_dict",
    "sha256_of",
]

# PyTorch storage type name -> the NumPy dtype of its elements.
_STORAGE_DTYPES: dict[str, np.dtype] = {
    "DoubleStorage": np.dtype(np.float64),
    "FloatStorage": np.dtype(np.float32),
    "HalfStorage": np.dtype(np.float16),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype(np.int64),
    "IntStorage": np.dtype(np.int32),
    "ShortStorage": np.dtype(np.int16),
    "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8),
    "BoolStorage": np.dtype(np.bool_),
    "ComplexFloatStorage": np.dtype(np.complex64),
    "ComplexDoubleStorage": np.dtype(np.complex128),
}

# safetensors dtype code -> NumPy dtype (the data are little-endian).
_SAFETENSORS_DTYPES: dict[str, np.dtype] = {
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

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


class _ReadError(ValueError):
    """A problem found while reading; `load_torch_state_dict` adds the path."""


@dataclasses.dataclass(frozen=True)
class _StorageType:
    """What an allow-listed `torch.<X>Storage` global unpickles to: a name, not a class."""

    name: str


@dataclasses.dataclass(frozen=True)
class _TensorType:
    """What `torch.Tensor` or `torch.nn.parameter.Parameter` unpickles to."""

    name: str


class _Storage:
    """One storage of the file; its bytes arrive when it is read (zip) or after the
    main pickle (legacy stream)."""

    __slots__ = ("data", "dtype", "key", "numel")

    def __init__(self, key: str, dtype: np.dtype, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.data: np.ndarray | None = None


class _Tensor:
    """A strided view of a storage, turned into an array once the storage's bytes are in."""

    __slots__ = ("offset", "shape", "storage", "strides")

    def __init__(self, storage: _Storage, offset: int, shape: tuple, strides: tuple):
        self.storage, self.offset, self.shape, self.strides = storage, offset, shape, strides

    def to_numpy(self) -> np.ndarray:
        storage, offset, shape, strides = self.storage, self.offset, self.shape, self.strides
        data = storage.data
        if data is None:
            raise _ReadError(f"storage {storage.key!r} has no data in the file")
        if math.prod(shape) == 0:
            return np.zeros(shape, data.dtype)
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if last >= data.size:
            raise _ReadError(
                f"a tensor of shape {shape} reaches element {last} of storage "
                f"{storage.key!r}, which holds {data.size}"
            )
        itemsize = data.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            data[offset:], shape=shape, strides=tuple(s * itemsize for s in strides)
        )
        return np.array(view, copy=True, order="C")


def _rebuild_tensor_v2(storage, offset, size, stride, *_rest) -> _Tensor:
    if not isinstance(storage, _Storage):
        raise _ReadError(f"a tensor's storage is a {type(storage).__name__}, not a storage")
    shape, strides = _indices("size", size), _indices("stride", stride)
    if len(shape) != len(strides) or not isinstance(offset, int) or offset < 0:
        raise _ReadError(f"a tensor has size {size!r}, stride {stride!r}, offset {offset!r}")
    return _Tensor(storage, offset, shape, strides)


def _indices(name: str, values: Any) -> tuple[int, ...]:
    if not isinstance(values, tuple | list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise _ReadError(f"a tensor's {name} is {values!r}, not a tuple of non-negative ints")
    return tuple(values)


def _rebuild_parameter(data, *_rest) -> _Tensor:
    if not isinstance(data, _Tensor):
        raise _ReadError(f"a parameter wraps a {type(data).__name__}, not a tensor")
    return data


def _rebuild_from_type_v2(function, new_type, args, _state) -> _Tensor:
    if function not in (_rebuild_tensor_v2, _rebuild_parameter) or not isinstance(
        new_type, _TensorType
    ):
        raise _ReadError(f"a tensor is rebuilt as {new_type!r}, not as a plain tensor")
    return function(*args)


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Tensor"): _TensorType("torch.Tensor"),
    ("torch.nn.parameter", "Parameter"): _TensorType("torch.nn.parameter.Parameter"),
    ("builtins", "set"): set,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "complex"): complex,
    **{("torch", name): _StorageType(name) for name in _STORAGE_DTYPES},
}
"""The only globals a `.pth` file may name, as (module, name), and what each stands for.
Everything else is refused before it runs. The storage types and tensor classes unpickle to
inert markers and the rebuild functions to dew's own, which only record a strided view."""


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, storages: dict[str, _Storage] | None):
        super().__init__(file)
        self._storages = storages
        self.views: dict[str, tuple[_Storage, int]] = {}  # view key -> (root, offset)

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise _ReadError(
                f"it names the global {module}.{name}, which is not allowed in a weights "
                "file (allowed: plain tensors, storages and OrderedDict; see "
                "dew.io.ALLOWED_GLOBALS); nothing in the file was run"
            )
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if self._storages is None or not isinstance(pid, tuple) or len(pid) < 5:
            raise _ReadError(f"unexpected persistent id {pid!r}")
        kind = pid[0].decode("ascii") if isinstance(pid[0], bytes) else pid[0]
        if kind != "storage":
            raise _ReadError(f"it holds a {kind!r} record; only tensor storages are read")
        storage_type, key, _location, numel = pid[1:5]
        if not isinstance(storage_type, _StorageType) or not isinstance(numel, int):
            raise _ReadError(f"unexpected storage record {pid!r}")
        storage = self._storages.get(str(key))
        if storage is None:
            dtype = _STORAGE_DTYPES[storage_type.name]
            storage = self._storages[str(key)] = _Storage(str(key), dtype, numel)
        view = pid[5] if len(pid) > 5 else None
        if view is None:
            return storage
        # Files from torch < 1.0 may share a storage as a slice of a root storage.
        view_key, offset, view_numel = view
        if str(view_key) not in self._storages:
            self._storages[str(view_key)] = _Storage(str(view_key), storage.dtype, view_numel)
            self.views[str(view_key)] = (storage, offset)
        return self._storages[str(view_key)]


def _read_array(file, dtype: np.dtype, count: int, byteorder: str) -> np.ndarray:
    """`count` elements of `dtype` read from `file` into a new array, in the host's order."""
    data = np.empty(count, dtype)
    if file.readinto(memoryview(data.view(np.uint8))) != data.nbytes:
        raise _ReadError("it ends inside a tensor's data: truncated")
    return data.byteswap() if byteorder != sys.byteorder else data


def _read_zip(path: pathlib.Path) -> Any:
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [name for name in names if name.endswith("/data.pkl") or name == "data.pkl"]
        if any(name.endswith("constants.pkl") for name in names):
            raise _ReadError("it is a TorchScript archive, not a saved state dict")
        if len(pickles) != 1:
            raise _ReadError(f"a torch zip archive holds one data.pkl, this one {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = "little"
        if f"{prefix}byteorder" in names:
            byteorder = archive.read(f"{prefix}byteorder").decode("ascii").strip()
        storages: dict[str, _Storage] = {}
        unpickler = _Unpickler(io.BytesIO(archive.read(pickles[0])), storages)
        result = unpickler.load()
        for key, storage in storages.items():
            record = f"{prefix}data/{key}"
            if record not in names:
                raise _ReadError(f"storage {key!r} has no record {record!r}")
            if archive.getinfo(record).file_size < storage.numel * storage.dtype.itemsize:
                raise _ReadError(f"storage {key!r} is shorter than its {storage.numel} elements")
            with archive.open(record) as file:
                storage.data = _read_array(file, storage.dtype, storage.numel, byteorder)
    return result


def _read_legacy(file, size: int) -> Any:
    # Every pickle of the stream goes through the allow-listed unpickler, the headers too.
    if _Unpickler(file, None).load() != _LEGACY_MAGIC:
        raise _ReadError("it starts with a pickle but not with torch's legacy magic number")
    protocol = _Unpickler(file, None).load()
    if protocol != _LEGACY_PROTOCOL:
        raise _ReadError(f"legacy protocol {protocol!r} is not {_LEGACY_PROTOCOL}")
    system = _Unpickler(file, None).load()
    if not isinstance(system, dict) or not system.get("little_endian", True):
        raise _ReadError("it was written on a big-endian machine; only little-endian is read")
    storages: dict[str, _Storage] = {}
    unpickler = _Unpickler(file, storages)
    result = unpickler.load()
    keys = _Unpickler(file, None).load()
    if not isinstance(keys, list):
        raise _ReadError(f"its storage key list is a {type(keys).__name__}")
    for key in keys:
        storage = storages.get(str(key))
        if storage is None:
            raise _ReadError(f"it lists storage {key!r}, which no tensor uses")
        header = file.read(8)
        if len(header) < 8:
            raise _ReadError(f"it ends before storage {key!r}: truncated")
        (numel,) = struct.unpack("<q", header)
        if numel < 0 or numel != storage.numel:
            raise _ReadError(f"storage {key!r} has {numel} elements, expected {storage.numel}")
        if numel * storage.dtype.itemsize > size - file.tell():
            raise _ReadError(f"it ends inside storage {key!r}: truncated")
        storage.data = _read_array(file, storage.dtype, numel, "little")
    for key, (root, offset) in unpickler.views.items():
        view = storages[key]
        if root.data is None or offset + view.numel > root.data.size:
            raise _ReadError(f"storage view {key!r} lies outside storage {root.key!r}")
        view.data = root.data[offset : offset + view.numel]
    return result


def _read_safetensors(file, size: int) -> dict[str, np.ndarray]:
    (header_size,) = struct.unpack("<Q", file.read(8))
    if header_size > min(_SAFETENSORS_MAX_HEADER, size - 8):
        raise _ReadError(f"its header claims {header_size} bytes, past the end: truncated")
    try:
        header = json.loads(file.read(header_size))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _ReadError(f"its safetensors header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise _ReadError("its safetensors header is not a JSON object")
    start, end = 8 + header_size, size
    arrays: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
            shape = tuple(entry["shape"])
            begin, stop = entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            allowed = ", ".join(_SAFETENSORS_DTYPES)
            raise _ReadError(
                f"tensor {name!r} has entry {entry!r} (dtype one of {allowed}, shape, data_offsets)"
            ) from None
        count = math.prod(shape)
        if not 0 <= begin <= stop or stop - begin != count * dtype.itemsize:
            raise _ReadError(f"tensor {name!r} of shape {shape} has offsets {[begin, stop]}")
        if start + stop > end:
            raise _ReadError(f"tensor {name!r} ends past the end of the file: truncated")
        file.seek(start + begin)
        arrays[name] = _read_array(file, dtype, count, "little").reshape(shape)
    return arrays


def _state_dict(loaded: Any) -> dict[str, np.ndarray]:
    if isinstance(loaded, Mapping) and isinstance(loaded.get("state_dict"), Mapping):
        loaded = loaded["state_dict"]  # a training checkpoint
    if not isinstance(loaded, Mapping):
        raise _ReadError(f"it holds a {type(loaded).__name__}, not a state dict")
    others = {key: type(v).__name__ for key, v in loaded.items() if not isinstance(v, _Tensor)}
    if others:
        raise _ReadError(f"it is not a flat state dict of tensors: {others}")
    arrays = {str(key): tensor.to_numpy() for key, tensor in loaded.items()}
    if arrays and all(key.startswith("module.") for key in arrays):  # saved from DataParallel
        arrays = {key[len("module.") :]: value for key, value in arrays.items()}
    return arrays


def load_torch_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read a PyTorch state dict into NumPy arrays, without PyTorch.

    Reads the `torch.save` zip archive (torch >= 1.6), the legacy pickle stream (what
    `torch.save(..., _use_new_zipfile_serialization=False)` and torch < 1.6 write) and
    `.safetensors` files, telling them apart by their contents. bfloat16 and float8 tensors
    come back as `ml_dtypes` arrays; every array is a C-contiguous copy with the tensor's
    shape, bit-identical to what `torch.load` returns. A training checkpoint holding the
    weights under `"state_dict"` is unwrapped, and a `module.` prefix on every key
    (`torch.nn.DataParallel`) is removed.

    The pickle is read by an allow-listed unpickler: a file that names any global outside
    `ALLOWED_GLOBALS` is refused with a `ValueError` naming it, before any of it runs.

    **Arguments:**

    - `path`: the file.

    **Returns:** a dict from parameter name to array, in the file's order.

    **Raises:** `FileNotFoundError` when there is no file at `path`; `ValueError` naming
    the path when it is none of the three formats, is truncated or damaged, names a global
    that is not allowed, or holds something other than a flat mapping of tensors.

    ```python
    >>> import pathlib, struct, tempfile
    >>> header = b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny.safetensors"
    >>> _ = path.write_bytes(struct.pack("<Q", len(header)) + header
    ...                      + struct.pack("<2f", 1.5, -2.0))
    >>> load_torch_state_dict(path)
    {'w': array([ 1.5, -2. ], dtype=float32)}

    ```
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No weights file at {str(path)!r}.")
    size = path.stat().st_size
    try:
        with path.open("rb") as file:
            start = file.read(9)
        if start.startswith(b"PK\x03\x04"):
            if not zipfile.is_zipfile(path):
                raise _ReadError("it is a damaged or truncated zip archive")
            return _state_dict(_read_zip(path))
        if len(start) == 9 and start[8:9] == b"{":  # a JSON header after its length
            with path.open("rb") as file:
                return _read_safetensors(file, size)
        if start[:1] == b"\x80":  # a pickle's PROTO opcode
            with path.open("rb") as file:
                return _state_dict(_read_legacy(file, size))
        raise _ReadError(
            "it is not a torch zip archive, a legacy torch pickle or a safetensors file"
        )
    except _ReadError as error:
        raise ValueError(f"Cannot read weights file {str(path)!r}: {error}.") from None
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, struct.error) as error:
        raise ValueError(
            f"Cannot read weights file {str(path)!r}: it is damaged or truncated ({error})."
        ) from None
    except (TypeError, AttributeError, IndexError, KeyError) as error:
        # An allow-listed callable given arguments it does not take: a malformed file.
        raise ValueError(
            f"Cannot read weights file {str(path)!r}: malformed pickle ({error!r})."
        ) from None


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 digest of the file at `path`, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with pathlib.Path(path).open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: str | os.PathLike[str], prefix: str) -> None:
    """Raise a `ValueError` naming `path` unless its SHA-256 digest starts with `prefix`
    (hex, as in a published file name such as `pt_inception-2015-12-05-6726825d.pth`).

    ```python
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "empty.bin"
    >>> _ = path.write_bytes(b"")
    >>> check_sha256(path, "e3b0c442")  # the digest of no bytes
    >>> check_sha256(path, "6726825d")
    Traceback (most recent call last):
    ...
    ValueError: ... has SHA-256 e3b0c442..., which does not start with '6726825d' ...

    ```
    """
    digest = sha256_of(path)
    if not digest.startswith(prefix.lower()):
        raise ValueError(
            f"The file {str(path)!r} has SHA-256 {digest[:8]}..., which does not start with "
            f"{prefix!r} as the published file does: it is another or a damaged file."
        )
