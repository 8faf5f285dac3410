"""A pass's result, the key each batch of a pass is scored with, and a batch's rows."""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from dew._domains import scoring_key as scoring_key
from dew.artifacts import Artifact


@dataclasses.dataclass(frozen=True)
class PassResult:
    """What one pass produced.

    - `scores`: bare metric name to value (empty for an empty pass or no metrics).
    - `batches`: how many batches the pass consumed (the coordinated batches); `records`:
      the rows they held, counted on the placed global batch (every process's rows).
    - `first_artifact`: the first batch's scoring artifact when it was asked for (a
      preview reuses it) or when there were host metrics, else `None`.
    - `first_batch`: the first batch itself (`None` for an empty pass); under
      `jax.distributed`, the placed global batch.
    - `uneven_shards`: whether some process still had a batch when another's shard had
      ended (its remaining rows never entered the metrics); always `False` in one process.
    - `conditioning_sha256`: with `run_pass(conditioning=...)`, the identity of the rows'
      conditioning values (`ConditioningDigest`); `None` without, or when no batch had any.
    """

    scores: dict[str, float]
    batches: int
    records: int
    first_artifact: Artifact | None
    first_batch: Mapping[str, Any] | None
    uneven_shards: bool = False
    conditioning_sha256: str | None = None


def _rows(batch: Mapping[str, Any]) -> int:
    """The rows of a batch: the leading axis of its arrays (scalar metadata adds none)."""
    for leaf in jax.tree.leaves(batch):
        shape = np.shape(leaf)
        if shape:
            return int(shape[0])
    raise ValueError("an evaluation batch holds no arrays with a row axis.")
