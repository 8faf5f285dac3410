"""Weight files read into NumPy without PyTorch: both `.pth` formats and `.safetensors`.

A `.pth` file is a pickle, and unpickling runs whatever callables the file names. Here the
unpickler is allow-listed (the globals PyTorch's own `weights_only` loader allows for plain
tensors, see `ALLOWED_GLOBALS`): a file naming any other global is refused before anything in
it runs. Nothing else in a file is trusted either: every storage's size and every view's bounds
are checked against the file before anything is allocated, so the arrays read from a file never
hold more bytes than the file (`dew._pth`, `dew._safetensors`).
"""

import hashlib
import os
import pathlib
import pickle
import struct
import zipfile
import zlib

import numpy as np

from dew._pth import read_legacy, read_zip
from dew._safetensors import read_safetensors
from dew._torch_pickle import ALLOWED_GLOBALS, TORCHSCRIPT_GLOBALS
from dew._weights import WeightsError

__all__ = [
    "ALLOWED_GLOBALS",
    "TORCHSCRIPT_GLOBALS",
    "check_sha256",
    "load_torch_state_dict",
    "sha256_of",
]

_ZIP = "a torch zip archive"
_LEGACY = "a legacy torch pickle"
_SAFETENSORS = "safetensors"


def _format(path: pathlib.Path, start: bytes) -> str | None:
    """The format of the file at `path` beginning with `start`: by its suffix for
    `.safetensors`, else by its contents; `None` when it is none of the three."""
    if path.suffix == ".safetensors" or (len(start) == 9 and start[8:9] == b"{"):
        return _SAFETENSORS  # a JSON header after its length
    if start.startswith(b"PK\x03\x04"):
        return _ZIP
    if start[:1] == b"\x80":  # a pickle's PROTO opcode
        return _LEGACY
    return None


def load_torch_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read a PyTorch state dict into NumPy arrays, without PyTorch.

    Reads the `torch.save` zip archive (torch >= 1.6), the legacy pickle stream (what
    `torch.save(..., _use_new_zipfile_serialization=False)` and torch < 1.6 write) and
    `.safetensors` files, telling them apart by their contents (a file named `*.safetensors`
    is read as one). bfloat16 and float8 tensors come back as `ml_dtypes` arrays; every array
    is a C-contiguous copy with the tensor's shape, bit-identical to what `torch.load`
    returns. A training checkpoint holding the
    weights under `"state_dict"` is unwrapped, and a `module.` prefix on every key
    (`torch.nn.DataParallel`) is removed. A TorchScript archive (`torch.jit.save`, the format
    of OpenAI's CLIP `.pt` files) gives its modules' parameters and buffers under their
    `state_dict()` names; none of its code runs.

    The pickle is read by an allow-listed unpickler: a file that names any global outside
    `ALLOWED_GLOBALS` is refused with a `ValueError` naming it, before any of it runs. In a
    TorchScript archive, `TORCHSCRIPT_GLOBALS` are allowed too, and its module classes
    (`__torch__.*`) unpickle to inert objects that only hold their attributes.

    Nothing in the file is trusted: every storage's size and every view's bounds are checked
    against the file before anything is allocated, and the arrays read may hold no more bytes
    than the file, so a small file cannot ask for a large allocation. Tensors that are the
    same view of one storage (tied weights) come back as one array under each name, as
    `torch.load` shares them.

    **Arguments:**

    - `path`: the file.

    **Returns:** a dict from parameter name to array, in the file's order.

    **Raises:** `FileNotFoundError` when there is no file at `path`; `ValueError`, one line
    naming the path, the format read and the tensor at fault, when the file is none of the
    three formats, is truncated or damaged, names a global that is not allowed, holds
    something other than a flat mapping of tensors, or asks for more than it holds (a
    storage or view past its data, overlapping `.safetensors` entries).

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
    with path.open("rb") as file:
        kind = _format(path, file.read(9))
    if kind is None:
        raise ValueError(
            f"Cannot read weights file {str(path)!r}: it is not a torch zip archive (a state "
            "dict or TorchScript), a legacy torch pickle or a safetensors file."
        )
    try:
        if kind == _ZIP:
            if not zipfile.is_zipfile(path):
                raise WeightsError("it is a damaged or truncated zip archive")
            return read_zip(path, size)
        if kind == _SAFETENSORS:
            return read_safetensors(path)
        with path.open("rb") as file:
            return read_legacy(file, size)
    except WeightsError as error:
        raise ValueError(f"Cannot read weights file {str(path)!r} as {kind}: {error}.") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
        struct.error,
    ) as error:
        raise ValueError(
            f"Cannot read weights file {str(path)!r} as {kind}: it is damaged or truncated "
            f"({error})."
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
