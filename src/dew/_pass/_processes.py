"""How the processes of a `jax.distributed` run agree on a pass: `run_pass`'s strategy
under `jax.distributed`, each process running the pass over its own shard.

The processes read the shortest coordinated prefix of their shards, check each local batch
on the host and agree on the outcome before anything collective runs, place it as one global
batch, and run the same compiled call over global arrays, so the device metrics reduce over
every process's rows. Only process zero updates and finalizes the host metrics (on the
artifacts gathered by `collective_host`) and shares their values.
"""

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import jax
from jaxtyping import PRNGKeyArray, PyTree

from dew._host import collective_host
from dew._pass._placing import AgreedBatches, _everywhere, _local
from dew._pass._reducer import _plan_for
from dew._processes import (
    agree_process_phase,
    broadcast_json,
    is_process_zero,
    replicated,
)
from dew.artifacts import Artifact
from dew.metrics import MetricSet
from dew.objectives.base import Objective

_T = TypeVar("_T")


class _GlobalReducer:
    """One pass's replicated accumulator over its plan's calls on global arrays (batches
    checked on the host, every process holding the whole accumulator)."""

    def __init__(
        self,
        objective: Objective,
        params: PyTree,
        metrics: MetricSet,
        key: PRNGKeyArray,
        precision: str = "float32",
    ) -> None:
        self.metrics = metrics
        self.precision = precision
        self.plan = _plan_for(objective, metrics, jax.tree.structure(params))
        self.objective_leaves, self.metric_leaves = self.plan.replicated_leaves()
        self.params = jax.tree.leaves(_everywhere(params))
        self.key = _everywhere(key)
        self.accumulator = replicated(self.plan.initial)
        if self.plan.devices:  # one on each device, merged at the end (decision 0089)
            self.accumulator = self.plan.spread(self.accumulator)

    def add(self, batch: Mapping[str, Any], index: int, keep: bool) -> Artifact | None:
        """Score the placed global `batch` and merge its statistics; the artifact when
        `keep`."""
        self.accumulator, artifact = self.plan.global_variant(keep, self.precision)(
            self.accumulator,
            batch,
            index,
            self.key,
            self.params,
            self.objective_leaves,
            self.metric_leaves,
        )
        return artifact

    def finalize(self) -> dict[str, Any]:
        """Finalized by every process on its own copy of the replicated accumulator: the
        same values everywhere, so a pass with no counted target raises the same error on
        each."""
        if not self.metrics.metrics:
            return {}
        accumulator = self.accumulator
        if self.plan.devices:
            accumulator = self.plan.gather(accumulator, self.metric_leaves)
        return self.plan.finalize([_local(leaf) for leaf in accumulator], self.plan.metric_leaves)


class Processes:
    """`run_pass`'s agreement under `jax.distributed` (`OneProcess` is the one-process
    strategy): the batches coordinated and placed as global batches, the host metrics'
    work done on process zero with its outcome agreed, values gathered and shared."""

    def __init__(self) -> None:
        self._shards: Any = None

    reducer = _GlobalReducer
    """The pass's accumulator, built from `(objective, params, metrics, key, precision)`."""

    def batches(
        self, objective: Objective, batches: Iterable[Mapping[str, Any]], keep_first: bool
    ) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any], bool]]:
        """Each process's batch and the placed global batch, while every process has one;
        each batch checked on the host, its outcome and layout agreed; and whether any
        process keeps the first artifact (agreed in the first block's exchange)."""
        self._shards = AgreedBatches(objective, batches, keep_first)
        for local, placed in self._shards:
            yield local, placed, self._shards.keep_first

    @property
    def uneven(self) -> bool:
        """Whether some process still had a batch when another's shard had ended."""
        return self._shards is not None and self._shards.uneven

    def explained(self, objective: Objective, batch: Mapping[str, Any]) -> Any:
        """Nothing to explain: every batch was checked on the host before its call."""
        return contextlib.nullcontext()

    def on_zero(self, phase: str, work: Callable[..., _T], *args: Any) -> _T | None:
        """`work(*args)` on process zero, its outcome agreed by every process (the same
        error raised on all when it failed); `None` on the other processes."""
        value: Any = None
        outcome: bool | BaseException = True
        if is_process_zero():
            try:
                value = work(*args)
            except Exception as error:
                outcome = error
        agree_process_phase(phase, outcome)
        return value

    def gathered(self, tree: _T) -> _T:
        """`tree`'s global arrays gathered on the host of every process."""
        return collective_host(tree)

    def shared(self, value: _T) -> _T:
        """Process zero's `value` (JSON data) on every process."""
        return broadcast_json(value)
