"""A decoder-only transformer language model."""

import equinox as eqx
from jaxtyping import Array, Float, Int, PRNGKeyArray

from dew.nn.backbones._transformer import TransformerStack, build_stack

__all__ = ["CausalTransformer"]


class CausalTransformer(eqx.Module):
    """A pre-norm causal transformer over token IDs, returning next-token logits.

    **Arguments:**

    - `vocab_size`: valid token IDs are `0 .. vocab_size - 1`.
    - `emb_features`, `num_layers`, `num_heads`, `mlp_features`: the stack's sizes.
    - `max_seq_len`: the longest sequence the position embedding covers; longer
      sequences raise.
    - `dtype`: `"float32"` or `"bfloat16"`, the computation dtype. Parameters stay
      float32; logits are returned in float32.
    - `attention_impl`: `"xla"` (any backend) or `"cudnn"` (CUDA GPUs, bfloat16),
      passed to `jax.nn.dot_product_attention` with a causal mask.
    - `key`: the initialisation key, keyword-only and required (as in `eqx.nn`).

    The module maps one sequence; `jax.vmap` it over a batch.

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
            key=key,
        )
        self.vocab_size = vocab_size

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the model takes."""
        return self.stack.max_seq_len

    def __call__(self, tokens: Int[Array, " seq"]) -> Float[Array, "seq vocab"]:
        """Logits of the next token at every position of one sequence."""
        return self.stack(tokens, causal=True, kind="CausalTransformer")
