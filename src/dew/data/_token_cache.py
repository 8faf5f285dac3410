"""Tokenize once: documents' token IDs in a memory-mapped cache keyed by the files and the
tokenizer.

A cache is a folder `tokens-<key>` under the cache folder, holding

- `tokens.bin`: every document's IDs followed by the tokenizer's `eos_id`, in file order,
  raw little-endian uint16 (a vocabulary of at most 65,536 IDs) or uint32;
- `documents.npy`: int64 offsets, document `d` being `tokens[offsets[d]:offsets[d + 1]]`;
- `cache.json`: the key, the dtype, the counts, and `content`, a digest of the tokens and
  offsets (what a `Rows.fingerprint` is built from: touching a file rebuilds the cache but
  leaves the content, and so the split and the batch order, as they were).

The key is a digest of each file's resolved path, size and modification time (or, with
`content_hash=True`, a hash of each file's bytes, in order), the JSON Lines field and the
tokenizer's fingerprint: a second build with the same key reads the cache; a changed file
changes the key. A build writes a temporary folder beside the cache, fsyncs it and renames it
into place (`dew.data._cache_folder`), so a build that dies midway leaves no cache that is
read (its temporary folder is removed by the next build on the same machine).

The documents come from a `Documents`: the files' (`file_corpus`), or the strings of a column
of a Hugging Face dataset (`dew.data.huggingface`), each with the key part that names them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dew.data._cache_folder import cached_folder, default_cache_dir, fsync
from dew.data._documents import file_documents
from dew.data.tokenizers._protocol import Tokenizer, describe

__all__ = [
    "Documents",
    "TokenCache",
    "default_cache_dir",
    "documents_cache",
    "file_corpus",
    "token_cache",
]

FORMAT = 1
_BATCH_BYTES = 8 << 20  # documents handed to encode_batch together: about 8 MB of text
_BATCH_DOCUMENTS = 4096


@dataclasses.dataclass(frozen=True, eq=False)
class TokenCache:
    """A built cache: `tokens` (memory-mapped), `offsets` (`documents + 1` int64), the
    `key` it was found by and the `content` digest of its tokens."""

    path: pathlib.Path
    tokens: np.ndarray
    offsets: np.ndarray
    key: str
    content: str
    built: bool

    @property
    def documents(self) -> int:
        return int(self.offsets.shape[0] - 1)


def _dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclasses.dataclass(frozen=True, eq=False)
class Documents:
    """What a token cache is built from.

    - `key`: a digest that changes whenever the documents could; with the tokenizer's
      fingerprint it keys the cache.
    - `size`: their bytes, for the progress bar; `label`: what the bar says it tokenizes
      (`"4 files"`, `"1000 rows"`).
    - `read(raw, bar)`: the non-empty documents in order, bytes where `raw` (a tokenizer with
      `encode_bytes`, and `raw_ok`) else text, advancing the tqdm `bar` by the bytes read.
    - `record`: what `cache.json` records of them; `empty`: the error's words for a corpus
      that holds no document.
    """

    key: str
    size: int
    label: str
    read: Callable[[bool, Any], Iterator[str | bytes]]
    raw_ok: bool
    record: Mapping[str, Any]
    empty: str


def file_corpus(
    owner: str, files: Sequence[pathlib.Path], *, field: str | None, content_hash: bool
) -> Documents:
    """The documents of `files` (`dew.data._documents.file_documents`), keyed by each file's
    resolved path, size and modification time, or its bytes (`content_hash`), and `field`."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr(("files", field, content_hash)).encode())
    for path in files:
        if content_hash:  # the bytes in order: a moved or touched corpus keeps its cache
            with path.open("rb") as handle:
                part = hashlib.file_digest(handle, "blake2b").hexdigest()
        else:
            status = path.stat()
            part = repr((str(path.resolve()), status.st_size, status.st_mtime_ns))
        digest.update(part.encode())
        digest.update(b"\x00")
    sizes = [path.stat().st_size for path in files]

    def read(raw: bool, bar: Any) -> Iterator[str | bytes]:
        for number, (path, size) in enumerate(zip(files, sizes, strict=True), start=1):
            bar.set_postfix_str(f"file {number} of {len(files)}", refresh=False)
            found = file_documents(owner, path, path.read_bytes(), field=field, raw=raw)
            left = size
            for document in found:  # a JSON Lines file advances the bar as it is tokenized
                yield document
                step = min(len(document), left)
                bar.update(step)
                left -= step
            bar.update(left)

    shown = ", ".join(repr(os.fspath(path)) for path in files[:3])
    return Documents(
        key=digest.hexdigest(),
        size=sum(sizes),
        label=f"{len(files)} file{'s' * (len(files) != 1)}",
        read=read,
        raw_ok=field is None,
        record={"files": [os.fspath(path) for path in files], "field": field},
        empty=f"{len(files)} file(s) ({shown}{', ...' if len(files) > 3 else ''}) hold no text"
        f"{f' under the field {field!r}' if field else ''}",
    )


def _key(documents: Documents, tokenizer: Tokenizer) -> str:
    return hashlib.blake2b(
        repr((FORMAT, documents.key, tokenizer.fingerprint)).encode(), digest_size=16
    ).hexdigest()


def _load(folder: pathlib.Path, key: str) -> TokenCache | None:
    """The cache in `folder`, or `None` where it is absent or not whole."""
    try:
        meta = json.loads((folder / "cache.json").read_text())
        if meta.get("format") != FORMAT or meta.get("key") != key:
            return None
        offsets = np.load(folder / "documents.npy", allow_pickle=False)
        count = int(meta["tokens"])
        dtype = np.dtype(meta["dtype"])
        if (folder / "tokens.bin").stat().st_size != count * dtype.itemsize:
            return None
        if offsets.ndim != 1 or offsets.shape[0] < 2 or int(offsets[-1]) != count:
            return None
        tokens = np.memmap(folder / "tokens.bin", dtype=dtype, mode="r", shape=(count,))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return TokenCache(folder, tokens, offsets, key, str(meta["content"]), built=False)


def _chunk_ids(owner: str, chunk: list[Any], tokenizer: Tokenizer, dtype: np.dtype) -> np.ndarray:
    """One chunk of documents' IDs as one array, each document followed by `eos_id`; IDs
    outside the tokenizer's vocabulary raise, naming it."""
    lengths = np.fromiter((len(ids) for ids in chunk), np.int64, len(chunk))
    if all(isinstance(ids, np.ndarray) for ids in chunk):
        body = np.concatenate([ids.reshape(-1) for ids in chunk]) if chunk else np.empty(0)
    else:
        body = np.fromiter(itertools.chain.from_iterable(chunk), np.int64, int(lengths.sum()))
    if body.size and not np.issubdtype(body.dtype, np.integer):
        raise TypeError(f"{owner}: the tokenizer {describe(tokenizer)} returned {body.dtype} IDs.")
    if body.size and (int(body.min()) < 0 or int(body.max()) >= tokenizer.vocab_size):
        bad = int(body.min()) if int(body.min()) < 0 else int(body.max())
        raise ValueError(
            f"{owner}: the tokenizer {describe(tokenizer)} returned ID {bad}, outside its "
            f"vocabulary [0, {tokenizer.vocab_size})."
        )
    return np.insert(body.astype(dtype, copy=False), np.cumsum(lengths), tokenizer.eos_id)


def _chunks(documents: Iterator[str | bytes], tokenizer: Tokenizer) -> Iterator[list[Any]]:
    """The documents' IDs, a chunk of documents at a time, in order: raw bytes through
    `encode_bytes`, text through `encode_batch` where the tokenizer has it, else one
    `encode` each."""
    encode_batch = getattr(tokenizer, "encode_batch", None)

    def encoded(batch: list[str | bytes]) -> list[Any]:
        if isinstance(batch[0], bytes):
            return [tokenizer.encode_bytes(document) for document in batch]  # type: ignore[attr-defined]
        if encode_batch is None:
            return [tokenizer.encode(document) for document in batch]  # type: ignore[arg-type]
        return list(encode_batch(batch))

    batch: list[str | bytes] = []
    size = 0
    for document in documents:
        batch.append(document)
        size += len(document)
        if size >= _BATCH_BYTES or len(batch) >= _BATCH_DOCUMENTS:
            yield encoded(batch)
            batch, size = [], 0
    if batch:
        yield encoded(batch)


def _write(
    owner: str,
    folder: pathlib.Path,
    documents: Documents,
    tokenizer: Tokenizer,
    key: str,
    show: bool,
) -> None:
    dtype = _dtype(tokenizer.vocab_size)
    raw = documents.raw_ok and callable(getattr(tokenizer, "encode_bytes", None))
    content = hashlib.blake2b(digest_size=16)
    lengths: list[np.ndarray] = [np.zeros(1, np.int64)]
    bar = tqdm(
        total=documents.size,
        unit="B",
        unit_scale=True,
        desc=f"tokenizing {documents.label}",
        disable=not show,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    with bar, (folder / "tokens.bin").open("wb") as out:
        for chunk in _chunks(documents.read(raw, bar), tokenizer):
            array = _chunk_ids(owner, chunk, tokenizer, dtype)
            out.write(array.data)
            content.update(array.data)
            lengths.append(np.fromiter((len(ids) + 1 for ids in chunk), np.int64, len(chunk)))
        out.flush()
        os.fsync(out.fileno())
    boundaries = np.cumsum(np.concatenate(lengths))
    if boundaries.shape[0] == 1:
        raise ValueError(f"{owner}: the corpus is empty: {documents.empty}.")
    content.update(boundaries.tobytes())
    np.save(folder / "documents.npy", boundaries)
    meta = {
        "format": FORMAT,
        "key": key,
        "content": content.hexdigest(),
        "dtype": dtype.str,
        "tokens": int(boundaries[-1]),
        "documents": int(boundaries.shape[0] - 1),
        **documents.record,
        "tokenizer": describe(tokenizer),
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "eos_id": tokenizer.eos_id,
        "vocab_size": tokenizer.vocab_size,
    }
    (folder / "cache.json").write_text(json.dumps(meta, indent=1) + "\n")
    for name in ("documents.npy", "cache.json"):
        fsync(folder / name)


def documents_cache(
    owner: str,
    documents: Documents,
    tokenizer: Tokenizer,
    *,
    cache_dir: str | os.PathLike[str] | None,
    progress: bool | None,
) -> TokenCache:
    """The token cache of `documents` under `tokenizer`: read where a whole one with the same
    key exists in `cache_dir`, else built (with a progress bar on stderr when `progress`, or
    when `progress is None` and stderr is a terminal) and then read."""
    cache_dir = default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir)
    key = _key(documents, tokenizer)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    found, built = cached_folder(
        owner,
        cache_dir,
        f"tokens-{key}",
        load=lambda folder: _load(folder, key),
        write=lambda folder: _write(owner, folder, documents, tokenizer, key, show),
        what="token cache",
    )
    return dataclasses.replace(found, built=built)


def token_cache(
    owner: str,
    files: Sequence[pathlib.Path],
    tokenizer: Tokenizer,
    *,
    field: str | None,
    cache_dir: str | os.PathLike[str] | None,
    content_hash: bool,
    progress: bool | None,
) -> TokenCache:
    """The token cache of `files` under `tokenizer` (`documents_cache` of `file_corpus`)."""
    documents = file_corpus(owner, files, field=field, content_hash=content_hash)
    return documents_cache(owner, documents, tokenizer, cache_dir=cache_dir, progress=progress)
