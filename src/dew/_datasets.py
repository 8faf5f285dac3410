"""dew's built-in datasets: synthetic token windows, preference pairs and prompts, token
windows read from a local token file, and a local `.npz`/`.npy` file of arrays, each as
step-indexed rows (`dew.data.StepBatches`). Nothing downloads."""

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dew._integers import check_integer
from dew.data import Dataset, Subset, arrays, indexed_dataset, tokens
from dew.data._indexed import check_fraction, fingerprint_of
from dew.data._tokens import check_vocabulary, load_token_file, token_dataset

__all__ = ["arrays_file", "preference_pairs", "prompts", "token_file", "token_windows"]

SYNTHETIC_TOKENS = 32768
SYNTHETIC_BYTES = 2**30
"""The most memory a synthetic dataset may take to generate (1 GiB, 4096x what the built-in
configurations need): synthetic data is demonstration data, generated whole in memory by
every process, so a size past this is a mistake, refused before anything is allocated. More
tokens belong in a token file (`token_windows(path=...)`), which is memory-mapped."""
_CHAIN_SEED = 0
_POOL_SEED = 0
_CHAIN_LENGTH = 256


def _integer(builder: str, field: str, value: Any, least: int) -> int:
    return check_integer(f"{builder}: {field}", value, minimum=least)


def _gibibytes(count: int) -> str:
    return f"{count / 2**30:,.1f} GiB"


def _check_synthetic(builder: str, asked: str, needed: int, most: str) -> None:
    """Refuse a synthetic dataset that needs more than `SYNTHETIC_BYTES` to generate:
    `asked` names the sizes asked for, `needed` their bytes, `most` what the limit allows."""
    if needed > SYNTHETIC_BYTES:
        raise ValueError(
            f"{builder}: {asked} would take about {_gibibytes(needed)} to generate, past the "
            f"{_gibibytes(SYNTHETIC_BYTES)} a synthetic dataset may take ({most}): synthetic "
            "data is generated whole in memory."
        )


def _stream_bytes(vocab_size: int, num_tokens: int) -> int:
    """The most memory `_markov_stream` takes: the transition table, its normalised copy and
    cumulative sums (8 bytes each of vocab_size**2); the walks, the clipped stream and its
    int32 copy (4 bytes a token each); each step's look-up of every chain's row of sums and
    its comparison (9 bytes a chain and token ID) and the draws and counts (16 bytes a
    chain); and 64 KiB of small arrays."""
    chains = -(-num_tokens // _CHAIN_LENGTH)
    return 24 * vocab_size**2 + 12 * num_tokens + chains * (9 * vocab_size + 16) + 2**16


def _check_rows(builder: str, field: str, rows: int, row_bytes: int, row: str = "") -> None:
    """Refuse a synthetic pool of `rows` rows (each `row`, in words) of about `row_bytes`
    each past the limit."""
    _check_synthetic(
        builder,
        f"{field}={rows}{row}",
        rows * row_bytes,
        f"{field} up to {SYNTHETIC_BYTES // row_bytes:,}{row}",
    )


def _check_stream(vocab_size: int, num_tokens: int) -> None:
    fixed = 24 * vocab_size**2 + 2**16
    per_chain = 12 * _CHAIN_LENGTH + 9 * vocab_size + 16  # a chain of tokens, rounded up
    most = (SYNTHETIC_BYTES - fixed) // per_chain * _CHAIN_LENGTH
    limit = (
        f"num_tokens up to {most:,} at vocab_size={vocab_size}"
        if most >= 2
        else f"a synthetic vocab_size up to {math.isqrt((SYNTHETIC_BYTES - 2**16) // 24):,}"
    )
    _check_synthetic(
        "token_windows",
        f"a synthetic stream of num_tokens={num_tokens} over vocab_size={vocab_size}",
        _stream_bytes(vocab_size, num_tokens),
        f"{limit}; for more data give a token file, path=..., which is memory-mapped",
    )


def _fraction(builder: str, value: Any) -> float:
    return check_fraction(builder, value)


@functools.lru_cache(maxsize=8)
def _markov_stream(vocab_size: int, num_tokens: int) -> np.ndarray:
    """A fixed token stream from a fixed random Markov chain over `vocab_size` IDs (each
    ID has up to four likely successors), walked as parallel chains of 256 steps."""
    rng = np.random.default_rng(_CHAIN_SEED)
    likely = min(4, vocab_size)
    transitions = np.full((vocab_size, vocab_size), 0.02)
    for token in range(vocab_size):
        successors = rng.choice(vocab_size, likely, replace=False)
        transitions[token, successors] += rng.dirichlet(np.ones(likely))
    cumulative = np.cumsum(transitions / transitions.sum(axis=1, keepdims=True), axis=1)
    length = _CHAIN_LENGTH
    chains = -(-num_tokens // length)
    walks = np.empty((chains, length), np.int32)
    walks[:, 0] = rng.integers(0, vocab_size, chains)
    for position in range(1, length):
        draws = rng.random(chains)[:, None]
        walks[:, position] = (draws > cumulative[walks[:, position - 1]]).sum(axis=1)
    stream = np.minimum(walks.reshape(-1)[:num_tokens], vocab_size - 1).astype(np.int32)
    stream.flags.writeable = False
    return stream


class _PoolRows:
    """`Rows` of a fixed synthetic pool: `count` rows, `gather(indices)` reads them, and
    `fingerprint` names every argument that shapes them."""

    def __init__(
        self, count: int, gather: Callable[[np.ndarray], dict[str, np.ndarray]], fingerprint: str
    ) -> None:
        self.count, self.gather, self.fingerprint = count, gather, fingerprint

    def __len__(self) -> int:
        return self.count

    def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return self.gather(indices)


def _rows_dataset(
    builder: str,
    rows: int,
    gather: Callable[[np.ndarray], dict[str, np.ndarray]],
    *,
    val_fraction: float,
    batch_size: int,
    seed: int,
    shape: tuple[Any, ...],
) -> Dataset:
    """A step-indexed Dataset over `rows` indexed rows (`gather(indices)` returns them;
    `shape`: every argument that shapes a row): the last `ceil(val_fraction * rows)` are
    held out for validation, the same rows for every seed."""
    held_out = math.ceil(val_fraction * rows) if val_fraction > 0 else 0
    if rows - held_out < 1:
        raise ValueError(
            f"{builder}: {rows} row(s) leave no training row after holding out "
            f"val_fraction={val_fraction} for validation; add data or lower val_fraction."
        )
    pool = _PoolRows(rows, gather, fingerprint_of(builder, *shape))
    order = np.arange(rows, dtype=np.int64)
    return indexed_dataset(
        Subset(pool, order[: rows - held_out], "train"),
        batch=batch_size,
        seed=seed,
        val=Subset(pool, order[rows - held_out :], "validation") if held_out else None,
        source=builder,
    )


def token_windows(
    *,
    seq_len: int,
    path: str | os.PathLike | None = None,
    vocab_size: int = 16,
    val_fraction: float | int = 0.1,
    num_tokens: int | None = None,
    batch_size: int,
    seed: int,
) -> Dataset:
    """Windows of `seq_len + 1` token IDs (int32, under `"text"`) cut from one token array:
    the synthetic one, or a `.npy` file (`dew.data.tokens` reads it, with the rest of its
    arguments, under this older name).

    **Arguments:**

    - `seq_len`: the positions a window predicts; windows start every `seq_len` tokens,
      so consecutive windows share one boundary token and every token is a target once.
    - `path`: a local `.npy` file holding a 1-D integer array of token IDs (memory
      mapped). With `None`, the tokens come from a fixed synthetic Markov chain
      (`num_tokens` of them, 32768 by default), so the dataset works with no file.
    - `vocab_size`: token IDs lie in `[0, vocab_size)`; a file holding others raises.
    - `val_fraction`: the share of windows (the last ones, rounded up) held out for
      validation; `0` gives a dataset without validation data.
    - `batch_size`: rows per batch of each partition; `seed`: the shuffle's seed.

    **Batches:** the training batch of step `s` is a function of (the tokens, `seed`, `s`,
    the global batch): `train` is a `dew.data.StepBatches`, each epoch a permutation of the
    training windows, each process its slice of the global batch, so a resumed run reads
    its next batch directly. `val(partition)` passes once, in order, over the partition's
    strided share of the held-out windows; the last batch keeps its remainder (it may be
    short).

    ```python
    >>> from dew.data import Partition
    >>> data = token_windows(seq_len=8, batch_size=4, seed=0)
    >>> batch = next(data.train(Partition()))
    >>> batch["text"].shape, batch["text"].dtype.name
    ((4, 9), 'int32')

    ```
    """
    seq_len = _integer("token_windows", "seq_len", seq_len, 1)
    vocab_size = _integer("token_windows", "vocab_size", vocab_size, 1)
    val_fraction = _fraction("token_windows", val_fraction)
    batch_size = _integer("token_windows", "batch_size", batch_size, 1)
    seed = _integer("token_windows", "seed", seed, 0)
    if path is None:
        count = SYNTHETIC_TOKENS if num_tokens is None else num_tokens
        count = _integer("token_windows", "num_tokens", count, 2)
        _check_stream(vocab_size, count)
        ids = _markov_stream(vocab_size, count)
    elif num_tokens is not None:
        raise ValueError(
            "token_windows: num_tokens sets the length of the synthetic stream, so it takes "
            f"no value with a token file (path={os.fspath(path)!r}); got num_tokens={num_tokens}."
        )
    else:
        ids = load_token_file("token_windows", path, None)
        check_vocabulary("token_windows", ids, vocab_size, repr(os.fspath(path)))
    return token_dataset(
        "token_windows",
        ids,
        seq_len=seq_len,
        batch=batch_size,
        seed=seed,
        val_fraction=val_fraction,
    )


def arrays_file(
    *, path: str | os.PathLike, batch_size: int, seed: int, val_fraction: float | int = 0.0
) -> Dataset:
    """`dew.data.arrays(path, batch=batch_size, seed=seed, val_fraction=val_fraction)`, the
    dataset registered as `"arrays"`: the arrays of an `.npz` file (by the names `np.savez`
    gave them) or one `.npy` array (named by its file's stem), `path` kept as given.

    ```python
    >>> from dew.config import DataConfig
    >>> DataConfig("arrays", {"path": "digits.npz", "val_fraction": 0.2})
    DataConfig(name='arrays', kwargs={'path': 'digits.npz', 'val_fraction': 0.2})

    ```
    """
    return arrays(path, batch=batch_size, seed=seed, val_fraction=val_fraction)


def token_file(
    *,
    path: str | os.PathLike,
    seq_len: int,
    batch_size: int,
    seed: int,
    dtype: str | None = None,
    vocab_size: int | None = None,
    val_fraction: float | int = 0.0,
) -> Dataset:
    """`dew.data.tokens(path, seq_len=..., batch=batch_size, seed=seed, ...)`, the dataset
    registered as `"tokens"`: windows of a `.npy` token file or a raw `.bin` of `dtype`
    (`"uint16"` or `"uint32"`), `path` kept as given."""
    return tokens(
        path,
        seq_len=seq_len,
        batch=batch_size,
        seed=seed,
        dtype=dtype,
        vocab_size=vocab_size,
        val_fraction=val_fraction,
    )


def preference_pairs(
    *,
    prompt_len: int = 4,
    response_len: int = 4,
    vocab_size: int = 16,
    num_pairs: int = 1024,
    val_fraction: float | int = 0.1,
    batch_size: int,
    seed: int,
) -> Dataset:
    """Synthetic preference pairs for `DPOObjective`: batches of `"chosen"`, `"rejected"`
    (int32 `(rows, prompt_len + response_len)`) and `"prompt_mask"` (bool, true on the
    first `prompt_len` positions).

    Each pair shares a random prompt. The chosen response counts up from the prompt's
    last token (`t + 1, t + 2, ...` modulo `vocab_size`); the rejected response differs
    from it at every position. The pool is fixed (the same for every seed); `seed`
    shuffles the training order, and batches, partitions and validation (the last rows,
    the same for every seed) behave as in `token_windows`.

    ```python
    >>> from dew.data import Partition
    >>> batch = next(preference_pairs(batch_size=2, seed=0).train(Partition()))
    >>> batch["chosen"].shape, batch["prompt_mask"][0].tolist()
    ((2, 8), [True, True, True, True, False, False, False, False])

    ```
    """
    prompt_len = _integer("preference_pairs", "prompt_len", prompt_len, 1)
    response_len = _integer("preference_pairs", "response_len", response_len, 1)
    vocab_size = _integer("preference_pairs", "vocab_size", vocab_size, 2)
    num_pairs = _integer("preference_pairs", "num_pairs", num_pairs, 1)
    val_fraction = _fraction("preference_pairs", val_fraction)
    batch_size = _integer("preference_pairs", "batch_size", batch_size, 1)
    seed = _integer("preference_pairs", "seed", seed, 0)
    length = prompt_len + response_len
    _check_rows("preference_pairs", "num_pairs", num_pairs, 32 * length, f" of {length} tokens")
    rng = np.random.default_rng(_POOL_SEED)
    prompt = rng.integers(0, vocab_size, (num_pairs, prompt_len))
    steps = np.arange(1, response_len + 1)
    chosen = (prompt[:, -1:] + steps) % vocab_size
    rejected = (chosen + rng.integers(1, vocab_size, chosen.shape)) % vocab_size
    pool = {
        "chosen": np.concatenate([prompt, chosen], axis=1).astype(np.int32),
        "rejected": np.concatenate([prompt, rejected], axis=1).astype(np.int32),
    }
    mask = np.arange(prompt_len + response_len) < prompt_len

    def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
        batch: dict[str, np.ndarray] = {key: rows[indices] for key, rows in pool.items()}
        batch["prompt_mask"] = np.broadcast_to(mask, batch["chosen"].shape).copy()
        return batch

    return _rows_dataset(
        "preference_pairs",
        num_pairs,
        gather,
        val_fraction=val_fraction,
        batch_size=batch_size,
        seed=seed,
        shape=(prompt_len, response_len, vocab_size, num_pairs, _POOL_SEED),
    )


def prompts(
    *,
    prompt_len: int = 4,
    vocab_size: int = 16,
    num_prompts: int = 1024,
    val_fraction: float | int = 0.1,
    batch_size: int,
    seed: int,
) -> Dataset:
    """Synthetic prompts for `GRPOObjective`: batches of `"prompts"`, int32
    `(rows, prompt_len)` random token IDs from a fixed pool; `seed` shuffles the
    training order, and batches, partitions and validation behave as in `token_windows`.

    ```python
    >>> from dew.data import Partition
    >>> next(prompts(batch_size=3, seed=0).train(Partition()))["prompts"].shape
    (3, 4)

    ```
    """
    prompt_len = _integer("prompts", "prompt_len", prompt_len, 1)
    vocab_size = _integer("prompts", "vocab_size", vocab_size, 1)
    num_prompts = _integer("prompts", "num_prompts", num_prompts, 1)
    val_fraction = _fraction("prompts", val_fraction)
    batch_size = _integer("prompts", "batch_size", batch_size, 1)
    seed = _integer("prompts", "seed", seed, 0)
    _check_rows("prompts", "num_prompts", num_prompts, 16 * prompt_len, f" of {prompt_len} tokens")
    pool = (
        np.random.default_rng(_POOL_SEED)
        .integers(0, vocab_size, (num_prompts, prompt_len))
        .astype(np.int32)
    )

    def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"prompts": pool[indices]}

    return _rows_dataset(
        "prompts",
        num_prompts,
        gather,
        val_fraction=val_fraction,
        batch_size=batch_size,
        seed=seed,
        shape=(prompt_len, vocab_size, num_prompts, _POOL_SEED),
    )
