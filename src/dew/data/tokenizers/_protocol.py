"""The `Tokenizer` protocol, what `tokenizer=` accepts, and the model-vocabulary check."""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Tokenizer",
    "check_vocabulary",
    "describe",
    "existing_file",
    "file_fingerprint",
]


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token IDs and back.

    - `encode(text) -> list[int] | array`: the IDs of one document's text, without the
      end-of-document ID (dew appends `eos_id` after each document itself).
    - `decode(ids) -> str`: the text of `ids`; end-of-document IDs are left out.
    - `vocab_size`: every ID `encode` returns lies in `[0, vocab_size)`, `eos_id` included.
    - `eos_id`: the end-of-document ID dew appends after each document.
    - `fingerprint`: a string that changes whenever `encode` could (a hash of the
      tokenizer's file, say); the token cache is keyed by it.

    Two optional methods are fast paths the token cache uses where a tokenizer has them:
    `encode_batch(texts) -> list of IDs` (many documents in one call) and
    `encode_bytes(data: bytes) -> IDs` (raw bytes, no UTF-8 decoding: the bytes tokenizer).
    """

    @property
    def vocab_size(self) -> int:
        """Every ID the tokenizer produces lies in `[0, vocab_size)`."""
        ...

    @property
    def eos_id(self) -> int:
        """The end-of-document ID dew appends after each document."""
        ...

    @property
    def fingerprint(self) -> str:
        """A string that changes whenever `encode` could."""
        ...

    def encode(self, text: str) -> Sequence[int] | np.ndarray:
        """The IDs of one document's text, without the end-of-document ID."""
        ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`, end-of-document IDs left out."""
        ...


def file_fingerprint(kind: str, path: pathlib.Path, *parts: object) -> str:
    """A hex digest of a tokenizer file's bytes, its kind and `parts` (its settings)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (kind, *parts):
        digest.update(repr(part).encode())
        digest.update(b"\x00")
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"{kind}-{digest.hexdigest()}"


def existing_file(owner: str, path: str | os.PathLike[str]) -> pathlib.Path:
    """`path` as a `Path`, or a `FileNotFoundError` naming it and `owner`."""
    found = pathlib.Path(path)
    if not found.is_file():
        what = "a folder, not a file" if found.is_dir() else "no such file"
        raise FileNotFoundError(f"{owner}: {os.fspath(path)!r} is {what}.")
    return found


def check_vocabulary(
    model_vocab_size: int, tokenizer: Tokenizer, *, model: str = "the model"
) -> None:
    """Refuse a model whose vocabulary cannot embed every ID `tokenizer` produces.

    A model's `vocab_size` may be larger than the tokenizer's (padded to a round number),
    never smaller. `model` names the model in the message.

    **Raises:** `ValueError` naming both sizes when `model_vocab_size < tokenizer.vocab_size`.

    ```python
    >>> from dew.data.tokenizers import BytesTokenizer
    >>> check_vocabulary(16, BytesTokenizer(), model="the model 'causal_transformer'")
    Traceback (most recent call last):
    ...
    ValueError: the model 'causal_transformer' has vocab_size=16, but the tokenizer 'bytes' ...

    ```
    """
    if model_vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"{model} has vocab_size={model_vocab_size}, but the tokenizer {describe(tokenizer)} "
            f"has vocab_size={tokenizer.vocab_size} (IDs 0 to {tokenizer.vocab_size - 1}): set "
            f"the model's vocab_size to {tokenizer.vocab_size} or more."
        )


def describe(tokenizer: Tokenizer) -> str:
    """How an error names `tokenizer`: its file where it has one, else its class."""
    for attribute in ("path", "name"):
        value = getattr(tokenizer, attribute, None)
        if isinstance(value, str | os.PathLike):
            return repr(os.fspath(value))
    return type(tokenizer).__name__
