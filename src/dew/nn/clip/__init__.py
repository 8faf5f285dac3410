"""open_clip's CLIP in Equinox: the image and text towers, open_clip's preprocessing and
CLIP's byte-pair-encoding tokenizer, reading open_clip's checkpoints without torch.

```python
>>> from dew.nn.clip import tokenize
>>> tokenize(["a photo of a cat"])[0, :7].tolist()
[49406, 320, 1125, 539, 320, 2368, 49407]

```
"""

from dew.nn.clip._model import CLIP as CLIP
from dew.nn.clip._model import MODELS as MODELS
from dew.nn.clip._model import CLIPConfig as CLIPConfig
from dew.nn.clip._preprocess import CLIP_MEAN as CLIP_MEAN
from dew.nn.clip._preprocess import CLIP_STD as CLIP_STD
from dew.nn.clip._preprocess import preprocess as preprocess
from dew.nn.clip._tokenizer import END_OF_TEXT as END_OF_TEXT
from dew.nn.clip._tokenizer import START_OF_TEXT as START_OF_TEXT
from dew.nn.clip._tokenizer import VOCABULARY_PATH as VOCABULARY_PATH
from dew.nn.clip._tokenizer import CLIPTokenizer as CLIPTokenizer
from dew.nn.clip._tokenizer import tokenize as tokenize

__all__ = [
    "CLIP",
    "CLIP_MEAN",
    "CLIP_STD",
    "END_OF_TEXT",
    "MODELS",
    "START_OF_TEXT",
    "VOCABULARY_PATH",
    "CLIPConfig",
    "CLIPTokenizer",
    "preprocess",
    "tokenize",
]
