"""One evaluation pass: score every coordinated batch and reduce the metrics."""

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from jaxtyping import PRNGKeyArray, PyTree

from dew._pass import SCORING_DOMAIN, run_pass, scoring_key
from dew.data import Partition, _lazily
from dew.metrics import Metric, MetricSet
from dew.objectives.base import Objective

__all__ = ["SCORING_DOMAIN", "Evaluation", "evaluate", "scoring_key"]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The result of one evaluation pass.

    - `scores`: bare metric name to value (empty for an empty pass or no metrics).
    - `coordinated_batches`: how many batches the pass consumed (under
      `jax.distributed`, batch indices every process had a batch for).
    - `records`: how many rows those batches held (every process's rows, counted on
      the placed global batch: scalar metadata adds none).
    - `uneven_shards`: whether a shard ended before another (its remaining rows were
      left out of the metrics).
    - `step`: the training step the pass scored.
    - `key`: the key the pass was scored with (batch `i` with `scoring_key(key, i)`).
    """

    scores: dict[str, float]
    coordinated_batches: int
    records: int
    uneven_shards: bool
    step: int
    key: PRNGKeyArray | None = dataclasses.field(default=None, compare=False, repr=False)


def evaluate(
    objective: Objective,
    params: PyTree,
    batches: Callable[[Partition], Iterable[Mapping[str, Any]]] | Iterable[Mapping[str, Any]],
    *,
    metrics: Sequence[Metric],
    key: PRNGKeyArray,
    step: int = 0,
    precision: str = "float32",
) -> Evaluation:
    """Score `params` on a pass of batches and reduce `metrics` over it.

    `batches` is an iterable of batches, or a dataset split (`Dataset.val`): a
    callable of this process's `Partition`. Batch `i` is scored with a key derived
    from `key` and `i` in a fixed scoring domain, so the same inputs give the same
    scores. Only the accumulator and the current contribution are held. An empty
    pass returns no scores; a non-empty pass with no counted language target raises.

    Under `jax.distributed` every process calls it with the same objective, params and
    key; each reads its own shard, the pass consumes the shortest coordinated prefix of
    the shards, and every process returns the same `Evaluation` (see
    docs/evaluation.md, "Several processes").

    `precision` is the policy the objective scores under (`"float32"`, `"bfloat16"` or
    `"mixed_bfloat16"`, as `Trainer(precision=...)`; docs/training.md, "Precision"): a
    bfloat16 policy casts the params and the batch's floating arrays to bfloat16 and hands
    the metrics the artifacts in float32, which they reduce with compensated sums.

    ```python
    >>> import jax, numpy as np
    >>> from dew import metrics
    >>> from dew.nn.backbones.causal_transformer import CausalTransformer
    >>> from dew.objectives.lm import LMObjective
    >>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1, num_heads=2,
    ...                           mlp_features=32, max_seq_len=16, key=jax.random.key(0))
    >>> objective = LMObjective(model, seq_len=8)
    >>> rows = np.tile(np.arange(9, dtype=np.int32) % 4, (8, 1))
    >>> result = evaluate(objective, objective.init_params(), [{"text": rows}],
    ...                   metrics=[metrics.perplexity()], key=jax.random.key(0))
    >>> sorted(result.scores), result.coordinated_batches, result.records
    (['perplexity'], 1, 8)

    ```
    """
    metric_set = MetricSet(metrics)
    if callable(batches):
        batches = _lazily(batches, Partition.current())
    result = run_pass(objective, params, batches, metric_set, key, precision=precision)
    return Evaluation(
        result.scores,
        result.batches,
        result.records,
        uneven_shards=result.uneven_shards,
        step=int(step),
        key=key,
    )
