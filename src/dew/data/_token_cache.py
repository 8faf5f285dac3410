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
into place, so a build that dies midway leaves no cache that is read (its temporary folder is
removed by the next build on the same machine).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dew.data._documents import file_documents
from dew.data.tokenizers._protocol import Tokenizer, describe

__all__ = ["TokenCache", "default_cache_dir", "token_cache"]

FORMAT = 1
_BATCH_BYTES = 8 << 20  # documents handed to encode_batch together: about 8 MB of text
_BATCH_DOCUMENTS = 4096


def default_cache_dir() -> pathlib.Path:
    """Where `dew.data.text` keeps token caches unless told: `$DEW_CACHE_DIR`, else
    `$XDG_CACHE_HOME/dew/tokens`, else `~/.cache/dew/tokens` (shared by every script of
    the user, as Hugging Face's caches are; a run configuration puts it in the run folder)."""
    if os.environ.get("DEW_CACHE_DIR"):
        return pathlib.Path(os.environ["DEW_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "dew" / "tokens"


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


def _key(
    files: Sequence[pathlib.Path], tokenizer: Tokenizer, field: str | None, content_hash: bool
) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((FORMAT, field, tokenizer.fingerprint, content_hash)).encode())
    for path in files:
        if content_hash:  # the bytes in order: a moved or touched corpus keeps its cache
            with path.open("rb") as handle:
                part = hashlib.file_digest(handle, "blake2b").hexdigest()
        else:
            status = path.stat()
            part = repr((str(path.resolve()), status.st_size, status.st_mtime_ns))
        digest.update(part.encode())
        digest.update(b"\x00")
    return digest.hexdigest()


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(cache_dir: pathlib.Path, name: str, host: str) -> None:
    """Remove the temporary folders of builds of `name` on this machine whose process died."""
    for leftover in cache_dir.glob(f".{name}.building-{host}-*"):
        pid = leftover.name.removeprefix(f".{name}.building-{host}-").split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _fsync(path: pathlib.Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


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
    files: Sequence[pathlib.Path],
    tokenizer: Tokenizer,
    field: str | None,
    key: str,
    show: bool,
) -> None:
    dtype = _dtype(tokenizer.vocab_size)
    raw = field is None and callable(getattr(tokenizer, "encode_bytes", None))
    content = hashlib.blake2b(digest_size=16)
    lengths: list[np.ndarray] = [np.zeros(1, np.int64)]
    empty = 0
    sizes = [path.stat().st_size for path in files]
    bar = tqdm(
        total=sum(sizes),
        unit="B",
        unit_scale=True,
        desc=f"tokenizing {len(files)} file{'s' * (len(files) != 1)}",
        disable=not show,
        file=sys.stderr,
        dynamic_ncols=True,
    )

    def documents() -> Iterator[str | bytes]:
        nonlocal empty
        for number, (path, size) in enumerate(zip(files, sizes, strict=True), start=1):
            bar.set_postfix_str(f"file {number} of {len(files)}", refresh=False)
            found = file_documents(owner, path, path.read_bytes(), field=field, raw=raw)
            empty += not found
            left = size
            for document in found:  # a JSON Lines file advances the bar as it is tokenized
                yield document
                step = min(len(document), left)
                bar.update(step)
                left -= step
            bar.update(left)

    with bar, (folder / "tokens.bin").open("wb") as out:
        for chunk in _chunks(documents(), tokenizer):
            array = _chunk_ids(owner, chunk, tokenizer, dtype)
            out.write(array.data)
            content.update(array.data)
            lengths.append(np.fromiter((len(ids) + 1 for ids in chunk), np.int64, len(chunk)))
        out.flush()
        os.fsync(out.fileno())
    boundaries = np.cumsum(np.concatenate(lengths))
    if boundaries.shape[0] == 1:
        raise ValueError(
            f"{owner}: the corpus is empty: {len(files)} file(s) "
            f"({', '.join(repr(os.fspath(path)) for path in files[:3])}"
            f"{', ...' if len(files) > 3 else ''}) hold no text"
            f"{f' under the field {field!r}' if field else ''}."
        )
    content.update(boundaries.tobytes())
    np.save(folder / "documents.npy", boundaries)
    meta = {
        "format": FORMAT,
        "key": key,
        "content": content.hexdigest(),
        "dtype": dtype.str,
        "tokens": int(boundaries[-1]),
        "documents": int(boundaries.shape[0] - 1),
        "empty_files": empty,
        "files": [os.fspath(path) for path in files],
        "field": field,
        "tokenizer": describe(tokenizer),
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "eos_id": tokenizer.eos_id,
        "vocab_size": tokenizer.vocab_size,
    }
    (folder / "cache.json").write_text(json.dumps(meta, indent=1) + "\n")
    for name in ("documents.npy", "cache.json"):
        _fsync(folder / name)
    _fsync(folder)


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
    """The token cache of `files` under `tokenizer`: read where a whole one with the same key
    exists in `cache_dir`, else built (with a progress bar on stderr when `progress`, or
    when `progress is None` and stderr is a terminal) and then read."""
    cache_dir = default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir)
    key = _key(files, tokenizer, field, content_hash)
    name = f"tokens-{key}"
    final = cache_dir / name
    if final.is_dir() and (found := _load(final, key)) is not None:
        return found
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OSError(
            f"{owner}: cannot create the token cache folder {os.fspath(cache_dir)!r} "
            f"({error.strerror or error}); pass cache_dir= naming a writable folder."
        ) from None
    host = socket.gethostname().replace("-", "_")
    _sweep(cache_dir, name, host)
    building = cache_dir / f".{name}.building-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    building.mkdir()
    show = sys.stderr.isatty() if progress is None else bool(progress)
    try:
        _write(owner, building, files, tokenizer, field, key, show)
        # Another process may have finished the same cache meanwhile: theirs is read, ours
        # removed. A folder there that does not read back whole is damaged: replaced.
        if final.exists() and _load(final, key) is None:
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(building, final)
        except OSError:
            if not final.is_dir():
                raise
        _fsync(cache_dir)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    found = _load(final, key)
    if found is None:
        raise OSError(f"{owner}: the token cache at {os.fspath(final)!r} did not read back.")
    return dataclasses.replace(found, built=True)
