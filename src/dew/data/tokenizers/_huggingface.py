"""A Hugging Face `tokenizers` file (`tokenizer.json`) as a dew `Tokenizer`."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dew.data._optional import optional
from dew.data.tokenizers._protocol import existing_file, file_fingerprint

__all__ = ["EOS_NAMES", "HFTokenizer"]

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")
"""The special tokens `HFTokenizer` takes as end-of-document, in this order, when no `eos`
is given (GPT-2's, T5's and Llama's, Llama 3's, Gemma's, and two common spellings)."""


class HFTokenizer:
    """A `tokenizers.Tokenizer` read from a `tokenizer.json` file (the `tokenizers` extra).

    `encode` returns `tokenizers`' own IDs for the text, without the special tokens a
    post-processor would add (dew appends `eos_id` after each document itself);
    `encode_batch` is `tokenizers`' parallel `encode_batch_fast`; `decode` skips special
    tokens.

    **Arguments:**

    - `path`: the `tokenizer.json` file.
    - `eos`: the end-of-document token, as its text or its ID. By default the first special
      token of the file named in `EOS_NAMES` (`"<|endoftext|>"`, `"</s>"`, ...).

    **Raises:** `FileNotFoundError` for a missing file; `ValueError` when the file is not a
    tokenizer or has no end-of-document token (naming its special tokens); `ImportError`
    without `tokenizers` (`pip install 'dew-ml[tokenizers]'`).
    """

    def __init__(self, path: str | os.PathLike[str], *, eos: str | int | None = None) -> None:
        tokenizers = optional("tokenizers", "tokenizers", "HFTokenizer")
        file = existing_file("HFTokenizer", path)
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(os.fspath(file))
        except Exception as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(
                f"HFTokenizer: {os.fspath(path)!r} is not a Hugging Face tokenizer.json ({reason})."
            ) from None
        self.path = os.fspath(path)
        vocabulary = self._tokenizer.get_vocab(with_added_tokens=True)
        self._vocab_size = max(vocabulary.values(), default=-1) + 1
        self._eos_id = self._find_eos(eos)
        self._fingerprint = file_fingerprint("hf", file, self._eos_id)

    def _find_eos(self, eos: str | int | None) -> int:
        if isinstance(eos, bool):
            raise TypeError(f"HFTokenizer's eos must be a token or an ID, got {eos!r}.")
        if isinstance(eos, int):
            if not 0 <= eos < self._vocab_size:
                raise ValueError(
                    f"HFTokenizer: eos={eos} is outside {self.path!r}'s IDs [0, "
                    f"{self._vocab_size})."
                )
            return eos
        if isinstance(eos, str):
            found = self._tokenizer.token_to_id(eos)
            if found is None:
                raise ValueError(f"HFTokenizer: {self.path!r} has no token {eos!r} (eos=).")
            return int(found)
        if eos is not None:
            raise TypeError(f"HFTokenizer's eos must be a token or an ID, got {eos!r}.")
        special = {
            added.content: int(index)
            for index, added in self._tokenizer.get_added_tokens_decoder().items()
            if added.special
        }
        for name in EOS_NAMES:
            if name in special:
                return special[name]
        listed = ", ".join(repr(name) for name in sorted(special)) or "none"
        raise ValueError(
            f"HFTokenizer: {self.path!r} has no end-of-document token among its special tokens "
            f"({listed}; dew looks for {', '.join(map(repr, EOS_NAMES))}): pass "
            "HFTokenizer(path, eos=TOKEN)."
        )

    @property
    def vocab_size(self) -> int:
        """One more than the largest ID in the file's vocabulary, added tokens included."""
        return self._vocab_size

    @property
    def eos_id(self) -> int:
        """The end-of-document ID."""
        return self._eos_id

    @property
    def fingerprint(self) -> str:
        """A hash of the file's bytes and `eos_id`."""
        return self._fingerprint

    def encode(self, text: str) -> list[int]:
        """`tokenizers`' IDs of `text` (no post-processor special tokens)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each of `texts`, in parallel (`tokenizers`' `encode_batch_fast`)."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`, special tokens (end-of-document included) left out."""
        return self._tokenizer.decode(np.asarray(ids, np.int64).reshape(-1).tolist())

    def __repr__(self) -> str:
        return f"HFTokenizer({self.path!r})"
