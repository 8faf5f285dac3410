"""`dew.data.text`: windows of token IDs over the documents of text files, tokenized once
into a cache, split into training and validation by document."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import numpy as np

from dew._integers import check_integer
from dew.data._dataset import Dataset
from dew.data._documents import resolve_files
from dew.data._indexed import InOrder, StepBatches, check_fraction, fingerprint_of, hold_out
from dew.data._token_cache import TokenCache, token_cache
from dew.data.tokenizers._load import load_tokenizer
from dew.data.tokenizers._protocol import Tokenizer

__all__ = [
    "TextWindows",
    "document_windows",
    "text",
    "text_entry",
    "windows_dataset",
]


@dataclasses.dataclass(frozen=True, eq=False)
class TextWindows:
    """`Rows` of `seq_len + 1` token IDs (int32, under `"text"`) over one split's stream.

    The stream is the chosen `documents` (indices into the cache's documents, sorted) in file
    order, each its IDs and its end-of-document ID: the `i`-th begins at `starts[i]` in the
    cache's `tokens` and at `cumulative[i]` in the stream (`cumulative[-1]` tokens in all).
    Window `i` is the stream's positions `i * seq_len ... i * seq_len + seq_len`, so
    consecutive windows share one boundary token and every token but the first is a target
    once. A read maps stream positions to the cache's through the documents' cumulative
    lengths (`np.searchsorted`, one call a batch); the corpus is never copied.
    """

    tokens: np.ndarray
    documents: np.ndarray
    starts: np.ndarray
    cumulative: np.ndarray
    seq_len: int
    fingerprint: str

    def __len__(self) -> int:
        return max(int(self.cumulative[-1]) - 1, 0) // self.seq_len

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        indices = np.asarray(indices, np.int64).reshape(-1)
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= len(self)):
            bad = int(indices.min()) if int(indices.min()) < 0 else int(indices.max())
            raise IndexError(f"window {bad} is outside [0, {len(self)}).")
        positions = indices[:, None] * self.seq_len + np.arange(self.seq_len + 1)
        document = np.searchsorted(self.cumulative, positions, side="right") - 1
        located = self.starts[document] + (positions - self.cumulative[document])
        return {"text": np.asarray(self.tokens[located], np.int32)}


def document_windows(
    tokens: np.ndarray,
    offsets: np.ndarray,
    documents: np.ndarray,
    *,
    seq_len: int,
    fingerprint: str,
) -> TextWindows:
    """The windows over `documents` (sorted document indices into `offsets`) of `tokens`."""
    documents = np.asarray(documents, np.int64)
    starts = np.ascontiguousarray(offsets[documents], np.int64)
    lengths = offsets[documents + 1] - starts
    cumulative = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
    return TextWindows(tokens, documents, starts, cumulative, seq_len, fingerprint)


def _check_windows(
    owner: str, windows: TextWindows, split: str, documents: int, held: bool
) -> None:
    if len(windows) < 1:
        raise ValueError(
            f"{owner}: the {split} documents ({documents}) hold {int(windows.cumulative[-1])} "
            f"token(s), fewer than one window of seq_len + 1 = {windows.seq_len + 1}; add "
            f"text or lower seq_len{' or change val_fraction' if held else ''}."
        )


def text(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: Tokenizer | str | os.PathLike[str] = "bytes",
    seq_len: int,
    batch: int,
    val_fraction: float = 0.0,
    seed: int = 0,
    field: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    content_hash: bool = False,
    progress: bool | None = None,
) -> Dataset:
    """Windows of `seq_len + 1` token IDs over the documents of text files, for a language
    model (`{"text": int32 (rows, seq_len + 1)}`, as `LMObjective` reads).

    The files are tokenized once into a memory-mapped token cache (each document's IDs
    followed by the tokenizer's `eos_id`) that later calls read instead. Training batches are
    a function of the step (`dew.data.StepBatches`): resuming at step `s` reads batch `s`.

    **Arguments:**

    - `paths`: a file, a glob (`"corpus/**/*.txt"`), or a list of them; globs expand in
      sorted order. Each plain-text file is one document.
    - `tokenizer`: `"bytes"` (each byte an ID, 256 the end of a document: vocab 257), a
      Hugging Face `tokenizer.json` path, a SentencePiece `.model` path, or a
      `dew.data.tokenizers.Tokenizer`. A run configuration (TOML) can give the first three.
    - `seq_len`: the positions a window predicts; windows start every `seq_len` tokens of a
      split's stream, so every token is a target once.
    - `batch`: the rows of one process's batch.
    - `val_fraction`: the share of *documents* held out for validation (`ceil(val_fraction *
      documents)`), drawn from the cache's content digest and `seed`; each split's stream is
      its documents in file order, so no held-out token reaches a training window.
    - `seed`: the hold-out's and the training order's seed.
    - `field`: JSON Lines: each line is one document, the string under this field.
    - `cache_dir`: the token caches' folder; default `$DEW_CACHE_DIR`, else
      `~/.cache/dew/tokens` (`$XDG_CACHE_HOME` respected). A run configuration trained with
      `dew train` keeps it in the run folder (`<run>/data-cache`) unless it names one.
    - `content_hash`: key the cache by a hash of each file's bytes instead of its path, size
      and modification time (a moved or touched corpus keeps its cache; each build hashes
      every file).
    - `progress`: a progress bar (files, MB/s) on stderr while the cache builds; `None`
      shows it where stderr is a terminal.

    **Raises:** in one line each, naming the value: `FileNotFoundError` for a missing file, a
    folder, or a glob that matches nothing; `ValueError` for an empty corpus, a JSON Lines
    line that is not an object with the string `field` (file and line), a file that is not
    UTF-8 for a tokenizer that reads text (file and line: the bytes tokenizer reads any
    bytes), too few documents or tokens for the split and `seq_len`.

    ```python
    >>> import pathlib, tempfile
    >>> from dew.data import Partition
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for name in "abcd":
    ...     _ = (folder / f"{name}.txt").write_text(f"document {name} " * 20)
    >>> data = text(str(folder / "*.txt"), seq_len=16, batch=4, val_fraction=0.25,
    ...             cache_dir=folder / "cache")
    >>> batch = data.train(Partition()).__next__()["text"]
    >>> batch.shape, batch.dtype.name, data.tokenizer.vocab_size
    ((4, 17), 'int32', 257)

    ```
    """
    seq_len = check_integer("text: seq_len", seq_len, minimum=1)
    batch = check_integer("text: batch", batch, minimum=1)
    seed = check_integer("text: seed", seed, minimum=0)
    val_fraction = check_fraction("text", val_fraction)
    if field is not None and (not isinstance(field, str) or not field):
        raise TypeError(f"text: field must be a field name (a non-empty string), got {field!r}.")
    if not isinstance(content_hash, bool):
        raise TypeError(f"text: content_hash must be True or False, got {content_hash!r}.")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"text: progress must be None, True or False, got {progress!r}.")
    chosen = load_tokenizer(tokenizer)
    files = resolve_files("text", paths)
    cache = token_cache(
        "text",
        files,
        chosen,
        field=field,
        cache_dir=cache_dir,
        content_hash=content_hash,
        progress=progress,
    )
    return windows_dataset(
        "text",
        cache,
        chosen,
        seq_len=seq_len,
        batch=batch,
        seed=seed,
        val_fraction=val_fraction,
        more="documents (files, or JSON Lines lines)",
    )


def windows_dataset(
    owner: str,
    cache: TokenCache,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    batch: int,
    seed: int,
    val_fraction: float,
    val_cache: TokenCache | None = None,
    more: str = "documents",
) -> Dataset:
    """The `Dataset` of windows of `seq_len + 1` tokens over a token cache's documents: the
    training windows read by `StepBatches`, the validation windows (`ceil(val_fraction *
    documents)` documents held out by the cache's content digest and `seed`, or every
    document of `val_cache`) by `InOrder`. `more` names what a user adds when too few
    documents are left to train on."""
    train_documents, val_documents = hold_out(
        cache.documents, fingerprint=cache.content, seed=seed, val_fraction=val_fraction
    )
    if train_documents.size == 0:
        raise ValueError(
            f"{owner}: {cache.documents} document(s) leave no training document after holding "
            f"out val_fraction={val_fraction} of them (the split is by document): add "
            f"{more} or lower val_fraction."
        )
    held = bool(val_documents.size)

    def windows(source: TokenCache, documents: np.ndarray, split: str) -> TextWindows:
        found = document_windows(
            source.tokens,
            source.offsets,
            documents,
            seq_len=seq_len,
            fingerprint=fingerprint_of(source.content, "text", seq_len, split, seed, val_fraction),
        )
        _check_windows(owner, found, split, documents.size, held=held)
        return found

    training = windows(cache, train_documents, "training")
    if batch > len(training):
        raise ValueError(
            f"{owner}: batch={batch} is more than the {len(training)} training window(s) of "
            f"seq_len + 1 = {seq_len + 1} tokens; lower batch or seq_len, or add text."
        )
    validation = None
    if val_cache is not None:
        validation = windows(val_cache, np.arange(val_cache.documents), "validation")
    elif held:
        validation = windows(cache, val_documents, "validation")
    return Dataset(
        train=StepBatches(training, batch, seed),
        val=None if validation is None else InOrder(validation, batch),
        records=len(training),
        batch=batch,
        tokenizer=tokenizer,
    )


def text_entry(
    *,
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    tokenizer: str = "bytes",
    seq_len: int,
    val_fraction: float = 0.0,
    field: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    content_hash: bool = False,
    batch_size: int,
    seed: int,
) -> Dataset:
    """`text` as the dataset registry names it (`[data] name = "text"`): `batch_size` and
    `seed` come from the trainer, the rest from the configuration, e.g.

    ```toml
    [data]
    name = "text"

    [data.kwargs]
    paths = ["corpus/*.txt"]
    tokenizer = "bytes"          # or "tokenizer.json", or "spm.model"
    seq_len = 128
    val_fraction = 0.05
    ```

    A run records `paths` and `cache_dir` absolute (its `run.json`), so `dew eval` reads the
    same files from any directory.
    """
    return text(
        paths,
        tokenizer=tokenizer,
        seq_len=seq_len,
        batch=batch_size,
        val_fraction=val_fraction,
        seed=seed,
        field=field,
        cache_dir=cache_dir,
        content_hash=content_hash,
    )
