"""What a `.pth` file's pickle holds, read without running it: PyTorch's storage and tensor
records unpickled by an allow-listed unpickler.

A `.pth` file is a pickle, and unpickling runs whatever callables the file names. Here the
unpickler is allow-listed (the globals PyTorch's own `weights_only` loader allows for plain
tensors, see `ALLOWED_GLOBALS`): a file naming any other global is refused before anything in
it runs. Each pickle's opcodes are scanned before it is unpickled (a memo index past the
pickle's own length, which would size the unpickler's memo, is refused), and unpickling only
records storages (`Storage`) and strided views of them (`Tensor`), allocating nothing the file
does not hold; `dew._pth` checks them against the file before reading any data.
"""

import collections
import dataclasses
import pickle
import pickletools
from collections.abc import Iterator, Mapping
from typing import Any

import ml_dtypes
import numpy as np

from dew._weights import WeightsError, shown

__all__ = [
    "ALLOWED_GLOBALS",
    "STORAGE_DTYPES",
    "TORCHSCRIPT_GLOBALS",
    "Bounded",
    "ScriptedModule",
    "Storage",
    "Tensor",
    "key_text",
    "load_pickle",
    "natural",
    "scripted_tensors",
    "state_dict_tensors",
]

# PyTorch storage type name -> the NumPy dtype of its elements.
STORAGE_DTYPES: dict[str, np.dtype] = {
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

_MEMO_OPCODES = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_PICKLE_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
)


@dataclasses.dataclass(frozen=True)
class StorageType:
    """What an allow-listed `torch.<X>Storage` global unpickles to: a name, not a class."""

    name: str


@dataclasses.dataclass(frozen=True)
class TensorType:
    """What `torch.Tensor` or `torch.nn.parameter.Parameter` unpickles to."""

    name: str


class Storage:
    """One storage record of the file: its key, dtype and declared element count, and its
    elements once read (a legacy view storage: a slice of its root's)."""

    __slots__ = ("data", "dtype", "key", "numel", "root")

    def __init__(self, key: str, dtype: np.dtype, numel: Any, root: Any = None):
        self.key, self.dtype, self.numel, self.root = key, dtype, numel, root
        self.data: np.ndarray | None = None


class Tensor:
    """A strided view of a storage as the pickle gives it; checked by `_check_view` once
    its name is known."""

    __slots__ = ("offset", "shape", "storage", "strides")

    def __init__(self, storage: Storage, offset: Any, shape: Any, strides: Any):
        self.storage, self.offset, self.shape, self.strides = storage, offset, shape, strides


def _rebuild_tensor_v2(storage, offset, size, stride, *_rest) -> Tensor:
    if not isinstance(storage, Storage):
        raise WeightsError(f"a tensor's storage is a {type(storage).__name__}, not a storage")
    return Tensor(storage, offset, size, stride)


def _rebuild_parameter(data, *_rest) -> Tensor:
    if not isinstance(data, Tensor):
        raise WeightsError(f"a parameter wraps a {type(data).__name__}, not a tensor")
    return data


def _rebuild_from_type_v2(function, new_type, args, _state) -> Tensor:
    if function not in (_rebuild_tensor_v2, _rebuild_parameter) or not isinstance(
        new_type, TensorType
    ):
        raise WeightsError(f"a tensor is rebuilt as {shown(new_type)}, not as a plain tensor")
    return function(*args)


def _bytearray(*args: Any) -> bytearray:
    """`bytearray` of bytes or a list of them, never of a size: a pickle must not choose
    how much memory its reader allocates."""
    if args and not isinstance(args[0], bytes | bytearray | list | tuple):
        raise WeightsError(f"it builds a bytearray from {shown(args[0])}, not from bytes")
    return bytearray(*args[:1])


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Tensor"): TensorType("torch.Tensor"),
    ("torch.nn.parameter", "Parameter"): TensorType("torch.nn.parameter.Parameter"),
    ("builtins", "set"): set,
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "complex"): complex,
    **{("torch", name): StorageType(name) for name in STORAGE_DTYPES},
}
"""The only globals a `.pth` file may name, as (module, name), and what each stands for.
Everything else is refused before it runs. The storage types and tensor classes unpickle to
inert markers and the rebuild functions to dew's own, which only record a strided view."""


class ScriptedModule:
    """What a TorchScript module class (`__torch__.<path> <Name>`) unpickles to: an inert
    object that keeps the attribute dict it is built with and runs none of the module's code."""

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise WeightsError(f"a scripted module's state is a {type(state).__name__}")
        self.__dict__["attributes"] = state


def _build_list(values: Any) -> list:
    if not isinstance(values, list | tuple):
        raise WeightsError(f"a TorchScript list is built from a {type(values).__name__}")
    return list(values)


TORCHSCRIPT_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch.jit._pickle", "build_intlist"): _build_list,
    ("torch.jit._pickle", "build_doublelist"): _build_list,
    ("torch.jit._pickle", "build_boollist"): _build_list,
}
"""Globals a TorchScript archive's `data.pkl` may name besides `ALLOWED_GLOBALS`: the list
builders, and any class under `__torch__`, which becomes an inert attribute holder."""


def key_text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise WeightsError(f"{what} is {shown(value)}, not a string")


def natural(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WeightsError(f"{what} is {shown(value)}, not an integer >= 0")
    return value


class Unpickler(pickle.Unpickler):
    def __init__(self, file, storages: dict[str, Storage] | None, *, scripted: bool = False):
        super().__init__(file)
        self._storages = storages
        self._scripted = scripted

    def find_class(self, module: str, name: str) -> Any:
        if self._scripted:
            if module.startswith("__torch__.") or module == "__torch__":
                return type(name, (ScriptedModule,), {"__module__": "dew.io.scripted"})
            if (module, name) in TORCHSCRIPT_GLOBALS:
                return TORCHSCRIPT_GLOBALS[module, name]
        found = ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise WeightsError(
                f"it names the global {module}.{name}, which is not allowed in a weights "
                "file (allowed: plain tensors, storages and OrderedDict; see "
                "dew.io.ALLOWED_GLOBALS); nothing in the file was run"
            )
        return found

    def persistent_load(self, pid: Any) -> Storage:
        if self._storages is None or not isinstance(pid, tuple) or len(pid) not in (5, 6):
            raise WeightsError(f"it holds the persistent id {shown(pid)}, not a storage record")
        if pid[0] not in ("storage", b"storage"):
            raise WeightsError(f"it holds a {shown(pid[0])} record; only storages are read")
        storage_type, key, _location, numel = pid[1:5]
        key = key_text(key, "a storage's key")
        if not isinstance(storage_type, StorageType):
            raise WeightsError(f"storage {key!r} has type {shown(storage_type)}")
        storage = self._declare(key, STORAGE_DTYPES[storage_type.name], numel)
        view = pid[5] if len(pid) == 6 else None
        if view is None:
            return storage
        # Files from torch < 1.0 may share a storage as a slice of a root storage.
        if not isinstance(view, tuple) or len(view) != 3:
            raise WeightsError(f"storage {key!r} has the view {shown(view)}")
        view_key = key_text(view[0], f"storage {key!r}'s view key")
        offset = natural(view[1], f"storage view {view_key!r}'s offset")
        return self._declare(view_key, storage.dtype, view[2], root=(storage, offset))

    def _declare(self, key: str, dtype: np.dtype, numel: Any, root: Any = None) -> Storage:
        storage = self._storages.get(key)  # type: ignore[union-attr]
        if storage is None:
            storage = self._storages[key] = Storage(key, dtype, numel, root)  # type: ignore[index]
        elif (storage.dtype, storage.numel) != (dtype, numel):
            raise WeightsError(
                f"storage {key!r} is declared twice, as {storage.numel!r} {storage.dtype} "
                f"elements and as {shown(numel)} {dtype}"
            )
        return storage


class Bounded:
    """A file read no further than `end`: a read asks for no more than what is left, so a
    length a pickle declares never sizes a buffer past the file. It counts its position
    itself (the unpickler reads an opcode at a time); read the file only through it."""

    def __init__(self, file, end: int):
        self._file, self._end, self._position = file, end, file.tell()

    def read(self, size: int = -1) -> bytes:
        left = max(self._end - self._position, 0)
        data = self._file.read(left if size is None or size < 0 else min(size, left))
        self._position += len(data)
        return data

    def readline(self) -> bytes:
        data = self._file.readline(max(self._end - self._position, 0))
        self._position += len(data)
        return data

    def tell(self) -> int:
        return self._position

    def seek(self, position: int) -> int:
        self._position = self._file.seek(position)
        return self._position


def load_pickle(file, storages: dict[str, Storage] | None, *, scripted: bool = False) -> Any:
    """Unpickle one pickle of `file` (a `Bounded` file or a `BytesIO`), its opcodes scanned
    first: a memo index may not exceed the opcodes before it."""
    start = file.tell()
    try:
        for before, (opcode, argument, _) in enumerate(pickletools.genops(file)):
            if opcode.name in _MEMO_OPCODES and isinstance(argument, int) and argument > before:
                raise WeightsError(
                    f"its pickle stores memo entry {argument} after {before} opcodes (a pickler "
                    "numbers them from 0); nothing was unpickled"
                )
        file.seek(start)
        return Unpickler(file, storages, scripted=scripted).load()
    except WeightsError:
        raise
    except _PICKLE_ERRORS as error:
        # genops and the unpickler on a damaged pickle; allow-listed callables given
        # arguments they do not take (a malformed file).
        raise WeightsError(
            f"its pickle is damaged, truncated or malformed ({shown(error)})"
        ) from None


def state_dict_tensors(loaded: Any) -> dict[str, Tensor]:
    """The state dict a pickle holds (a training checkpoint's `"state_dict"` unwrapped)."""
    if isinstance(loaded, Mapping) and isinstance(loaded.get("state_dict"), Mapping):
        loaded = loaded["state_dict"]  # a training checkpoint
    if not isinstance(loaded, Mapping):
        raise WeightsError(f"it holds a {type(loaded).__name__}, not a state dict")
    others = {
        shown(key): type(value).__name__
        for key, value in loaded.items()
        if not isinstance(value, Tensor)
    }
    if others:
        shown_others = ", ".join(f"{key}: {kind!r}" for key, kind in list(others.items())[:6])
        raise WeightsError(f"it is not a flat state dict of tensors: {{{shown_others}}}")
    return {key_text(key, "a state dict's key"): tensor for key, tensor in loaded.items()}


def scripted_tensors(module: ScriptedModule, prefix: str = "", depth: int = 0) -> Iterator:
    """The parameters and buffers of a scripted module and its submodules, under the dotted
    names `state_dict()` gives them; other attributes (flags, numbers) are left out."""
    if depth > 100:
        raise WeightsError("its scripted modules nest more than 100 deep")
    for name, value in module.__dict__.get("attributes", {}).items():
        if isinstance(value, Tensor):
            yield f"{prefix}{key_text(name, 'an attribute name')}", value
        elif isinstance(value, ScriptedModule):
            yield from scripted_tensors(value, f"{prefix}{name}.", depth + 1)
