"""Tokenizers: text to token IDs and back, behind one small protocol (`Tokenizer`).

- `BytesTokenizer` (`"bytes"`): each byte its own ID, 256 the end of a document; built in.
- `HFTokenizer`: a Hugging Face `tokenizer.json` (`pip install 'dew-ml[tokenizers]'`).
- `SentencePieceTokenizer`: a SentencePiece `.model` (`pip install 'dew-ml[sentencepiece]'`).
- `load_tokenizer(name_path_or_tokenizer)`: what `dew.data.text(tokenizer=...)` accepts.
- `train_tokenizer(files, vocab_size, out)`: a byte-level BPE `tokenizer.json` trained on
  your files with `tokenizers` (what `dew data tokenizer` runs).
- `check_vocabulary(model_vocab_size, tokenizer)`: a model too small for the tokenizer's IDs
  is refused, naming both sizes (a run configuration checks it before training).
"""

from dew.data.tokenizers._bytes import BytesTokenizer as BytesTokenizer
from dew.data.tokenizers._huggingface import EOS_NAMES as EOS_NAMES
from dew.data.tokenizers._huggingface import HFTokenizer as HFTokenizer
from dew.data.tokenizers._load import load_tokenizer as load_tokenizer
from dew.data.tokenizers._protocol import Tokenizer as Tokenizer
from dew.data.tokenizers._protocol import check_vocabulary as check_vocabulary
from dew.data.tokenizers._sentencepiece import SentencePieceTokenizer as SentencePieceTokenizer
from dew.data.tokenizers._training import END_OF_TEXT as END_OF_TEXT
from dew.data.tokenizers._training import train_tokenizer as train_tokenizer

__all__ = [
    "END_OF_TEXT",
    "EOS_NAMES",
    "BytesTokenizer",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "check_vocabulary",
    "load_tokenizer",
    "train_tokenizer",
]
