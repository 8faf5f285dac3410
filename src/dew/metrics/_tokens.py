"""Metrics over teacher-forced token scores: perplexity, mean loss, token accuracy."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from dew.artifacts import Artifact, TokenScores
from dew.metrics._base import Metric, raise_if
from dew.metrics._sums import Sum

__all__ = ["MeanLoss", "Perplexity", "TokenAccuracy", "TokenLossState"]


class TokenLossState(eqx.Module):
    """Sums of weighted per-position values (losses, or hits for accuracy), of target
    weights, and of the positions seen."""

    loss: Sum
    weight: Sum
    positions: Sum

    def merge(self, other: TokenLossState) -> TokenLossState:
        return TokenLossState(
            self.loss.add(other.loss),
            self.weight.add(other.weight),
            self.positions.add(other.positions),
        )


def _token_loss_state(scores: TokenScores) -> TokenLossState:
    weights = jnp.asarray(scores.weights, jnp.float32)
    losses = jnp.asarray(scores.losses, jnp.float32)
    weighted = jnp.where(weights != 0, losses * weights, jnp.zeros_like(losses))
    return TokenLossState(Sum.of(weighted), Sum.of(weights), Sum.of(jnp.ones_like(weights)))


def _mean_token_loss(state: TokenLossState, name: str) -> Float[Array, ""]:
    weight = state.weight.value()
    positions = state.positions.value()
    empty = positions == 0
    safe = jnp.where(weight == 0, jnp.ones_like(weight), weight)
    # A Python NaN, not a NaN array: eagerly, jax.debug_nans checks every array an op
    # builds, so only the empty pass may ever produce one.
    mean = jnp.where(empty, jnp.nan, state.loss.value() / safe)
    return raise_if(
        jnp.logical_and(~empty, weight == 0),
        f"metric {name!r}: the pass has token positions but no counted target "
        "(every target weight is zero), so there is nothing to average.",
        mean,
    )


class _TokenLossMetric(Metric[TokenScores]):
    artifact_type: ClassVar[type[Artifact]] = TokenScores
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    def init(self) -> TokenLossState:
        return TokenLossState(Sum.zero(), Sum.zero(), Sum.zero())

    def statistics(self, artifact: TokenScores) -> TokenLossState:
        return _token_loss_state(artifact)

    def merge(self, accumulated: TokenLossState, contribution: TokenLossState) -> TokenLossState:
        return accumulated.merge(contribution)


class Perplexity(_TokenLossMetric):
    """Token-weighted perplexity: `exp(sum(weight * loss) / sum(weight))` over the pass.

    It sums weighted losses and target weights over every batch, then exponentiates
    once, never averaging batch averages. An empty pass finalizes to NaN; a non-empty
    pass with no counted target (all weights zero) raises `ValueError`.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew.artifacts import TokenScores
    >>> metric = Perplexity()
    >>> batch = TokenScores(losses=jnp.log(jnp.array([[2.0, 8.0]])), weights=jnp.ones((1, 2)))
    >>> float(metric.finalize(metric.merge(metric.init(), metric(batch))))
    4.0

    ```
    """

    name: str = eqx.field(static=True, default="perplexity")
    direction: ClassVar[str | None] = "minimize"

    def finalize(self, accumulated: TokenLossState) -> Float[Array, ""]:
        return jnp.exp(_mean_token_loss(accumulated, self.name))


class MeanLoss(_TokenLossMetric):
    """Token-weighted mean loss, `sum(weight * loss) / sum(weight)`, in nats.

    The log of `Perplexity`; the same empty-pass and no-target rules apply.
    """

    name: str = eqx.field(static=True, default="mean_loss")
    direction: ClassVar[str | None] = "minimize"

    def finalize(self, accumulated: TokenLossState) -> Float[Array, ""]:
        return _mean_token_loss(accumulated, self.name)


class TokenAccuracy(_TokenLossMetric):
    """Token-weighted accuracy of the argmax prediction, from `TokenScores.correct`.

    Reading scores without `correct` raises `ValueError`. Like perplexity, an empty
    pass finalizes to NaN and a non-empty pass with no counted target raises.
    """

    name: str = eqx.field(static=True, default="token_accuracy")
    direction: ClassVar[str | None] = "maximize"

    def statistics(self, artifact: TokenScores) -> TokenLossState:
        if artifact.correct is None:
            raise ValueError(
                f"metric {self.name!r} needs TokenScores.correct; this objective's scores "
                "carry no per-position correctness."
            )
        hits = jnp.where(artifact.correct, jnp.ones_like(artifact.losses), 0.0)
        return _token_loss_state(TokenScores(hits, artifact.weights))

    def finalize(self, accumulated: TokenLossState) -> Float[Array, ""]:
        return _mean_token_loss(accumulated, self.name)
