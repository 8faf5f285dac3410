"""A SentencePiece model file (`.model`) as a dew `Tokenizer`."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dew.data._optional import optional
from dew.data.tokenizers._protocol import existing_file, file_fingerprint

__all__ = ["SentencePieceTokenizer"]


class SentencePieceTokenizer:
    """A `sentencepiece.SentencePieceProcessor` read from a `.model` file (the
    `sentencepiece` extra).

    `encode` returns SentencePiece's own IDs for the text (no BOS or EOS: dew appends
    `eos_id` after each document itself); `encode_batch` encodes a list in SentencePiece's
    threads; `decode` leaves control pieces (BOS, EOS) out.

    **Arguments:**

    - `path`: the `.model` file.
    - `eos`: the end-of-document piece, as its text or its ID; by default the model's own
      EOS (`</s>` unless it was trained with another, or none).

    **Raises:** `FileNotFoundError` for a missing file; `ValueError` when the file is not a
    SentencePiece model or the model has no EOS piece and none is given; `ImportError`
    without `sentencepiece` (`pip install 'dew-ml[sentencepiece]'`).
    """

    def __init__(self, path: str | os.PathLike[str], *, eos: str | int | None = None) -> None:
        sentencepiece = optional("sentencepiece", "sentencepiece", "SentencePieceTokenizer")
        file = existing_file("SentencePieceTokenizer", path)
        self.path = os.fspath(path)
        try:
            self._processor = sentencepiece.SentencePieceProcessor(model_file=os.fspath(file))
        except Exception as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(
                f"SentencePieceTokenizer: {self.path!r} is not a SentencePiece model ({reason})."
            ) from None
        self._vocab_size = int(self._processor.get_piece_size())
        self._eos_id = self._find_eos(eos)
        self._fingerprint = file_fingerprint("sentencepiece", file, self._eos_id)

    def _find_eos(self, eos: str | int | None) -> int:
        if isinstance(eos, bool) or not isinstance(eos, str | int | None):
            raise TypeError(f"SentencePieceTokenizer's eos must be a piece or an ID, got {eos!r}.")
        if isinstance(eos, str):
            found = int(self._processor.piece_to_id(eos))
            if found == self._processor.unk_id() and eos != self._processor.id_to_piece(found):
                raise ValueError(
                    f"SentencePieceTokenizer: {self.path!r} has no piece {eos!r} (eos=)."
                )
            return found
        found = int(self._processor.eos_id()) if eos is None else eos
        if not 0 <= found < self._vocab_size:
            raise ValueError(
                f"SentencePieceTokenizer: {self.path!r} has no end-of-document piece (its eos "
                f"ID is {found}, its IDs are [0, {self._vocab_size})): pass "
                "SentencePieceTokenizer(path, eos=PIECE)."
            )
        return found

    @property
    def vocab_size(self) -> int:
        """The model's number of pieces."""
        return self._vocab_size

    @property
    def eos_id(self) -> int:
        """The end-of-document ID."""
        return self._eos_id

    @property
    def fingerprint(self) -> str:
        """A hash of the model file's bytes and `eos_id`."""
        return self._fingerprint

    def encode(self, text: str) -> list[int]:
        """SentencePiece's IDs of `text` (no BOS, no EOS)."""
        return self._processor.encode(text, out_type=int, add_bos=False, add_eos=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each of `texts`, in SentencePiece's threads."""
        return self._processor.encode(list(texts), out_type=int, add_bos=False, add_eos=False)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`, control pieces (BOS, EOS) left out."""
        return self._processor.decode(np.asarray(ids, np.int64).reshape(-1).tolist())

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.path!r})"
