"""Reducing several metrics over one pass."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from dew._checks import settle_failed_calls
from dew._integers import check_integer
from dew.artifacts import Artifact
from dew.metrics._base import Metric

__all__ = ["MetricSet", "reduce"]


class MetricSet(Metric[Artifact]):
    """Several metrics reduced together over one pass, like `optax.chain` for metrics.

    A set is itself a metric over the tuple of its members' statistics: `init()` is
    the tuple of their identities, `set(artifact)` the tuple of one batch's
    statistics, `merge` merges member by member, and `finalize` gives every member's
    value. So a set goes wherever a metric goes (`evaluate(metrics=...)`, the
    Trainer's `metrics=`, another set), and sets nest.

    The values are keyed by the members' own bare names, a nested set's members
    included (its results are flattened into the enclosing set's, in order), so a
    nested set scores exactly as the flat set of the same metrics. Names must
    therefore be unique across the whole nest, and every metric must read one
    artifact type. `reduce` folds an iterable of artifacts, holding only the
    accumulator and the current contribution; `reduce_stacked` runs the whole pass
    as one compiled `lax.scan` over artifacts stacked along a leading batch axis.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew import metrics
    >>> from dew.artifacts import TokenScores
    >>> pass_metrics = MetricSet((metrics.perplexity(), metrics.mean_loss()))
    >>> batch = TokenScores(losses=jnp.zeros((2, 3)), weights=jnp.ones((2, 3)))
    >>> {name: float(value) for name, value in pass_metrics.reduce([batch, batch]).items()}
    {'perplexity': 1.0, 'mean_loss': 0.0}
    >>> nested = MetricSet((MetricSet((metrics.perplexity(),)), metrics.mean_loss()))
    >>> state = nested.merge(nested.init(), nested(batch))
    >>> {name: float(value) for name, value in nested.finalize(state).items()}
    {'perplexity': 1.0, 'mean_loss': 0.0}

    ```
    """

    metrics: tuple[Metric, ...]

    def __init__(self, metrics: Sequence[Metric]) -> None:
        metrics = tuple(metrics)
        for metric in metrics:
            if not isinstance(metric, Metric):
                raise TypeError(
                    f"MetricSet takes Metric instances, got {metric!r} of type "
                    f"{type(metric).__name__}."
                )
        flat = _flatten(metrics)
        kinds = sorted({metric.artifact_type.__name__ for metric in flat})
        if len(kinds) > 1:
            raise ValueError(
                f"a pass reads one artifact type, but these metrics read {kinds}; reduce each "
                "artifact type in its own MetricSet."
            )
        duplicates = sorted(name for name, n in Counter(m.name for m in flat).items() if n > 1)
        if duplicates:
            nested = any(isinstance(metric, MetricSet) for metric in metrics)
            keyed = " (a nested set's values are keyed by its metrics' own names)"
            raise ValueError(
                f"metric names must be unique within a pass, got {duplicates} more than once"
                f"{keyed if nested else ''}; "
                "give one of them another name (for example psnr(name='psnr_full_range'))."
            )
        self.metrics = metrics

    @property
    def name(self) -> str:
        """The set's own name, used in its messages only: its values are keyed by its
        metrics' names."""
        return "metric_set"

    # A single metric's class variables; a set's follow from its metrics.
    @property
    def artifact_type(self) -> type[Artifact]:  # pyright: ignore[reportIncompatibleVariableOverride]
        """The artifact type every metric of the set reads (any artifact when empty)."""
        flat = self.flat_metrics
        return flat[0].artifact_type if flat else Artifact

    @property
    def host(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        """Whether any metric of the set is a host metric (then the set is one)."""
        return not self.on_device

    @property
    def scan_chunk(self) -> int | None:  # pyright: ignore[reportIncompatibleVariableOverride]
        """The smallest `scan_chunk` of the set's metrics (None when none asks for one)."""
        hints = [m.scan_chunk for m in self.flat_metrics if m.scan_chunk is not None]
        return min(hints) if hints else None

    @property
    def flat_metrics(self) -> tuple[Metric, ...]:
        """Every metric of the set, nested sets' metrics in their place, in order."""
        return _flatten(self.metrics)

    @property
    def names(self) -> tuple[str, ...]:
        """The bare names of the set's values, in order (nested sets flattened)."""
        return tuple(metric.name for metric in self.flat_metrics)

    @property
    def direction(self) -> str | None:
        """A set has no direction of its own (`None`): its metrics' are `directions`."""
        return None

    @property
    def directions(self) -> dict[str, str | None]:
        """Each metric's bare name and its `direction` (nested sets flattened), as a fit
        records them in its `FitStarted` record (decision 0064)."""
        return {metric.name: metric.direction for metric in self.flat_metrics}

    @property
    def on_device(self) -> bool:
        """Whether every metric is a device metric, so the pass can run in one scan."""
        return not any(metric.host for metric in self.flat_metrics)

    def split_by_host(self) -> tuple[MetricSet, MetricSet]:
        """The set's device metrics and its host metrics, each as a flat set, in order."""
        flat = self.flat_metrics
        return (
            MetricSet(tuple(m for m in flat if not m.host)),
            MetricSet(tuple(m for m in flat if m.host)),
        )

    def init(self) -> tuple[Any, ...]:
        """The identity accumulator: each metric's identity statistics."""
        return tuple(metric.init() for metric in self.metrics)

    def statistics(self, artifact: Artifact) -> tuple[Any, ...]:
        """One batch's statistics of every metric; each metric checks the artifact's
        type, so a wrong one raises the `TypeError` naming that metric."""
        return tuple(
            metric.statistics(artifact) if isinstance(metric, MetricSet) else metric(artifact)
            for metric in self.metrics
        )

    def merge(self, accumulated: tuple[Any, ...], contribution: tuple[Any, ...]) -> tuple[Any, ...]:
        """Merge two accumulators metric by metric; associative, with `init()` as unit."""
        return tuple(
            metric.merge(state, part)
            for metric, state, part in zip(self.metrics, accumulated, contribution, strict=True)
        )

    def update(self, accumulated: tuple[Any, ...], artifact: Artifact) -> tuple[Any, ...]:
        """Merge one batch's contribution of every metric into the accumulator:
        `merge(accumulated, statistics(artifact))`."""
        return self.merge(accumulated, self.statistics(artifact))

    def finalize(self, accumulated: tuple[Any, ...]) -> dict[str, Any]:
        """Each metric's value keyed by its bare name; a nested set's values in its place."""
        values: dict[str, Any] = {}
        for metric, state in zip(self.metrics, accumulated, strict=True):
            if isinstance(metric, MetricSet):
                values |= metric.finalize(state)
            else:
                values[metric.name] = metric.finalize(state)
        return values

    def _finalize_compiled(self, accumulated: tuple[Any, ...]) -> dict[str, Any]:
        """`finalize` in one compiled call; when a metric's check fires in it (a pass
        with no counted target), finalize again eagerly to raise dew's own ValueError."""
        if not self.metrics:
            return {}
        try:
            # Waited for inside the try: a check that fires in the call may surface
            # only when its result is ready.
            scores = jax.block_until_ready(_compiled_finalize(self, accumulated))
        except (RuntimeError, ValueError):
            settle_failed_calls()
            return self.finalize(accumulated)
        return {name: scores[name] for name in self.names}  # jit returns dicts key-sorted

    def reduce(self, artifacts: Iterable[Artifact]) -> dict[str, Any]:
        """Fold a pass of artifacts and finalize it.

        Device metrics update in one compiled call per batch; host metrics update
        eagerly. An empty pass finalizes the identity.
        """
        device, host = self.split_by_host()
        device_state, host_state = device.init(), host.init()
        for artifact in artifacts:
            device_state = _compiled_update(device, device_state, artifact)
            host_state = host.update(host_state, artifact)
        scores = device._finalize_compiled(device_state) | host.finalize(host_state)
        return {name: scores[name] for name in self.names}

    def reduce_stacked(self, stacked: Artifact, *, chunk: int | None = None) -> dict[str, Any]:
        """Reduce a whole pass in one compiled call.

        `stacked` is one artifact whose arrays carry a leading axis of batches
        (`stack_batches(batches)`). The pass runs as a `lax.scan` over chunks of
        `chunk` batches: each chunk's statistics are computed at once (`vmap`) and
        merged in order. By default the chunk is the smallest `scan_chunk` of the
        metrics: the whole pass at once for metrics that stream through memory, a
        few batches for metrics with large intermediates (SSIM). Every metric must
        be a device metric.
        """
        if not self.on_device:
            hosts = [metric.name for metric in self.flat_metrics if metric.host]
            raise ValueError(
                f"reduce_stacked runs on the device, but {hosts} are host metrics; use reduce."
            )
        size: int = (
            chunk if chunk is not None else self.scan_chunk or jax.tree.leaves(stacked)[0].shape[0]
        )
        check_integer("chunk", size, minimum=1, optional=True)  # the message names None too
        if not self.metrics:
            return {}
        try:  # the pass and its finalize in one compiled call
            scores = jax.block_until_ready(_compiled_scan_and_finalize(self, stacked, size))
        except (RuntimeError, ValueError):  # a check fired: raise dew's own error eagerly
            settle_failed_calls()
            return self.finalize(_compiled_scan(self, stacked, size))
        return {name: scores[name] for name in self.names}  # jit returns dicts key-sorted


@eqx.filter_jit
def _compiled_update(metrics: MetricSet, state: tuple[Any, ...], artifact: Artifact):
    return metrics.update(state, artifact)


@eqx.filter_jit
def _compiled_finalize(metrics: MetricSet, accumulated: tuple[Any, ...]) -> dict[str, Any]:
    return metrics.finalize(accumulated)


@eqx.filter_jit
def _compiled_scan(metrics: MetricSet, stacked: Artifact, chunk: int) -> tuple[Any, ...]:
    # Returns the accumulator; finalizing outside the compiled call gives reduce and
    # reduce_stacked the same errors (a plain ValueError for a pass with no target).
    batches = jax.tree.leaves(stacked)[0].shape[0]
    chunk = max(1, min(chunk, batches))
    whole = batches - batches % chunk

    def merge_all(state, contributions, count):
        for index in range(count):
            state = metrics.merge(state, jax.tree.map(lambda leaf, i=index: leaf[i], contributions))
        return state

    def step(state, chunk_of_batches):
        return merge_all(state, jax.vmap(metrics)(chunk_of_batches), chunk), None

    chunks = jax.tree.map(lambda leaf: leaf[:whole].reshape(-1, chunk, *leaf.shape[1:]), stacked)
    state, _ = jax.lax.scan(step, metrics.init(), chunks)
    if whole < batches:
        rest = jax.tree.map(lambda leaf: leaf[whole:], stacked)
        state = merge_all(state, jax.vmap(metrics)(rest), batches - whole)
    return state


@eqx.filter_jit
def _compiled_scan_and_finalize(
    metrics: MetricSet, stacked: Artifact, chunk: int
) -> dict[str, Any]:
    return metrics.finalize(_compiled_scan(metrics, stacked, chunk))


def _flatten(metrics: tuple[Metric, ...]) -> tuple[Metric, ...]:
    """`metrics` with every nested set replaced by its own metrics, in order."""
    return tuple(
        leaf
        for metric in metrics
        for leaf in (metric.flat_metrics if isinstance(metric, MetricSet) else (metric,))
    )


def reduce(metrics: Sequence[Metric], artifacts: Iterable[Artifact]) -> dict[str, Any]:
    """Reduce `metrics` over a pass of `artifacts`: `MetricSet(metrics).reduce(artifacts)`."""
    return MetricSet(metrics).reduce(artifacts)


def stack_batches(artifacts: Sequence[Artifact]) -> Artifact:
    """Stack equally shaped artifacts along a new leading batch axis, for `reduce_stacked`."""
    if not artifacts:
        raise ValueError("stack_batches needs at least one artifact.")
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *artifacts)
