"""One evaluation pass: score every coordinated batch and reduce the metrics."""

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PRNGKeyArray, PyTree

from dew._checks import explain_failure
from dew.artifacts import Artifact
from dew.data import Partition
from dew.metrics import Metric, MetricSet
from dew.objectives.base import Objective

__all__ = ["SCORING_DOMAIN", "Evaluation", "evaluate"]

# Fixed RNG domains: scoring draws and preview draws never share a key stream.
SCORING_DOMAIN = 0x5C0
PREVIEW_DOMAIN = 0x9EE


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The result of one evaluation pass.

    - `scores`: bare metric name to value (empty for an empty pass or no metrics).
    - `coordinated_batches`: how many batches the pass consumed.
    - `records`: how many rows those batches held.
    - `uneven_shards`: whether a shard ended before another (its remaining rows were
      left out of the metrics).
    - `step`: the training step the pass scored.
    """

    scores: dict[str, float]
    coordinated_batches: int
    records: int
    uneven_shards: bool
    step: int


@eqx.filter_jit
def _score(objective: Objective, params: PyTree, batch: Mapping[str, Any], key: PRNGKeyArray):
    return objective.evaluate(params, batch, key)


def _rows(batch: Mapping[str, Any]) -> int:
    """The rows of a batch: the leading axis of its arrays (scalar metadata adds none)."""
    shapes = [np.shape(leaf) for leaf in jax.tree.leaves(batch)]
    rows = [shape[0] for shape in shapes if shape]
    if not rows:
        raise ValueError("an evaluation batch holds no arrays with a row axis.")
    return int(rows[0])


def scoring_key(key: PRNGKeyArray, batch_index: int) -> PRNGKeyArray:
    """The key batch `batch_index` of a pass is scored with, in the scoring domain."""
    return jax.random.fold_in(jax.random.fold_in(key, SCORING_DOMAIN), batch_index)


def run_pass(
    objective: Objective,
    params: PyTree,
    batches: Iterable[Mapping[str, Any]],
    metrics: MetricSet,
    key: PRNGKeyArray,
) -> tuple[dict[str, float], int, int, Artifact | None, Mapping[str, Any] | None]:
    """Score and reduce a pass; returns scores, batches, records, and the first batch's
    scoring artifact and batch (for a preview that reuses them)."""
    state = metrics.init()
    first_artifact = first_batch = None
    count = records = 0
    for index, batch in enumerate(batches):
        count, records = count + 1, records + _rows(batch)
        if first_batch is None:
            first_batch = batch
        if not metrics.metrics:
            continue
        with explain_failure(objective, batch):
            artifact = _score(objective, params, batch, scoring_key(key, index))
        if first_artifact is None:
            first_artifact = artifact
        state = metrics.update(state, artifact)
    if count == 0 or not metrics.metrics:
        return {}, count, records, first_artifact, first_batch
    scores = {name: float(value) for name, value in metrics.finalize(state).items()}
    return scores, count, records, first_artifact, first_batch


def evaluate(
    objective: Objective,
    params: PyTree,
    batches: Callable[[Partition], Iterable[Mapping[str, Any]]] | Iterable[Mapping[str, Any]],
    *,
    metrics: Sequence[Metric],
    key: PRNGKeyArray,
    step: int = 0,
) -> Evaluation:
    """Score `params` on a pass of batches and reduce `metrics` over it.

    `batches` is an iterable of batches, or a dataset split (`Dataset.val`): a
    callable of this process's `Partition`. Batch `i` is scored with a key derived
    from `key` and `i` in a fixed scoring domain, so the same inputs give the same
    scores. Only the accumulator and the current contribution are held. An empty
    pass returns no scores; a non-empty pass with no counted language target raises.

    ```python
    >>> import jax, numpy as np
    >>> from dew import metrics
    >>> from dew.nn.backbones.causal_transformer import CausalTransformer
    >>> from dew.objectives.lm import LMObjective
    >>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1, num_heads=2,
    ...                           mlp_features=32, max_seq_len=16)
    >>> objective = LMObjective(model, seq_len=8)
    >>> rows = np.tile(np.arange(9, dtype=np.int32) % 4, (8, 1))
    >>> result = evaluate(objective, objective.init_params(), [{"text": rows}],
    ...                   metrics=[metrics.perplexity()], key=jax.random.key(0))
    >>> sorted(result.scores), result.coordinated_batches, result.records
    (['perplexity'], 1, 8)

    ```
    """
    if jax.process_count() > 1:
        raise RuntimeError(
            "evaluate runs in one process for now: coordinated multi-process passes arrive "
            "with dew's jax.distributed support."
        )
    metric_set = MetricSet(metrics)
    if callable(batches):
        batches = batches(Partition.current())
    scores, count, records, _, _ = run_pass(objective, params, batches, metric_set, key)
    return Evaluation(scores, count, records, uneven_shards=False, step=int(step))
