"""The CLIP byte-pair-encoding tokenizer, giving open_clip's token IDs exactly.

Text is cleaned as open_clip's default `clean="lower"` does (`ftfy.fix_text`, `html.unescape`
twice, whitespace collapsed, lower case), split by CLIP's pattern (letters runs, one token per
digit, punctuation runs, English contractions), byte-encoded and merged by the ranked merges
of `bpe_simple_vocab_16e6.txt.gz` (shipped beside this module, MIT-licensed: see
`bpe_simple_vocab_16e6.LICENSE.txt`). Rows are `<start_of_text>` (49406), the tokens,
`<end_of_text>` (49407), then zeros; a row too long for the context is cut and ends in
`<end_of_text>`, as open_clip's does.

The cleaning and the pattern need `ftfy` and `regex` (`pip install dew-ml[clip]`).
"""

import functools
import gzip
import html
import itertools
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "END_OF_TEXT",
    "START_OF_TEXT",
    "VOCABULARY_PATH",
    "CLIPTokenizer",
    "tokenize",
]

VOCABULARY_PATH = pathlib.Path(__file__).with_name("bpe_simple_vocab_16e6.txt.gz")
START_OF_TEXT = 49406
END_OF_TEXT = 49407
_MERGES = 49152 - 256 - 2  # open_clip reads lines [1, 48895) of the file
_SPECIAL = ("<start_of_text>", "<end_of_text>")
_PATTERN = "|".join(_SPECIAL) + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def _optional(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        raise ImportError(
            f"The CLIP tokenizer needs the package {name!r} (it cleans and splits text as "
            "open_clip does); install it with `pip install dew-ml[clip]`."
        ) from None


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """CLIP's reversible map from each byte to a printable character."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes, strict=True)}


def _clean(text: str, ftfy: Any) -> str:
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).lower()


class CLIPTokenizer:
    """CLIP's tokenizer, as open_clip's `SimpleTokenizer` with its defaults.

    **Arguments:**

    - `vocabulary`: the gzipped merges file; by default the copy dew ships
      (`VOCABULARY_PATH`, identical to open_clip's).
    - `context_length`: tokens per row, 77 for every CLIP model.

    ```python
    >>> tokenizer = CLIPTokenizer()
    >>> tokenizer.encode("a photo of a cat")
    [320, 1125, 539, 320, 2368]
    >>> tokenizer(["a photo of a cat"])[0, :7].tolist()
    [49406, 320, 1125, 539, 320, 2368, 49407]

    ```
    """

    def __init__(
        self, vocabulary: str | os.PathLike[str] | None = None, *, context_length: int = 77
    ):
        if isinstance(context_length, bool) or not isinstance(context_length, int):
            raise TypeError(f"context_length must be an int, got {context_length!r}.")
        if context_length < 2:
            raise ValueError(
                f"context_length must be at least 2 (<start_of_text> and <end_of_text>), "
                f"got {context_length}."
            )
        self._ftfy = _optional("ftfy")
        regex = _optional("regex")
        path = pathlib.Path(VOCABULARY_PATH if vocabulary is None else vocabulary)
        if not path.is_file():
            raise FileNotFoundError(f"No CLIP vocabulary file at {str(path)!r}.")
        lines = gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")[1 : _MERGES + 1]
        merges = [tuple(line.split()) for line in lines]
        if len(merges) != _MERGES or any(len(merge) != 2 for merge in merges):
            raise ValueError(
                f"{str(path)!r} is not CLIP's vocabulary: it needs {_MERGES} merges of two "
                "symbols after its first line."
            )
        symbols = list(_bytes_to_unicode().values())
        vocabulary_list = [
            *symbols,
            *(s + "</w>" for s in symbols),
            *("".join(merge) for merge in merges),
            *_SPECIAL,
        ]
        self._encoder = {token: index for index, token in enumerate(vocabulary_list)}
        self._ranks = {merge: rank for rank, merge in enumerate(merges)}
        self._cache: dict[str, list[int]] = {s: [self._encoder[s]] for s in _SPECIAL}
        self._pattern = regex.compile(_PATTERN, regex.IGNORECASE)
        self.context_length = context_length
        self.vocab_size = len(self._encoder)

    def _bpe(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pairs = set(itertools.pairwise(parts))
            best = min(pairs, key=lambda pair: self._ranks.get(pair, len(self._ranks)))
            if best not in self._ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = self._cache[word] = [self._encoder[part] for part in parts]
        return ids

    def encode(self, text: str) -> list[int]:
        """The token IDs of `text`, without `<start_of_text>` and `<end_of_text>`."""
        if not isinstance(text, str):
            raise TypeError(f"CLIPTokenizer encodes str, got {type(text).__name__}: {text!r}.")
        byte_map = _bytes_to_unicode()
        ids: list[int] = []
        for piece in self._pattern.findall(_clean(text, self._ftfy)):
            ids.extend(self._bpe("".join(byte_map[b] for b in piece.encode("utf-8"))))
        return ids

    def __call__(self, texts: str | Sequence[str]) -> np.ndarray:
        """Token rows `(len(texts), context_length)` int32 (a single string is one row)."""
        if isinstance(texts, str):
            texts = [texts]
        rows = np.zeros((len(texts), self.context_length), np.int32)
        for row, text in enumerate(texts):
            ids = [START_OF_TEXT, *self.encode(text), END_OF_TEXT][: self.context_length]
            ids[-1] = END_OF_TEXT
            rows[row, : len(ids)] = ids
        return rows


@functools.cache
def _default_tokenizer(context_length: int) -> CLIPTokenizer:
    return CLIPTokenizer(context_length=context_length)


def tokenize(texts: str | Sequence[str], *, context_length: int = 77) -> np.ndarray:
    """`CLIPTokenizer()(texts)` with the shipped vocabulary (built once, then reused):
    token rows `(len(texts), context_length)` int32, as open_clip's `tokenize`."""
    return _default_tokenizer(context_length)(texts)
