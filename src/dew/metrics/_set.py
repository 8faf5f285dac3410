"""Reducing several metrics over one pass."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from dew._checks import check_integer
from dew.artifacts import Artifact
from dew.metrics._base import Metric

__all__ = ["MetricSet", "reduce"]


class MetricSet(eqx.Module):
    """Several metrics reduced together over one pass, like `optax.chain` for metrics.

    The accumulator is the tuple of each metric's statistics. Names must be unique
    within the pass. `reduce` folds an iterable of artifacts, holding only the
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
        kinds = sorted({metric.artifact_type.__name__ for metric in metrics})
        if len(kinds) > 1:
            raise ValueError(
                f"a pass reads one artifact type, but these metrics read {kinds}; reduce each "
                "artifact type in its own MetricSet."
            )
        duplicates = sorted(name for name, n in Counter(m.name for m in metrics).items() if n > 1)
        if duplicates:
            raise ValueError(
                f"metric names must be unique within a pass, got {duplicates} more than once; "
                "give one of them another name (for example PSNR(name='psnr_full_range'))."
            )
        self.metrics = metrics

    @property
    def names(self) -> tuple[str, ...]:
        """The metrics' bare names, in order."""
        return tuple(metric.name for metric in self.metrics)

    @property
    def on_device(self) -> bool:
        """Whether every metric is a device metric, so the pass can run in one scan."""
        return not any(metric.host for metric in self.metrics)

    def init(self) -> tuple[Any, ...]:
        """The identity accumulator."""
        return tuple(metric.init() for metric in self.metrics)

    def update(self, accumulated: tuple[Any, ...], artifact: Artifact) -> tuple[Any, ...]:
        """Merge one batch's contribution of every metric into the accumulator."""
        return tuple(
            metric.merge(state, metric(artifact))
            for metric, state in zip(self.metrics, accumulated, strict=True)
        )

    def finalize(self, accumulated: tuple[Any, ...]) -> dict[str, Any]:
        """Each metric's scalar, keyed by its bare name."""
        return {
            metric.name: metric.finalize(state)
            for metric, state in zip(self.metrics, accumulated, strict=True)
        }

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
            return self.finalize(accumulated)
        return {name: scores[name] for name in self.names}  # jit returns dicts key-sorted

    def reduce(self, artifacts: Iterable[Artifact]) -> dict[str, Any]:
        """Fold a pass of artifacts and finalize it.

        Device metrics update in one compiled call per batch; host metrics update
        eagerly. An empty pass finalizes the identity.
        """
        device = MetricSet(tuple(m for m in self.metrics if not m.host))
        host = MetricSet(tuple(m for m in self.metrics if m.host))
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
            hosts = [metric.name for metric in self.metrics if metric.host]
            raise ValueError(
                f"reduce_stacked runs on the device, but {hosts} are host metrics; use reduce."
            )
        if chunk is None:
            hints = [m.scan_chunk for m in self.metrics if m.scan_chunk is not None]
            chunk = min(hints) if hints else jax.tree.leaves(stacked)[0].shape[0]
        check_integer("chunk", chunk, minimum=1, optional=True)
        if not self.metrics:
            return {}
        try:  # the pass and its finalize in one compiled call
            scores = jax.block_until_ready(_compiled_scan_and_finalize(self, stacked, chunk))
        except (RuntimeError, ValueError):  # a check fired: raise dew's own error eagerly
            return self.finalize(_compiled_scan(self, stacked, chunk))
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

    def statistics(artifact):
        return tuple(metric(artifact) for metric in metrics.metrics)

    def merge_all(state, contributions, count):
        for index in range(count):
            contribution = jax.tree.map(lambda leaf, i=index: leaf[i], contributions)
            state = tuple(
                metric.merge(accumulated, part)
                for metric, accumulated, part in zip(
                    metrics.metrics, state, contribution, strict=True
                )
            )
        return state

    def step(state, chunk_of_batches):
        return merge_all(state, jax.vmap(statistics)(chunk_of_batches), chunk), None

    chunks = jax.tree.map(lambda leaf: leaf[:whole].reshape(-1, chunk, *leaf.shape[1:]), stacked)
    state, _ = jax.lax.scan(step, metrics.init(), chunks)
    if whole < batches:
        rest = jax.tree.map(lambda leaf: leaf[whole:], stacked)
        state = merge_all(state, jax.vmap(statistics)(rest), batches - whole)
    return state


@eqx.filter_jit
def _compiled_scan_and_finalize(
    metrics: MetricSet, stacked: Artifact, chunk: int
) -> dict[str, Any]:
    return metrics.finalize(_compiled_scan(metrics, stacked, chunk))


def reduce(metrics: Sequence[Metric], artifacts: Iterable[Artifact]) -> dict[str, Any]:
    """Reduce `metrics` over a pass of `artifacts`: `MetricSet(metrics).reduce(artifacts)`."""
    return MetricSet(metrics).reduce(artifacts)


def stack_batches(artifacts: Sequence[Artifact]) -> Artifact:
    """Stack equally shaped artifacts along a new leading batch axis, for `reduce_stacked`."""
    if not artifacts:
        raise ValueError("stack_batches needs at least one artifact.")
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *artifacts)
