"""`tokens`: windows of `seq_len + 1` token IDs cut from one token file (`.npy`, or a raw
`.bin` of uint16/uint32), memory-mapped, as step-indexed rows."""

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew._integers import check_integer
from dew.data._dataset import Dataset
from dew.data._files import local_path
from dew.data._indexed import InOrder, StepBatches, array_digest, check_fraction, fingerprint_of

__all__ = ["TokenWindows", "load_token_file", "token_dataset", "tokens"]

RAW_DTYPES = ("uint16", "uint32")
_CHUNK = 1 << 24  # token IDs checked per read of the file (64 MiB of uint32)


class TokenWindows:
    """`Rows` of windows over a 1-D token array: row `i` is `tokens[s : s + seq_len + 1]`,
    `s = (first + i) * seq_len`, as int32 under `"text"` (consecutive windows share one
    boundary token, so every token after the first is a target once). `count` windows from
    window `first` on; `digest` identifies the token array (`array_digest`)."""

    def __init__(
        self, tokens: np.ndarray, seq_len: int, *, first: int, count: int, digest: str
    ) -> None:
        self.tokens, self.seq_len, self.first, self.count = tokens, seq_len, first, count
        self.fingerprint = fingerprint_of("token_windows", digest, seq_len, first, count)
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def __len__(self) -> int:
        return self.count

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        starts = (np.asarray(indices, np.int64) + self.first) * self.seq_len
        return {"text": np.asarray(self.tokens[starts[:, None] + self._offsets], np.int32)}

    def __repr__(self) -> str:
        return f"TokenWindows({self.count} windows of {self.seq_len + 1} from window {self.first})"


def load_token_file(source: str, path: Any, dtype: str | None) -> np.ndarray:
    """The token IDs of a `.npy` file (its own dtype) or of a raw file of `dtype` (`"uint16"`
    or `"uint32"`), memory-mapped, as a 1-D integer array."""
    file = local_path(source, path, "a token file (.npy, or a raw .bin with its dtype)")
    shown = repr(os.fspath(path))
    if dtype is not None and dtype not in RAW_DTYPES:
        raise ValueError(f"{source}: dtype must be 'uint16' or 'uint32', got {dtype!r}.")
    if file.suffix != ".npy":
        if dtype is None:
            raise ValueError(
                f"{source}: {shown} is a raw token file (not .npy): give its dtype, 'uint16' or "
                "'uint32'."
            )
        size, width = file.stat().st_size, np.dtype(dtype).itemsize
        if size % width:
            raise ValueError(
                f"{source}: {shown} holds {size} bytes, not a whole number of {dtype} token IDs "
                f"({width} bytes each); is its dtype {dtype!r}?"
            )
        if size == 0:
            return np.zeros(0, dtype)
        return np.memmap(file, dtype=dtype, mode="r")
    try:
        tokens = np.load(file, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"{source}: {shown} is not a readable .npy file: {error}") from None
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"{source}: {shown} must hold a 1-D array of integer token IDs, got shape "
            f"{tokens.shape} and dtype {tokens.dtype}."
        )
    if dtype is not None and np.dtype(dtype) != tokens.dtype:
        raise ValueError(
            f"{source}: {shown} is a .npy file of {tokens.dtype} token IDs, but dtype={dtype!r} "
            "was given; dtype is for raw files (leave it out for .npy)."
        )
    return tokens


def check_vocabulary(source: str, tokens: np.ndarray, vocab_size: int, shown: str) -> None:
    """Every token ID lies in `[0, vocab_size)`, read in chunks (never the whole file at
    once); else a `ValueError` naming the first bad ID and its position."""
    for start in range(0, tokens.shape[0], _CHUNK):
        chunk = np.asarray(tokens[start : start + _CHUNK])
        if chunk.min() < 0 or chunk.max() >= vocab_size:
            where = int(np.argmax((chunk < 0) | (chunk >= vocab_size)))
            raise ValueError(
                f"{source}: {shown} holds token ID {int(chunk[where])} at position "
                f"{start + where}; valid IDs are 0 to {vocab_size - 1} (vocab_size={vocab_size})."
            )


def token_dataset(
    source: str,
    tokens: np.ndarray,
    *,
    seq_len: int,
    batch: int,
    seed: int,
    val_fraction: float,
    digest: str | None = None,
) -> Dataset:
    """The windows of `tokens` as a step-indexed `Dataset`, the last `ceil(val_fraction *
    windows)` held out for validation (a token array has no documents: the held-out windows
    are one stretch at its end, sharing one boundary token with the training windows)."""
    windows = (tokens.shape[0] - 1) // seq_len
    if windows < 1:
        raise ValueError(
            f"{source}: {tokens.shape[0]} token(s) hold no window of seq_len + 1 = "
            f"{seq_len + 1} tokens."
        )
    held = math.ceil(val_fraction * windows) if val_fraction > 0 else 0
    if windows - held < 1:
        raise ValueError(
            f"{source}: {windows} window(s) leave no training row after holding out "
            f"val_fraction={val_fraction} for validation; add data or lower val_fraction."
        )
    if batch > windows - held:
        raise ValueError(
            f"{source}: batch={batch} is more than the {windows - held} training window(s); "
            "lower the batch or add tokens."
        )
    digest = array_digest(tokens) if digest is None else digest
    train = TokenWindows(tokens, seq_len, first=0, count=windows - held, digest=digest)
    val = TokenWindows(tokens, seq_len, first=windows - held, count=held, digest=digest)
    return Dataset(
        train=StepBatches(train, batch, seed, source=source),
        val=InOrder(val, batch) if held else None,
        records=len(train),
        batch=batch,
    )


def tokens(
    path: str | os.PathLike[str],
    *,
    seq_len: int,
    batch: int,
    dtype: str | None = None,
    vocab_size: int | None = None,
    val_fraction: float = 0.0,
    seed: int = 0,
) -> Dataset:
    """Windows of `seq_len + 1` token IDs (int32, under `"text"`, for `LMObjective`) cut from
    an existing token file, memory-mapped.

    **Arguments:**

    - `path`: a `.npy` file of one 1-D integer array, or a raw file of token IDs (nanoGPT's
      `train.bin`) whose `dtype` you give, `"uint16"` or `"uint32"`. Kept as given: a
      relative path is read from the working directory.
    - `seq_len`: the positions a window predicts; windows start every `seq_len` tokens, so
      consecutive windows share one boundary token and every token is a target once.
    - `batch`: the rows of one process's batch; `seed`: the training order's seed.
    - `dtype`: the raw file's token type (leave it out for `.npy`).
    - `vocab_size`: when given, every token ID is checked to lie in `[0, vocab_size)` once,
      in 16M-token chunks (the file is never read into memory whole); without it the
      objective refuses a bad ID in the batch that holds it.
    - `val_fraction`: the share of windows held out for validation: the last
      `ceil(val_fraction * windows)` windows, one stretch at the file's end (a token file
      has no document boundaries, so a random choice of windows would hold out text whose
      neighbours train); `0` gives no validation data.

    The training batch of step `s` is a function of (the file's contents, `seed`, `s`, the
    global batch): see `dew.data.StepBatches`. The fingerprint reads the file's dtype, length
    and 64 evenly spaced 1 MiB stretches of it (all of a file up to 64 MiB), never its path.

    **Raises:** `FileNotFoundError` for a missing file; `ValueError` for a raw file without
    its dtype, a `.npy` file that is not a 1-D integer array, a token ID outside the
    vocabulary, too few tokens for one window, or no training window left.

    ```python
    >>> import pathlib, tempfile
    >>> import numpy as np
    >>> from dew.data import Partition
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "train.bin"
    >>> np.arange(1000, dtype=np.uint16).tofile(path)
    >>> data = tokens(path, dtype="uint16", seq_len=8, batch=4, val_fraction=0.1)
    >>> data.records, data.train.batch_at(0, Partition())["text"].shape
    (111, (4, 9))

    ```
    """
    source = "tokens"
    seq_len = check_integer(f"{source}: seq_len", seq_len, minimum=1)
    batch = check_integer(f"{source}: batch", batch, minimum=1)
    seed = check_integer(f"{source}: seed", seed, minimum=0)
    vocab_size = check_integer(f"{source}: vocab_size", vocab_size, minimum=1, optional=True)
    val_fraction = check_fraction(source, val_fraction)
    ids = load_token_file(source, path, dtype)
    if vocab_size is not None:
        check_vocabulary(source, ids, vocab_size, repr(os.fspath(path)))
    return token_dataset(
        source, ids, seq_len=seq_len, batch=batch, seed=seed, val_fraction=val_fraction
    )
