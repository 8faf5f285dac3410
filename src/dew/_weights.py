"""What the weights-file readers share: the error a reader raises (`dew.io` adds the file and
the format), a short repr for its messages, and the checks of a tensor's shape against NumPy's
limits and of the bytes a file's arrays may take.

A weights file is read as data to check, never trusted: the bytes a reader allocates for its
tensors are checked against the file's size before any is allocated, so a small file cannot ask
for a large allocation.
"""

import math
import reprlib
from typing import Any

import numpy as np

__all__ = ["MAX_DIMS", "ArrayBudget", "WeightsError", "check_shape", "shown"]

MAX_DIMS = 64
"""The most dimensions a NumPy array has (NumPy 2's `NPY_MAXDIMS`)."""

_INTP_MAX = np.iinfo(np.intp).max


class _Short(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 192:  # repr() refuses ints past 4300 digits
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_REPR = _Short()
_REPR.maxlevel, _REPR.maxtuple, _REPR.maxlist, _REPR.maxdict = 3, 8, 8, 6
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = 60


class WeightsError(ValueError):
    """A problem found in a weights file; `dew.io.load_torch_state_dict` adds the file's path
    and format to its message."""


def shown(value: Any) -> str:
    """`value`'s repr for an error line: short, and safe for deeply nested values."""
    return _REPR.repr(value)


def check_shape(name: str, shape: tuple[int, ...], itemsize: int) -> None:
    """Raise `WeightsError` naming tensor `name` unless NumPy can hold an array of `shape`
    (at most `MAX_DIMS` dimensions, and a size in bytes that fits its index type, counting
    only the non-zero dimensions, as NumPy does for an empty array)."""
    if len(shape) > MAX_DIMS:
        raise WeightsError(
            f"tensor {name!r} has {len(shape)} dimensions; NumPy arrays have at most {MAX_DIMS}"
        )
    if math.prod(n for n in shape if n) * itemsize > _INTP_MAX:
        raise WeightsError(f"tensor {name!r} has shape {shown(shape)}, too large for any array")


class ArrayBudget:
    """The bytes a file's arrays may take: no more than the file itself holds. Each new
    array is charged before it is allocated, and the one that would pass the file's size
    raises, naming its tensor."""

    def __init__(self, file_size: int):
        self.file_size, self.charged = file_size, 0

    def charge(self, name: str, shape: tuple[int, ...], nbytes: int, why: str) -> None:
        """Charge tensor `name`'s `nbytes`; past the file's size, raise `WeightsError`
        saying `why` a file could ask for more than it holds."""
        self.charged += nbytes
        if self.charged > self.file_size:
            raise WeightsError(
                f"tensor {name!r} of shape {shown(shape)} ({nbytes:,} bytes) brings the arrays "
                f"read to {self.charged:,} bytes, more than the {self.file_size:,}-byte file "
                f"holds: {why}"
            )
