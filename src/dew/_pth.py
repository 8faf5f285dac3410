"""PyTorch's `.pth` formats read into NumPy without PyTorch: the zip archive `torch.save` writes
(a TorchScript archive too) and the legacy pickle stream.

Their pickles are read by `dew._torch_pickle`, which runs nothing and allocates nothing the
file does not hold. Then, before any tensor data is read, every view must lie inside its
storage, every storage's bytes inside the file, and the arrays the tensors become may hold no
more bytes than the file (`dew._weights.ArrayBudget`). A problem names the tensor it belongs
to.
"""

import io
import math
import struct
import sys
import zipfile
from typing import Any

import numpy as np

from dew._torch_pickle import (
    Bounded,
    ScriptedModule,
    Storage,
    Tensor,
    key_text,
    load_pickle,
    natural,
    scripted_tensors,
    state_dict_tensors,
)
from dew._weights import ArrayBudget, WeightsError, check_shape, shown

__all__ = ["read_legacy", "read_zip"]

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_OVERLAP = (
    "views of one storage that overlap (a stride of 0, or slices sharing elements) would be "
    "copied past what the file holds; save the tensors with .clone() or .contiguous()"
)


def _indices(name: str, field: str, values: Any) -> tuple[int, ...]:
    if not isinstance(values, tuple | list) or len(values) > 64:
        raise WeightsError(f"tensor {name!r} has {field} {shown(values)}, not a tuple of ints")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise WeightsError(f"tensor {name!r} has {field} {shown(values)}, not ints >= 0")
    return tuple(values)


def _check_view(name: str, tensor: Tensor, file_size: int) -> int:
    """Check tensor `name`'s view against its storage's declared elements, and those
    against the file's size; return the view's bytes."""
    storage = tensor.storage
    numel = natural(storage.numel, f"the size of storage {storage.key!r} of tensor {name!r}")
    if numel * storage.dtype.itemsize > file_size:
        raise WeightsError(
            f"storage {storage.key!r} of tensor {name!r} declares {numel:,} {storage.dtype} "
            f"elements ({numel * storage.dtype.itemsize:,} bytes), more than the "
            f"{file_size:,}-byte file holds"
        )
    shape = tensor.shape = _indices(name, "size", tensor.shape)
    strides = tensor.strides = _indices(name, "stride", tensor.strides)
    offset = tensor.offset = natural(tensor.offset, f"the storage offset of tensor {name!r}")
    if len(shape) != len(strides):
        raise WeightsError(f"tensor {name!r} has size {shape} but stride {strides}")
    check_shape(name, shape, storage.dtype.itemsize)
    count = math.prod(shape)
    if count:
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if last >= numel:
            raise WeightsError(
                f"tensor {name!r} of shape {shape} reaches element {last} of storage "
                f"{storage.key!r}, which holds {numel}"
            )
    return count * storage.dtype.itemsize


def _check(tensors: dict[str, Tensor], file_size: int) -> dict[int, str]:
    """Check every view before anything is read; return each storage the tensors use (by
    id) with the first tensor using it. Views that are the same (tied weights) become one
    array; the others together may hold no more bytes than the file."""
    budget, seen, users = ArrayBudget(file_size), set(), {}
    for name, tensor in tensors.items():
        nbytes = _check_view(name, tensor, file_size)
        storage = tensor.storage
        root = storage.root[0] if storage.root is not None else storage
        users.setdefault(id(root), name)
        if storage.root is not None:
            _check_slice(name, storage)
        same = (id(storage), tensor.offset, tensor.shape, tensor.strides)
        if same not in seen:
            seen.add(same)
            budget.charge(name, tensor.shape, nbytes, _OVERLAP)
    return users


def _check_slice(name: str, view: Storage) -> None:
    root, offset = view.root
    numel = natural(root.numel, f"the size of storage {root.key!r} of tensor {name!r}")
    if offset + view.numel > numel:
        raise WeightsError(
            f"storage view {view.key!r} of tensor {name!r} (elements {offset} to "
            f"{offset + view.numel}) lies outside storage {root.key!r} of {numel}"
        )


def _arrays(tensors: dict[str, Tensor]) -> dict[str, np.ndarray]:
    """Each tensor as a C-contiguous copy of its view; the same view (tied weights) as one
    array under each of its names, as `torch.load` shares them."""
    made: dict[tuple, np.ndarray] = {}
    arrays = {}
    for name, tensor in tensors.items():
        storage = tensor.storage
        data = storage.data
        if storage.root is not None:
            root, offset = storage.root
            data = root.data[offset : offset + storage.numel]
        if data is None:
            raise WeightsError(
                f"tensor {name!r} has no data: its storage {storage.key!r} was not read"
            )
        same = (id(storage), tensor.offset, tensor.shape, tensor.strides)
        if same not in made:
            made[same] = _copy(data, tensor)
        arrays[name] = made[same]
    if arrays and all(key.startswith("module.") for key in arrays):  # saved from DataParallel
        arrays = {key[len("module.") :]: value for key, value in arrays.items()}
    return arrays


def _copy(data: np.ndarray, tensor: Tensor) -> np.ndarray:
    if math.prod(tensor.shape) == 0:
        return np.zeros(tensor.shape, data.dtype)
    itemsize = data.dtype.itemsize
    # A dimension of size 1 moves nowhere: its stride (any value) is left out.
    strides = tuple(
        s * itemsize if n > 1 else 0 for n, s in zip(tensor.shape, tensor.strides, strict=True)
    )
    view = np.lib.stride_tricks.as_strided(data[tensor.offset :], tensor.shape, strides)
    return np.array(view, copy=True, order="C")


def _read_array(file, dtype: np.dtype, count: int, byteorder: str) -> np.ndarray:
    """`count` elements of `dtype` read from `file` into a new array, in the host's order."""
    data = np.empty(count, dtype)
    if file.readinto(data.view(np.uint8).data) != data.nbytes:
        raise WeightsError("it ends inside a tensor's data: truncated")
    return data.byteswap() if byteorder != sys.byteorder else data


def _record(archive: zipfile.ZipFile, name: str, file_size: int, what: str) -> zipfile.ZipInfo:
    """The archive's record `name`, checked to be readable and no larger than the file."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise WeightsError(f"{what} has no record {name!r} in the archive") from None
    if info.flag_bits & 0x1:
        raise WeightsError(f"{what}'s record {name!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise WeightsError(
            f"{what}'s record {name!r} uses zip compression method {info.compress_type}; torch "
            "writes records stored (method 0)"
        )
    if info.file_size > file_size:
        raise WeightsError(
            f"{what}'s record {name!r} unpacks to {info.file_size:,} bytes, more than the "
            f"{file_size:,}-byte file holds"
        )
    return info


def read_zip(path: Any, file_size: int) -> dict[str, np.ndarray]:
    """The state dict of a torch zip archive (or TorchScript archive) at `path`."""
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [name for name in names if name.endswith("/data.pkl") or name == "data.pkl"]
        scripted = any(name.endswith("constants.pkl") for name in names)
        if len(pickles) != 1:
            raise WeightsError(f"a torch zip archive holds one data.pkl, this one {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = "little"
        if f"{prefix}byteorder" in names:
            _record(archive, f"{prefix}byteorder", file_size, "the archive")
            byteorder = archive.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
            if byteorder not in ("little", "big"):
                raise WeightsError(f"its byteorder record says {shown(byteorder)}")
        _record(archive, pickles[0], file_size, "the archive")
        storages: dict[str, Storage] = {}
        loaded = load_pickle(io.BytesIO(archive.read(pickles[0])), storages, scripted=scripted)
        if scripted:
            if not isinstance(loaded, ScriptedModule):
                raise WeightsError("its TorchScript data.pkl does not hold a module")
            loaded = dict(scripted_tensors(loaded))
        tensors = state_dict_tensors(loaded)
        users = _check(tensors, file_size)
        read = 0
        for storage in storages.values():
            name = users.get(id(storage))
            if name is None or storage.root is not None:
                continue  # a storage no tensor uses is never read
            what = f"storage {storage.key!r} of tensor {name!r}"
            info = _record(archive, f"{prefix}data/{storage.key}", file_size, what)
            nbytes = storage.numel * storage.dtype.itemsize
            if info.file_size < nbytes:
                raise WeightsError(
                    f"{what} is shorter than its {storage.numel} elements ({nbytes:,} bytes): "
                    f"its record holds {info.file_size:,}"
                )
            read += nbytes
            if read > file_size:
                raise WeightsError(
                    f"{what} brings the storages past the file's {file_size:,} bytes"
                )
            with archive.open(info) as record:
                storage.data = _read_array(record, storage.dtype, storage.numel, byteorder)
        return _arrays(tensors)


def read_legacy(file, file_size: int) -> dict[str, np.ndarray]:
    """The state dict of a legacy torch pickle stream (`file` open at its start)."""
    stream = Bounded(file, file_size)
    # Every pickle of the stream goes through the allow-listed unpickler, the headers too.
    if load_pickle(stream, None) != _LEGACY_MAGIC:
        raise WeightsError("it starts with a pickle but not with torch's legacy magic number")
    protocol = load_pickle(stream, None)
    if protocol != _LEGACY_PROTOCOL:
        raise WeightsError(f"legacy protocol {shown(protocol)} is not {_LEGACY_PROTOCOL}")
    system = load_pickle(stream, None)
    if not isinstance(system, dict) or not system.get("little_endian", True):
        raise WeightsError("it was written on a big-endian machine; only little-endian is read")
    storages: dict[str, Storage] = {}
    loaded = load_pickle(stream, storages)
    keys = load_pickle(stream, None)
    if not isinstance(keys, list):
        raise WeightsError(f"its storage key list is a {type(keys).__name__}")
    tensors = state_dict_tensors(loaded)
    users = _check(tensors, file_size)
    positions = {}  # each storage's data, which follows its element count
    for key in keys:
        key = key_text(key, "a listed storage key")
        storage = storages.get(key)
        if storage is None or key in positions:
            raise WeightsError(f"it lists storage {key!r}, which no tensor uses or twice")
        what = f"storage {key!r}" + (
            f" of tensor {users[id(storage)]!r}" if id(storage) in users else ""
        )
        header = file.read(8)
        if len(header) < 8:
            raise WeightsError(f"it ends before {what}: truncated")
        (numel,) = struct.unpack("<q", header)
        if numel != storage.numel:
            raise WeightsError(
                f"{what} holds {numel} elements, but its record declares {storage.numel}"
            )
        nbytes = numel * storage.dtype.itemsize
        if nbytes > file_size - file.tell():
            raise WeightsError(f"it ends inside {what}: truncated")
        positions[key] = file.tell()
        file.seek(nbytes, io.SEEK_CUR)
    for storage in storages.values():
        name = users.get(id(storage))
        if name is None or storage.root is not None:
            continue
        if storage.key not in positions:
            raise WeightsError(
                f"storage {storage.key!r} of tensor {name!r} has no data in the file"
            )
        file.seek(positions[storage.key])
        storage.data = _read_array(file, storage.dtype, storage.numel, "little")
    return _arrays(tensors)
