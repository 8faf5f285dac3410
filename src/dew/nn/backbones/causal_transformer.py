"""A decoder-only transformer language model."""

import equinox as eqx
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from dew.nn.backbones._transformer import KVCache, TransformerStack, build_stack

__all__ = ["CausalTransformer", "KVCache"]


class CausalTransformer(eqx.Module):
    """A pre-norm causal transformer over token IDs, returning next-token logits.

    **Arguments:**

    - `vocab_size`: valid token IDs are `0 .. vocab_size - 1`.
    - `emb_features`, `num_layers`, `num_heads`, `mlp_features`: the stack's sizes.
    - `max_seq_len`: the longest sequence the position embedding covers; longer
      sequences raise.
    - `dtype`: `"float32"` or `"bfloat16"`, the computation dtype. Parameters stay
      float32; logits are returned in float32.
    - `attention_impl`: `"xla"` (any backend: `jax.nn.dot_product_attention`'s XLA
      arithmetic, written as two products batched over the heads) or `"cudnn"` (CUDA
      GPUs, bfloat16: `jax.nn.dot_product_attention`'s fused kernel), with a causal mask.
    - `remat`: `False` (default), `True` or a policy name of
      `dew.nn.backbones.REMAT_POLICIES`: each block under `jax.checkpoint` with that policy
      (`True`: `"nothing_saveable"`), so a training step keeps a block's input rather than
      its activations and recomputes them in the backward pass: less memory for the same
      gradients, at the cost of a second forward pass through the blocks. No parameter
      changes; `prefill` and `decode` (no gradients) run the blocks as they are.
    - `key`: the initialisation key, keyword-only and required (as in `eqx.nn`).

    The module maps one sequence, or a batch of sequences of one length at once (token IDs
    shaped `(batch, seq)`, any number of leading axes): the same logits as `jax.vmap` over
    the batch, computed faster, with every row of the batch in one matrix product (what
    `LMObjective` does). `prefill` and `decode` take one sequence: `jax.vmap` them. They
    generate with a key/value cache (`KVCache`): `prefill` runs the prompt once and keeps
    every layer's keys and values, then each `decode` step computes one new position
    against them. `dew.objectives.lm.generate` drives them.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1, num_heads=2,
    ...                           mlp_features=32, max_seq_len=16, dtype="float32",
    ...                           attention_impl="xla", key=jax.random.key(0))
    >>> model(jnp.array([0, 1, 2], jnp.int32)).shape
    (3, 4)

    ```
    """

    stack: TransformerStack
    vocab_size: int = eqx.field(static=True)

    def __init__(
        self,
        vocab_size: int,
        emb_features: int,
        num_layers: int,
        num_heads: int,
        mlp_features: int,
        max_seq_len: int,
        dtype: str = "float32",
        attention_impl: str = "xla",
        remat: bool | str = False,
        *,
        key: PRNGKeyArray,
    ):
        self.stack = build_stack(
            "CausalTransformer",
            vocab_size=vocab_size,
            emb_features=emb_features,
            num_layers=num_layers,
            num_heads=num_heads,
            mlp_features=mlp_features,
            max_seq_len=max_seq_len,
            dtype=dtype,
            attention_impl=attention_impl,
            remat=remat,
            key=key,
        )
        self.vocab_size = vocab_size

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the model takes."""
        return self.stack.max_seq_len

    def __call__(self, tokens: Int[Array, "*batch seq"]) -> Float[Array, "*batch seq vocab"]:
        """Logits of the next token at every position of one sequence, or of each
        sequence of a batch (`(batch, seq)` token IDs)."""
        return self.stack(tokens, causal=True, kind="CausalTransformer")

    def prefill(
        self,
        tokens: Int[Array, " seq"],
        *,
        capacity: int | None = None,
        length: Int[ArrayLike, ""] | None = None,
    ) -> tuple[Float[Array, "seq vocab"], KVCache]:
        """Run a prompt once: the logits at every position (those of `__call__`, computed
        the same way) and a cache to `decode` from.

        **Arguments:**

        - `tokens`: the prompt's token IDs (at least one).
        - `capacity`: how many positions the cache holds, prompt included (default
          `max_seq_len`); a prompt of `seq` tokens leaves room for `capacity - seq`
          decode steps.
        - `length`: how many leading tokens are the prompt (default all of them; may be
          traced). A right-padded prompt passes its own length: decoding then continues
          from position `length`, overwriting the padding, and the logits that predict
          its first new token are `logits[length - 1]`.

        **Returns:** `(logits, cache)`.

        **Raises:** `ValueError` unless `1 <= seq <= capacity <= max_seq_len`.
        """
        return self.stack.prefill(
            tokens,
            capacity=self.max_seq_len if capacity is None else capacity,
            length=tokens.shape[0] if length is None else length,
            kind="CausalTransformer",
        )

    def decode(
        self, token: Int[ArrayLike, ""], cache: KVCache
    ) -> tuple[Float[Array, " vocab"], KVCache]:
        """One generation step: `token` placed at position `cache.length`, returning the
        logits of the token after it and the cache with that position filled (its
        `length` one more). The cache must have room (`cache.length < cache.capacity`):
        past it, positions are clamped to the last one and the logits mean nothing;
        `dew.objectives.lm.generate` sizes the cache so that never happens.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1,
        ...                           num_heads=2, mlp_features=32, max_seq_len=8,
        ...                           key=jax.random.key(0))
        >>> tokens = jnp.array([0, 1, 2, 3], jnp.int32)
        >>> logits, cache = model.prefill(tokens[:2], capacity=4)
        >>> after_2, cache = model.decode(tokens[2], cache)
        >>> int(cache.length), bool(jnp.allclose(after_2, model(tokens)[2], atol=1e-5))
        (3, True)

        ```
        """
        return self.stack.decode(token, cache)
