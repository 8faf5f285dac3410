"""Train a byte-level BPE tokenizer on your own files with Hugging Face `tokenizers`."""

from __future__ import annotations

import os
import pathlib
import sys
import uuid
from collections.abc import Iterator, Sequence

from dew._integers import check_integer
from dew.data._documents import file_documents, resolve_files
from dew.data._optional import optional
from dew.data.tokenizers._huggingface import HFTokenizer

__all__ = ["END_OF_TEXT", "train_tokenizer"]

END_OF_TEXT = "<|endoftext|>"
"""The end-of-document token `train_tokenizer` adds (GPT-2's), ID 0 of the trained file."""

_ALPHABET = 256  # byte-level BPE starts from one symbol per byte


def train_tokenizer(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    vocab_size: int,
    out: str | os.PathLike[str],
    *,
    field: str | None = None,
    min_frequency: int = 2,
    overwrite: bool = False,
    progress: bool | None = None,
) -> HFTokenizer:
    """Train a byte-level BPE tokenizer (GPT-2's scheme: every byte has a symbol, so every
    text encodes, and merges are learned from your text) and save it as a Hugging Face
    `tokenizer.json` at `out`.

    The files are read as `dew.data.text` reads them (each plain-text file one document, or
    JSON Lines with `field`), as UTF-8 text. The trained file holds `END_OF_TEXT`
    (`"<|endoftext|>"`) as its end-of-document token, so `dew.data.text(tokenizer=out)` and
    `HFTokenizer(out)` find it. A small corpus may end below `vocab_size` (no pair left to
    merge); the returned tokenizer's `vocab_size` is the trained size.

    **Arguments:**

    - `files`: a file, a glob, or a list of them (as `dew.data.text`'s `paths`).
    - `vocab_size`: the vocabulary to reach: at least 257 (the 256 byte symbols and
      `END_OF_TEXT`).
    - `out`: the `tokenizer.json` to write (written to a temporary name, then renamed).
    - `field`: JSON Lines: the field that holds each line's text.
    - `min_frequency`: a pair merges only if it occurs at least this often.
    - `overwrite`: replace an existing `out` (otherwise it is refused).
    - `progress`: `tokenizers`' progress bar; `None` shows it where stderr is a terminal.

    **Returns:** the trained `HFTokenizer`.

    **Raises:** `ValueError` for a `vocab_size` below 257, an empty corpus, a file that is not
    UTF-8 or a JSON Lines line without `field` (file and line); `FileNotFoundError` for a
    missing file or a glob that matches nothing; `FileExistsError` for an existing `out`
    without `overwrite=True`; `ImportError` without `tokenizers` (`dew-ml[tokenizers]`).
    """
    tokenizers = optional("tokenizers", "tokenizers", "train_tokenizer")
    owner = "train_tokenizer"
    least = _ALPHABET + 1
    vocab_size = check_integer(f"{owner}: vocab_size", vocab_size, minimum=1)
    if vocab_size < least:
        raise ValueError(
            f"{owner}: vocab_size must be at least {least} (the {_ALPHABET} byte symbols and "
            f"{END_OF_TEXT!r}), got {vocab_size}."
        )
    min_frequency = check_integer(f"{owner}: min_frequency", min_frequency, minimum=0)
    target = pathlib.Path(out)
    if target.is_dir():
        raise IsADirectoryError(f"{owner}: out={os.fspath(out)!r} is a folder; name a file.")
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"{owner}: {os.fspath(out)!r} exists; pass overwrite=True to replace it."
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{owner}: no folder {os.fspath(target.parent)!r} for out.")
    paths = resolve_files(owner, files)
    documents = 0

    def texts() -> Iterator[str]:
        nonlocal documents
        for path in paths:
            for document in file_documents(owner, path, path.read_bytes(), field=field, raw=False):
                documents += 1
                yield document  # type: ignore[misc]

    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty() if progress is None else bool(progress),
    )
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    if documents == 0:
        raise ValueError(
            f"{owner}: the corpus is empty: {len(paths)} file(s) hold no text"
            f"{f' under the field {field!r}' if field else ''}."
        )
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tokenizer.save(os.fspath(temporary))
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return HFTokenizer(target)
