"""The identity of the data that conditioned a pass's generated samples."""

import hashlib
from typing import Any

import numpy as np

__all__ = ["ConditioningDigest"]


class ConditioningDigest:
    """A SHA-256 over the conditioning values of every row of a pass, in pass order: each
    batch's values (class labels, prompt token ids; one row per batch row) as
    little-endian int64 in C order, so for a pass conditioned on class labels it is
    `hashlib.sha256(np.asarray(all_labels, "<i8").tobytes()).hexdigest()` however the
    rows were batched. `hexdigest()` is `None` when no batch had conditioning values."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._updated = False

    def update(self, values: Any) -> None:
        """Add one batch's conditioning values (host arrays, any integer dtype)."""
        array = np.asarray(values)
        if array.dtype.kind not in "biu":
            raise ValueError(
                "conditioning values must be integers (class labels, token ids), got an "
                f"array of {array.dtype}."
            )
        self._digest.update(np.ascontiguousarray(array, "<i8").tobytes())
        self._updated = True

    def hexdigest(self) -> str | None:
        """The digest so far, or `None` when nothing conditioned the pass."""
        return self._digest.hexdigest() if self._updated else None
