"""Datasets: training and validation batches as functions of a process's partition, and
random-access sources whose training batch is a function of the step (`arrays`, `tokens`,
`text`, `image_folder`, `huggingface`, a Grain `MapDataset` through `map_dataset`, or any
`Rows` through `indexed_dataset`)."""

from dew.data._arrays import arrays as arrays
from dew.data._dataset import Batches as Batches
from dew.data._dataset import Dataset as Dataset
from dew.data._dataset import Partition as Partition
from dew.data._dataset import _lazily as _lazily
from dew.data._grain import map_dataset as map_dataset
from dew.data._huggingface import huggingface as huggingface
from dew.data._image_folder import image_folder as image_folder
from dew.data._indexed import InOrder as InOrder
from dew.data._indexed import Rows as Rows
from dew.data._indexed import StepBatches as StepBatches
from dew.data._indexed import Subset as Subset
from dew.data._indexed import indexed_dataset as indexed_dataset
from dew.data._text import text as text
from dew.data._tokens import tokens as tokens

__all__ = [
    "Batches",
    "Dataset",
    "InOrder",
    "Partition",
    "Rows",
    "StepBatches",
    "Subset",
    "arrays",
    "huggingface",
    "image_folder",
    "indexed_dataset",
    "map_dataset",
    "text",
    "tokens",
]
