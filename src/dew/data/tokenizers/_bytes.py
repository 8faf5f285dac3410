"""The bytes tokenizer: a document's UTF-8 bytes as IDs 0-255, end-of-document 256."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

__all__ = ["BytesTokenizer"]


class BytesTokenizer:
    """Each byte of a document is its own ID (`0 .. 255`); `256` ends a document.

    Nothing to train or download, and every file reads: `encode_bytes` takes raw bytes, so a
    file that is not UTF-8 still tokenizes (the token cache reads plain-text files as bytes
    with this tokenizer). `decode` leaves end-of-document IDs out and decodes the bytes as
    UTF-8, an invalid sequence becoming U+FFFD (`errors="replace"`).

    ```python
    >>> tokenizer = BytesTokenizer()
    >>> tokenizer.encode("hé").tolist(), tokenizer.vocab_size, tokenizer.eos_id
    ([104, 195, 169], 257, 256)
    >>> tokenizer.decode([104, 105, 256, 33])
    'hi!'

    ```
    """

    name: ClassVar[str] = "bytes"
    # Plain class attributes, not ClassVars: the `Tokenizer` protocol declares them as
    # properties, which a ClassVar does not satisfy for a type checker.
    vocab_size: int = 257
    eos_id: int = 256
    fingerprint: str = "bytes-1"

    def encode(self, text: str) -> np.ndarray:
        """The UTF-8 bytes of `text` as IDs (uint16)."""
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """`data`'s bytes as IDs (uint16), no decoding."""
        return np.frombuffer(data, np.uint8).astype(np.uint16)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode` of each of `texts`."""
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`, end-of-document IDs left out, invalid UTF-8 replaced.

        **Raises:** `ValueError` naming the first ID outside `[0, 257)`.
        """
        values = np.asarray(ids, np.int64).reshape(-1)
        outside = (values < 0) | (values >= self.vocab_size)
        if outside.any():
            position = int(np.argmax(outside))
            raise ValueError(
                f"BytesTokenizer.decode: ID {int(values[position])} at position {position} is "
                f"outside [0, {self.vocab_size})."
            )
        return values[values != self.eos_id].astype(np.uint8).tobytes().decode("utf-8", "replace")

    def __repr__(self) -> str:
        return "BytesTokenizer()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BytesTokenizer)

    def __hash__(self) -> int:
        return hash(self.fingerprint)
