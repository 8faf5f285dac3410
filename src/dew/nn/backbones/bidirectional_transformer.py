"""A bidirectional transformer denoiser over token IDs (masked diffusion)."""

import equinox as eqx
from jaxtyping import Array, Float, Int, PRNGKeyArray

from dew.nn.backbones._transformer import TransformerStack, build_stack

__all__ = ["BidirectionalTransformer"]


class BidirectionalTransformer(eqx.Module):
    """A pre-norm transformer with full (non-causal) attention, returning logits over
    the `vocab_size` real tokens at every position. Its inputs may also hold the mask
    token `vocab_size`, so its embedding has `vocab_size + 1` rows.

    Same arguments as `CausalTransformer` (`remat` included).

    ```python
    >>> import jax, jax.numpy as jnp
    >>> model = BidirectionalTransformer(vocab_size=4, emb_features=16, num_layers=1,
    ...                                  num_heads=2, mlp_features=32, max_seq_len=8,
    ...                                  key=jax.random.key(0))
    >>> model(jnp.array([0, 4, 2], jnp.int32)).shape
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
            "BidirectionalTransformer",
            vocab_size=vocab_size,
            extra_tokens=1,
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
    def mask_id(self) -> int:
        """The absorbing mask token's ID, `vocab_size`."""
        return self.vocab_size

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the model takes."""
        return self.stack.max_seq_len

    def __call__(self, tokens: Int[Array, "*batch seq"]) -> Float[Array, "*batch seq vocab"]:
        """Logits over the real tokens at every position of one (partly masked) sequence,
        or of each sequence of a batch (`(batch, seq)` token IDs: the same logits as
        `jax.vmap`, every row in one matrix product)."""
        return self.stack(tokens, causal=False, kind="BidirectionalTransformer")
