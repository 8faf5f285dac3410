"""Autoregressive sampling from a causal language model: `generate` with a key/value cache,
the logit filters it samples through, and the preview configuration `Samples`."""

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Key, PRNGKeyArray

from dew._checks import check_ids, error_if
from dew._integers import check_integer
from dew.nn.backbones.causal_transformer import CausalTransformer

__all__ = ["Generation", "Samples", "filter_logits", "generate", "sample_continuations"]


def _check_temperature(name: str, value: Any) -> None:
    if not (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and float(value) >= 0
    ):
        raise ValueError(f"{name} must be >= 0, a finite real (0 samples greedily), got {value!r}.")


def _check_top_p(name: str, value: Any) -> None:
    if value is not None and not (
        isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < float(value) <= 1
    ):
        raise ValueError(f"{name} must be None or a real in (0, 1], got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Samples:
    """How a language-model preview samples continuations of prompt rows.

    - `temperature`: softmax temperature; `0` samples greedily.
    - `top_k`: sample among the `top_k` most likely tokens (`None`: all).
    - `max_new_tokens`: how many tokens to generate after each prompt.
    - `prompt_len`: how many leading IDs of a row form its prompt
      (`None`: half the objective's `seq_len`).
    - `num_samples`: how many rows of the batch to continue.
    - `top_p`: sample from the nucleus, the most likely tokens whose probabilities add up
      to at least `top_p` (`None`: all); see `filter_logits`.
    """

    temperature: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 8
    prompt_len: int | None = None
    num_samples: int = 4
    top_p: float | None = None

    def __post_init__(self) -> None:
        _check_temperature("Samples.temperature", self.temperature)
        for field in ("max_new_tokens", "num_samples"):
            value = getattr(self, field)
            check_integer(f"Samples.{field}", value, minimum=1)
        for field in ("top_k", "prompt_len"):
            value = getattr(self, field)
            check_integer(f"Samples.{field}", value, minimum=1, optional=True)
        _check_top_p("Samples.top_p", self.top_p)


def filter_logits(
    logits: Float[Array, "*rows vocab"],
    *,
    temperature: float | int = 1.0,
    top_k: int | None = None,
    top_p: float | int | None = None,
) -> Float[Array, "*rows vocab"]:
    """The logits `generate` draws a token from, in the order Hugging Face's samplers apply
    them: divided by `temperature`, then `-inf` outside the `top_k` largest, then `-inf`
    outside the nucleus: the smallest set of most likely tokens whose probabilities (after
    the first two steps) add up to at least `top_p`. Tokens tied with the last one kept
    are kept too.

    **Arguments:**

    - `logits`: the model's logits over the vocabulary (last axis).
    - `temperature`: a real > 0 (greedy decoding, temperature 0, filters nothing).
    - `top_k`: `None` or an integer >= 1; at least the vocabulary keeps every token.
    - `top_p`: `None` or a real in (0, 1]; `1` keeps every token.

    ```python
    >>> import jax.numpy as jnp
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    >>> jnp.isfinite(filter_logits(logits, top_p=0.75)).tolist()
    [True, True, False, False]

    ```
    """
    logits = logits / temperature
    vocab = logits.shape[-1]
    if top_k is not None and top_k < vocab:
        threshold = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    if top_p is not None and top_p < 1:
        ordered = -jnp.sort(-logits, axis=-1)
        probabilities = jax.nn.softmax(ordered, axis=-1)
        cumulative = jnp.cumsum(probabilities, axis=-1)
        before = jnp.concatenate([jnp.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], -1)
        kept = jnp.sum(before < top_p, axis=-1, keepdims=True)  # >= 1: before[0] is 0
        threshold = jnp.take_along_axis(ordered, kept - 1, axis=-1)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def _choose(
    logits: Float[Array, "rows vocab"],
    keys: Key[Array, " rows"],
    temperature: float | int,
    top_k: int | None,
    top_p: float | int | None,
) -> Int[Array, " rows"]:
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)


class Generation(eqx.Module):
    """What `generate` returns.

    - `tokens`: `(rows, max_new_tokens)`, each row's new tokens; after a row stops (at
      `eos_id`, which it keeps) the rest of it holds `eos_id`.
    - `lengths`: `(rows,)`, how many of a row's tokens it generated, its `eos_id` included.
    """

    tokens: Int[Array, "rows new"]
    lengths: Int[Array, " rows"]

    @property
    def mask(self) -> Bool[Array, "rows new"]:
        """Where `tokens` holds a generated token (not the padding after a stop)."""
        new = jnp.arange(self.tokens.shape[-1]).reshape((1,) * self.lengths.ndim + (-1,))
        return new < self.lengths[..., None]


def _sample_tokens(
    model: CausalTransformer,
    prompts: Int[Array, "rows width"],
    lengths: Int[Array, " rows"],
    keys: Key[Array, "*rows"],
    *,
    steps: int,
    capacity: int,
    temperature: float | int,
    top_k: int | None,
    top_p: float | int | None,
    eos_id: int | None,
    fill: int,
) -> tuple[Int[Array, "rows steps"], Int[Array, " rows"]]:
    """Up to `steps` tokens after row `i`'s first `lengths[i]` IDs, and how many each row
    generated. A row stops after `eos_id`, or when its cache of `capacity` positions is
    full; the rest of it holds `fill`; what follows a row's prompt in `prompts` is never
    read. Row `i` draws its `t`-th token with `split(keys[i], steps)[t]` (one key stands
    for `split(key, rows)`), so its tokens depend on its own key alone, never on the
    other rows (and `split(key, n)[t]` does not depend on `n`)."""
    rows, width = prompts.shape
    if keys.ndim == 0:
        keys = jax.random.split(keys, rows)
    # Padding reaches no real position (the causal mask), but an ID outside the
    # vocabulary would be clamped into the embedding: keep it a valid ID.
    prompts = jnp.where(jnp.arange(width)[None, :] < lengths[:, None], prompts, 0)
    token_keys = jax.vmap(lambda key: jax.random.split(key, steps))(keys)
    logits, cache = jax.vmap(
        lambda row, length: model.prefill(row, capacity=capacity, length=length)
    )(prompts, lengths)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    room = capacity - lengths

    def advance(logits, step, counts, done):
        token = _choose(logits, token_keys[:, step], temperature, top_k, top_p)
        token = jnp.where(done, fill, token)
        counts = counts + jnp.where(done, 0, 1)
        stopped = counts >= room
        if eos_id is not None:
            stopped = stopped | (token == eos_id)
        return token, counts, done | stopped

    first, counts, done = advance(last, 0, jnp.zeros(rows, jnp.int32), room <= 0)
    out = jnp.full((rows, steps), fill, jnp.int32).at[:, 0].set(first)

    def unfinished(carry):
        step, *_, done = carry
        return (step < steps) & ~jnp.all(done)

    def decode_one(carry):
        step, token, cache, out, counts, done = carry
        logits, cache = jax.vmap(model.decode)(token, cache)
        token, counts, done = advance(logits, step, counts, done)
        out = jax.lax.dynamic_update_index_in_dim(out, token, step, axis=1)
        return step + 1, token, cache, out, counts, done

    start = (jnp.ones((), jnp.int32), first, cache, out, counts, done)
    *_, out, counts, _ = jax.lax.while_loop(unfinished, decode_one, start)
    return out, counts


_compiled_sample_tokens = eqx.filter_jit(_sample_tokens)


def _prompt_rows(prompts: Any, prompt_lengths: Any, vocab_size: int) -> tuple[Any, Any]:
    """Prompts as a right-padded `(rows, width)` integer array and each row's length,
    checked: a list of lists of IDs, or an array with optional lengths. Concrete prompts
    are checked and returned as NumPy arrays (no device work before the compiled call);
    traced ones with `eqx.error_if`."""
    if not hasattr(prompts, "dtype"):
        prompts, prompt_lengths = _ragged(prompts, prompt_lengths)
    if not jnp.issubdtype(prompts.dtype, jnp.integer):
        raise ValueError(
            f"generate: prompts must hold integer token IDs, got dtype {prompts.dtype}."
        )
    if prompts.ndim != 2 or 0 in prompts.shape:
        hint = "; pass one prompt as [prompt]" if prompts.ndim == 1 else ""
        raise ValueError(
            "generate: prompts must be shaped (rows, length) with at least one row and one "
            f"token, got shape {tuple(prompts.shape)}{hint}."
        )
    rows, width = prompts.shape
    if isinstance(prompt_lengths, list | tuple):
        prompt_lengths = np.asarray(prompt_lengths)
    traced = any(isinstance(x, jax.core.Tracer) for x in (prompts, prompt_lengths))
    xp = jnp if traced else np
    if prompt_lengths is None:
        lengths = xp.full((rows,), width, xp.int32)
    else:
        dtype = getattr(prompt_lengths, "dtype", None)
        shape = tuple(getattr(prompt_lengths, "shape", ()))
        if dtype is None or not jnp.issubdtype(dtype, jnp.integer) or shape != (rows,):
            raise ValueError(
                f"generate: prompt_lengths must be an integer array shaped ({rows},), one "
                f"length per prompt row, got {type(prompt_lengths).__name__} of shape {shape} "
                f"and dtype {dtype}."
            )
        lengths = xp.asarray(prompt_lengths).astype(xp.int32)
        message = f"generate: prompt_lengths must lie between 1 and the prompts' width {width}"
        lengths = error_if(
            lengths,
            (lengths < 1) | (lengths > width),
            f"{message}.",
            first=lambda index: f"{message}, got {int(lengths[index])} in row {index[0]}.",
        )
    prompts = xp.asarray(prompts).astype(xp.int32)
    # The check's result is used: traced, it is an `eqx.error_if` on the prompts.
    prompts = check_ids(
        xp.where(xp.arange(width)[None, :] < lengths[:, None], prompts, 0),
        vocab_size,
        subject="generate: prompts",
        noun="token ID",
        size_name="vocab_size",
        axes=("row", "position"),
    )
    return prompts, lengths


def _ragged(prompts: Any, prompt_lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    """A list of prompts (each a list of token IDs) as a right-padded array and lengths."""
    described = "a list of prompts, each a list of token IDs, or a (rows, length) array"
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(f"generate: prompts must be {described}, got {prompts!r:.80}.")
    if prompt_lengths is not None:
        raise ValueError(
            "generate: prompt_lengths goes with a (rows, length) array of prompts; a list of "
            "prompts gives each prompt's length itself."
        )
    rows = []
    for index, prompt in enumerate(prompts):
        row = np.asarray(prompt) if isinstance(prompt, Sequence | np.ndarray) else None
        if isinstance(prompt, str | bytes) or row is None or row.ndim != 1:
            raise ValueError(
                f"generate: prompts must be {described}; prompt {index} is {prompt!r:.80} "
                "(one prompt is [prompt])."
            )
        if row.size == 0:
            raise ValueError(f"generate: prompt {index} is empty; a prompt needs a token.")
        if not np.issubdtype(row.dtype, np.integer):
            raise ValueError(
                f"generate: prompt {index} must hold integer token IDs, got {prompt!r:.80}."
            )
        rows.append(row)
    width = max(row.size for row in rows)
    padded = np.zeros((len(rows), width), np.int64)
    for index, row in enumerate(rows):
        padded[index, : row.size] = row
    return padded, np.array([row.size for row in rows], np.int32)


def _key(key: Any, rows: int) -> Key[Array, "*rows"]:
    """`key` as a typed key: one, or one per row."""
    if isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.shape[-1:] == (2,):
        key = jax.random.wrap_key_data(key)  # a raw `jax.random.PRNGKey`
    if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
        raise ValueError(
            f"generate: key must be a JAX key (jax.random.key(seed)) or one key per row, got "
            f"{type(key).__name__}."
        )
    if key.shape not in ((), (rows,)):
        raise ValueError(
            f"generate: key must be one key or one key per prompt row, shape ({rows},), got "
            f"keys of shape {key.shape}."
        )
    return key


def generate(
    model: CausalTransformer,
    prompts: Int[ArrayLike, "rows prompt"] | Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    key: PRNGKeyArray | Key[Array, " rows"],
    temperature: float | int = 1.0,
    top_k: int | None = None,
    top_p: float | int | None = None,
    eos_id: int | None = None,
    prompt_lengths: Int[ArrayLike, " rows"] | Sequence[int] | None = None,
) -> Generation:
    """Continue each prompt by up to `max_new_tokens` tokens drawn from `model`.

    One compiled call: a prefill runs every prompt through the model once and keeps each
    layer's keys and values (`CausalTransformer.prefill`), then a `lax.while_loop` decodes
    one token per row per iteration against that cache (`CausalTransformer.decode`) and
    stops as soon as every row has emitted `eos_id`. The call is compiled once per model
    structure, prompt shape and setting; it also runs inside your own `jax.jit` (pass the
    model as an argument, the settings as static values).

    **Arguments:**

    - `model`: the `CausalTransformer` to sample from (trained parameters combined in).
    - `prompts`: a list of prompts, each a list of token IDs, of any lengths; or an integer
      array `(rows, width)` of right-padded prompts, with `prompt_lengths`.
    - `max_new_tokens`: how many tokens to generate per row, at most.
    - `key`: one key (row `i` draws from `jax.random.split(key, rows)[i]`), or one key per
      row, shape `(rows,)`: a row's tokens then depend only on its prompt and its key,
      never on the other rows.
    - `temperature`: softmax temperature; `0` decodes greedily (the argmax every step).
    - `top_k`, `top_p`: draw from the `top_k` most likely tokens and from the nucleus of
      probability `top_p`, as `filter_logits` says (`None`: no such filter).
    - `eos_id`: a token ID that ends a row: it is kept, and what follows is `eos_id`.
    - `prompt_lengths`: with an array of prompts, each row's prompt length (an integer
      array or a list; row `i`'s prompt is its first `prompt_lengths[i]` IDs, and what
      follows is padding, never read). Default: every row is a whole prompt.

    **Returns:** a `Generation`: the new tokens `(rows, max_new_tokens)` and their lengths.

    **Raises:** `ValueError` for a bad argument, a token ID outside the vocabulary, or
    prompts whose width plus `max_new_tokens` passes the model's `max_seq_len` (its learned
    positions end there).

    ```python
    >>> import jax
    >>> from dew.nn.backbones.causal_transformer import CausalTransformer
    >>> model = CausalTransformer(vocab_size=8, emb_features=16, num_layers=1, num_heads=2,
    ...                           mlp_features=32, max_seq_len=16, key=jax.random.key(0))
    >>> out = generate(model, [[1, 2, 3], [4]], max_new_tokens=5, key=jax.random.key(1))
    >>> out.tokens.shape, out.lengths.tolist()
    ((2, 5), [5, 5])

    ```
    """
    max_new_tokens = check_integer("generate: max_new_tokens", max_new_tokens, minimum=1)
    _check_temperature("generate: temperature", temperature)
    check_integer("generate: top_k", top_k, minimum=1, optional=True)
    _check_top_p("generate: top_p", top_p)
    vocab = model.vocab_size
    check_integer("generate: eos_id", eos_id, minimum=0, maximum=vocab - 1, optional=True)
    tokens, lengths = _prompt_rows(prompts, prompt_lengths, vocab)
    rows, width = tokens.shape
    if width + max_new_tokens > model.max_seq_len:
        raise ValueError(
            f"generate: prompts of {width} tokens plus max_new_tokens={max_new_tokens} need "
            f"{width + max_new_tokens} positions, more than the model's max_seq_len "
            f"{model.max_seq_len} (its learned positions end there); shorten the prompts or "
            f"ask for at most {model.max_seq_len - width} new tokens."
        )
    tokens_out, counts = _compiled_sample_tokens(
        model,
        tokens,
        lengths,
        _key(key, rows),
        steps=max_new_tokens,
        capacity=width + max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        fill=0 if eos_id is None else eos_id,
    )
    return Generation(tokens_out, counts)


def sample_continuations(
    model: CausalTransformer,
    prompts: Int[Array, "rows prompt"],
    key: PRNGKeyArray,
    *,
    max_new_tokens: int,
    temperature: float | int = 1.0,
    top_k: int | None = None,
    top_p: float | int | None = None,
) -> Int[Array, "rows total"]:
    """Continue each prompt row by `max_new_tokens` sampled tokens (`generate` with its
    key/value cache): returns the prompts followed by their continuations."""
    generated = generate(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        key=key,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    return jnp.concatenate([jnp.asarray(prompts, jnp.int32), generated.tokens], axis=1)
