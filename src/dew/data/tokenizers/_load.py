"""What `tokenizer=` accepts: a name, a tokenizer file's path, or a `Tokenizer`."""

from __future__ import annotations

import os

from dew.data.tokenizers._bytes import BytesTokenizer
from dew.data.tokenizers._huggingface import HFTokenizer
from dew.data.tokenizers._protocol import Tokenizer
from dew.data.tokenizers._sentencepiece import SentencePieceTokenizer

__all__ = ["load_tokenizer"]


def load_tokenizer(tokenizer: object) -> Tokenizer:
    """The tokenizer `tokenizer` names.

    **Arguments:**

    - `tokenizer`: `"bytes"` (`BytesTokenizer`: the 256 byte values and an end-of-document ID);
      a path to a Hugging Face `tokenizer.json` (any name ending `.json`: `HFTokenizer`); a
      path to a SentencePiece `.model` file (`SentencePieceTokenizer`); or an object with the
      `Tokenizer` protocol, returned as it is. A run configuration (TOML) can name only the
      first three, as strings.

    **Raises:** `ValueError` for a string that is none of these, `FileNotFoundError` for a
    missing file, `TypeError` for another object, `ImportError` naming the extra
    (`dew-ml[tokenizers]`, `dew-ml[sentencepiece]`) when its package is missing.

    ```python
    >>> load_tokenizer("bytes").vocab_size
    257

    ```
    """
    if isinstance(tokenizer, str | os.PathLike):
        name = os.fspath(tokenizer)
        if name == "bytes":
            return BytesTokenizer()
        if name.endswith(".json"):
            return HFTokenizer(name)
        if name.endswith(".model"):
            return SentencePieceTokenizer(name)
        raise ValueError(
            f"tokenizer must be 'bytes', a Hugging Face tokenizer.json path (ending .json), a "
            f"SentencePiece .model path or a Tokenizer object, got {name!r}."
        )
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    raise TypeError(
        "tokenizer must be 'bytes', a tokenizer.json or .model path, or an object with the "
        "dew.data.tokenizers.Tokenizer protocol (encode, decode, vocab_size, eos_id, "
        f"fingerprint), got {type(tokenizer).__name__}."
    )
