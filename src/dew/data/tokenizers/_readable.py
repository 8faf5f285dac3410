"""Token IDs as text a person reads: decoded by a tokenizer where there is one, the IDs
themselves where there is none, with a visible mark for what a tokenizer cannot decode."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dew.data.tokenizers._protocol import Tokenizer

__all__ = ["END_OF_DOCUMENT", "readable_text", "tokenizer_name"]

END_OF_DOCUMENT = "<eos>"
"""How readable text marks a tokenizer's end-of-document ID."""


def _unknown(token: int) -> str:
    return f"<id {token}>"


def readable_text(tokenizer: Tokenizer | None, ids: Sequence[int] | np.ndarray) -> str:
    """`ids` as text: `tokenizer.decode` of each stretch of ordinary IDs, `<eos>` for each
    end-of-document ID (`decode` would leave it out, joining two documents), and `<id N>`
    for an ID outside `[0, tokenizer.vocab_size)`, which a model with a larger vocabulary
    than its tokenizer may sample and no tokenizer decodes. Without a tokenizer (token IDs
    that no text made, as `token_windows`' synthetic chain), the IDs joined by spaces.

    ```python
    >>> from dew.data.tokenizers import BytesTokenizer
    >>> readable_text(BytesTokenizer(), [104, 105, 256, 33, 300])
    'hi<eos>!<id 300>'
    >>> readable_text(None, [3, 14, 15])
    '3 14 15'

    ```
    """
    values = [int(token) for token in np.asarray(ids).reshape(-1)]
    if tokenizer is None:
        return " ".join(map(str, values))
    eos, size = int(tokenizer.eos_id), int(tokenizer.vocab_size)
    pieces: list[str] = []
    stretch: list[int] = []
    for token in values:
        if token != eos and 0 <= token < size:
            stretch.append(token)
            continue
        if stretch:
            pieces.append(tokenizer.decode(stretch))
            stretch = []
        pieces.append(END_OF_DOCUMENT if token == eos else _unknown(token))
    if stretch:
        pieces.append(tokenizer.decode(stretch))
    return "".join(pieces)


def tokenizer_name(tokenizer: Tokenizer) -> str:
    """A tokenizer's file, else its name (`"bytes"`), else its class."""
    for attribute in ("path", "name"):
        value = getattr(tokenizer, attribute, None)
        if isinstance(value, str | os.PathLike):
            return os.fspath(value)
    return type(tokenizer).__name__
