"""The pre-norm transformer stack shared by the causal and bidirectional backbones."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from dew._checks import check_integer

__all__ = ["ATTENTION_IMPLEMENTATIONS", "COMPUTE_DTYPES", "TransformerStack"]

ATTENTION_IMPLEMENTATIONS = ("xla", "cudnn")
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def check_configuration(
    kind: str,
    *,
    vocab_size: int,
    emb_features: int,
    num_layers: int,
    num_heads: int,
    mlp_features: int,
    max_seq_len: int,
    dtype: str,
    attention_impl: str,
) -> None:
    """Raise a clear error for a configuration the backbone cannot run."""
    for field, value in (
        ("vocab_size", vocab_size),
        ("emb_features", emb_features),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("mlp_features", mlp_features),
        ("max_seq_len", max_seq_len),
    ):
        check_integer(f"{kind}.{field}", value, minimum=1)
    if emb_features % num_heads:
        raise ValueError(
            f"{kind}.emb_features ({emb_features}) must be divisible by num_heads ({num_heads})."
        )
    if dtype not in COMPUTE_DTYPES:
        allowed = ", ".join(repr(name) for name in COMPUTE_DTYPES)
        raise ValueError(f"{kind}.dtype {dtype!r} is not one of {allowed}.")
    if attention_impl not in ATTENTION_IMPLEMENTATIONS:
        allowed = ", ".join(repr(name) for name in ATTENTION_IMPLEMENTATIONS)
        raise ValueError(f"{kind}.attention_impl {attention_impl!r} is not one of {allowed}.")
    if attention_impl == "cudnn":
        backend = jax.default_backend()
        if backend != "gpu":
            raise ValueError(
                f"{kind}.attention_impl 'cudnn' needs a CUDA GPU, but the current JAX backend is "
                f"{backend!r}; use attention_impl='xla'."
            )
        if dtype != "bfloat16":
            raise ValueError(
                f"{kind}.attention_impl 'cudnn' computes in float16 or bfloat16, got dtype "
                f"{dtype!r}; use dtype='bfloat16' or attention_impl='xla'."
            )


class _Block(eqx.Module):
    norm_attention: eqx.nn.LayerNorm
    qkv: eqx.nn.Linear
    out: eqx.nn.Linear
    norm_mlp: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    num_heads: int = eqx.field(static=True)

    def __init__(self, emb_features: int, num_heads: int, mlp_features: int, key: PRNGKeyArray):
        keys = jax.random.split(key, 4)
        self.norm_attention = eqx.nn.LayerNorm(emb_features)
        self.qkv = eqx.nn.Linear(emb_features, 3 * emb_features, key=keys[0])
        self.out = eqx.nn.Linear(emb_features, emb_features, key=keys[1])
        self.norm_mlp = eqx.nn.LayerNorm(emb_features)
        self.up = eqx.nn.Linear(emb_features, mlp_features, key=keys[2])
        self.down = eqx.nn.Linear(mlp_features, emb_features, key=keys[3])
        self.num_heads = num_heads

    def __call__(
        self, x: Float[Array, "seq emb"], *, causal: bool, implementation: str
    ) -> Float[Array, "seq emb"]:
        seq, emb = x.shape
        head = emb // self.num_heads
        h = jax.vmap(self.norm_attention)(x)
        qkv = jax.vmap(self.qkv)(h).reshape(seq, 3, self.num_heads, head)
        # jax.nn.dot_product_attention mixes bfloat16 inputs with float32 internals,
        # which a caller's strict dtype promotion would refuse.
        with jax.numpy_dtype_promotion("standard"):
            attended = jax.nn.dot_product_attention(
                qkv[:, 0],
                qkv[:, 1],
                qkv[:, 2],
                is_causal=causal,
                implementation=implementation,
            )
        x = x + jax.vmap(self.out)(attended.reshape(seq, emb))
        h = jax.vmap(self.norm_mlp)(x)
        return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(h)))


class TransformerStack(eqx.Module):
    """Token and position embeddings, pre-norm blocks, a final norm and an output head.

    Parameters are stored in float32; `__call__` casts them to `dtype` and
    computes in it, returning float32 logits.
    """

    token_embedding: eqx.nn.Embedding
    position_embedding: Float[Array, "max_seq emb"]
    blocks: tuple[_Block, ...]
    final_norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    max_seq_len: int = eqx.field(static=True)
    dtype: str = eqx.field(static=True)
    attention_impl: str = eqx.field(static=True)

    def __init__(
        self,
        *,
        vocab_size: int,
        out_features: int,
        emb_features: int,
        num_layers: int,
        num_heads: int,
        mlp_features: int,
        max_seq_len: int,
        dtype: str,
        attention_impl: str,
        key: PRNGKeyArray,
    ):
        keys = jax.random.split(key, num_layers + 3)
        self.token_embedding = eqx.nn.Embedding(vocab_size, emb_features, key=keys[0])
        self.position_embedding = 0.02 * jax.random.normal(
            keys[1], (max_seq_len, emb_features), jnp.float32
        )
        self.blocks = tuple(
            _Block(emb_features, num_heads, mlp_features, keys[2 + i]) for i in range(num_layers)
        )
        self.final_norm = eqx.nn.LayerNorm(emb_features)
        head = eqx.nn.Linear(emb_features, out_features, key=keys[-1])
        # A small output head starts every logit near zero: a uniform first prediction.
        self.head = eqx.tree_at(lambda linear: linear.weight, head, head.weight / math.sqrt(16.0))
        self.max_seq_len = max_seq_len
        self.dtype = dtype
        self.attention_impl = attention_impl

    def __call__(
        self, tokens: Int[Array, " seq"], *, causal: bool, kind: str
    ) -> Float[Array, "seq out"]:
        seq = tokens.shape[0]
        if seq > self.max_seq_len:
            raise ValueError(
                f"{kind} got a sequence of {seq} tokens, longer than max_seq_len "
                f"{self.max_seq_len}."
            )
        compute = COMPUTE_DTYPES[self.dtype]
        model = jax.tree.map(
            lambda leaf: leaf.astype(compute) if eqx.is_inexact_array(leaf) else leaf, self
        )
        x = jax.vmap(model.token_embedding)(tokens) + model.position_embedding[:seq]
        for block in model.blocks:
            x = block(x, causal=causal, implementation=self.attention_impl)
        x = jax.vmap(model.final_norm)(x)
        return jax.vmap(model.head)(x).astype(jnp.float32)


def build_stack(
    kind: str,
    *,
    vocab_size: int,
    extra_tokens: int = 0,
    emb_features: int,
    num_layers: int,
    num_heads: int,
    mlp_features: int,
    max_seq_len: int,
    dtype: str,
    attention_impl: str,
    key: PRNGKeyArray,
) -> TransformerStack:
    """Check a backbone's configuration (errors name `kind`), then build its stack: an
    embedding of `vocab_size + extra_tokens` rows and logits over the `vocab_size` tokens."""
    sizes = {
        "emb_features": emb_features,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "mlp_features": mlp_features,
        "max_seq_len": max_seq_len,
    }
    check_configuration(
        kind, vocab_size=vocab_size, dtype=dtype, attention_impl=attention_impl, **sizes
    )
    return TransformerStack(
        vocab_size=vocab_size + extra_tokens,
        out_features=vocab_size,
        dtype=dtype,
        attention_impl=attention_impl,
        key=key,
        **sizes,
    )
