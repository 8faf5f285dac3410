"""Autoregressive sampling from a causal language model."""

import dataclasses
import math
import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from dew._checks import check_integer

__all__ = ["Samples", "sample_continuations"]


@dataclasses.dataclass(frozen=True)
class Samples:
    """How a language-model preview samples continuations of prompt rows.

    - `temperature`: softmax temperature; `0` samples greedily.
    - `top_k`: sample among the `top_k` most likely tokens (`None`: all).
    - `max_new_tokens`: how many tokens to generate after each prompt.
    - `prompt_len`: how many leading IDs of a row form its prompt
      (`None`: half the objective's `seq_len`).
    - `num_samples`: how many rows of the batch to continue.
    """

    temperature: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 8
    prompt_len: int | None = None
    num_samples: int = 4

    def __post_init__(self) -> None:
        if not (
            isinstance(self.temperature, numbers.Real)
            and math.isfinite(self.temperature)
            and self.temperature >= 0
        ):
            raise ValueError(f"Samples.temperature must be >= 0, got {self.temperature!r}.")
        for field in ("max_new_tokens", "num_samples"):
            value = getattr(self, field)
            check_integer(f"Samples.{field}", value, minimum=1)
        for field in ("top_k", "prompt_len"):
            value = getattr(self, field)
            check_integer(f"Samples.{field}", value, minimum=1, optional=True)


def _next_token(
    logits: Float[Array, "rows vocab"], key: PRNGKeyArray, temperature: float, top_k: int | None
) -> Int[Array, " rows"]:
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        threshold = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def sample_continuations(
    model: Callable[[Int[Array, " seq"]], Float[Array, "seq vocab"]],
    prompts: Int[Array, "rows prompt"],
    key: PRNGKeyArray,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> Int[Array, "rows total"]:
    """Continue each prompt row by `max_new_tokens` sampled tokens.

    Each step runs the model over the whole fixed-size buffer (no cache): the causal
    mask keeps the not-yet-written positions from influencing earlier logits.
    Returns the prompts followed by their continuations.
    """
    rows, prompt_len = prompts.shape
    buffer = jnp.concatenate(
        [prompts.astype(jnp.int32), jnp.zeros((rows, max_new_tokens), jnp.int32)], axis=1
    )

    def step(index, carry):
        buffer, key = carry
        key, sample_key = jax.random.split(key)
        logits = jax.vmap(model)(buffer)
        position = prompt_len + index
        current = jax.lax.dynamic_index_in_dim(logits, position - 1, axis=1, keepdims=False)
        token = _next_token(current, sample_key, temperature, top_k)
        buffer = jax.lax.dynamic_update_index_in_dim(buffer, token, position, axis=1)
        return buffer, key

    buffer, _ = jax.lax.fori_loop(0, max_new_tokens, step, (buffer, key))
    return buffer
