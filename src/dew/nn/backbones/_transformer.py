"""The pre-norm transformer stack shared by the causal and bidirectional backbones."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from dew._integers import check_integer
from dew._precision import compute_dtype, keeps_float32
from dew.nn._compiled_init import initialise
from dew.nn.backbones._layers import column_parallel, dense, layer_norm, row_parallel
from dew.nn.backbones._remat import apply_blocks, remat_policy

__all__ = ["ATTENTION_IMPLEMENTATIONS", "COMPUTE_DTYPES", "KVCache", "TransformerStack"]

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


class KVCache(eqx.Module):
    """The keys and values a causal transformer computed for the positions of one sequence,
    which a decode step attends to instead of recomputing them.

    - `keys`, `values`: one array per layer, shaped `(capacity, heads, head_features)` in
      the model's compute dtype (with a leading rows axis under `jax.vmap`).
    - `length`: how many leading positions hold the sequence; the next decode step writes
      position `length`. Positions from `length` on are not attended to, whatever they
      hold (zeros, or the keys of a right-padded prompt's padding, which decoding
      overwrites).
    """

    keys: tuple[Array, ...]
    values: tuple[Array, ...]
    length: Int[Array, "*rows"]

    @property
    def capacity(self) -> int:
        """How many positions the cache holds."""
        return self.keys[0].shape[-3]


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

    def tensor_sharding(self) -> dict[str, jax.sharding.PartitionSpec]:
        """The block's split over a mesh's `"model"` axis (`Trainer(strategy="fsdp+tensor")`,
        Megatron's): the fused query/key/value and the MLP's first projection by their
        outputs, the attention output and the MLP's second projection by their inputs (the
        heads, the MLP's hidden axis)."""
        return {**column_parallel("qkv", "up"), **row_parallel("out", "down")}

    # A block takes the rows of every sequence at once, `(sequences * seq, emb)`, and is
    # told `seq`: its products and norms then read and write the residual stream as one
    # matrix, and only attention splits it into sequences (decision 0058). One sequence
    # keeps no sequences axis, so `jax.vmap` of it compiles as it did before.

    def _attention_inputs(
        self, x: Float[Array, "rows emb"], seq: int
    ) -> tuple[Float[Array, "*sequences seq heads head"], ...]:
        rows = x.shape[0]
        sequences = () if rows == seq else (rows // seq,)
        h = layer_norm(self.norm_attention, x)
        qkv = dense(self.qkv, h).reshape(*sequences, seq, 3, self.num_heads, -1)
        return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]

    def _mix(
        self, x: Float[Array, "rows emb"], attended: Float[Array, "*sequences seq heads head"]
    ) -> Float[Array, "rows emb"]:
        x = x + dense(self.out, attended.reshape(x.shape))
        h = layer_norm(self.norm_mlp, x)
        return x + dense(self.down, jax.nn.gelu(dense(self.up, h)))

    def __call__(
        self, x: Float[Array, "rows emb"], *, seq: int, causal: bool, implementation: str
    ) -> Float[Array, "rows emb"]:
        q, k, v = self._attention_inputs(x, seq)
        return self._mix(x, _attention(q, k, v, causal=causal, implementation=implementation))

    def prefill(
        self, x: Float[Array, "seq emb"], *, capacity: int, implementation: str
    ) -> tuple[
        Float[Array, "seq emb"],
        Float[Array, "capacity heads head"],
        Float[Array, "capacity heads head"],
    ]:
        """`__call__` with a causal mask, also returning the keys and values of the
        `seq` positions, zero-padded to `capacity` positions."""
        q, k, v = self._attention_inputs(x, x.shape[0])
        attended = _attention(q, k, v, causal=True, implementation=implementation)
        pad = ((0, capacity - x.shape[0]), (0, 0), (0, 0))
        return self._mix(x, attended), jnp.pad(k, pad), jnp.pad(v, pad)

    def decode(
        self,
        x: Float[Array, " emb"],
        keys: Float[Array, "capacity heads head"],
        values: Float[Array, "capacity heads head"],
        position: Int[Array, ""],
    ) -> tuple[
        Float[Array, " emb"],
        Float[Array, "capacity heads head"],
        Float[Array, "capacity heads head"],
    ]:
        """One position: its key and value written at `position`, its query attending to
        positions `0 .. position`."""
        q, k, v = self._attention_inputs(x[None], 1)
        keys = jax.lax.dynamic_update_slice_in_dim(keys, k, position, axis=0)
        values = jax.lax.dynamic_update_slice_in_dim(values, v, position, axis=0)
        visible = jnp.arange(keys.shape[0]) <= position
        # One query against a masked cache: XLA's attention, whatever the stack's
        # implementation (cuDNN's fused kernel is for whole sequences).
        attended = _attention(q, keys, values, mask=visible[None, None, :], implementation="xla")
        return self._mix(x[None], attended)[0], keys, values


def _attention(
    q: Float[Array, "*sequences seq heads head"],
    k: Float[Array, "*sequences kv heads head"],
    v: Float[Array, "*sequences kv heads head"],
    *,
    causal: bool = False,
    mask: Bool[Array, "1 seq kv"] | None = None,
    implementation: str,
) -> Float[Array, "*sequences seq heads head"]:
    if implementation == "xla":
        return _xla_attention(q, k, v, causal=causal, mask=mask)
    # The other of ATTENTION_IMPLEMENTATIONS: cuDNN's fused kernel. jax.nn.dot_product_attention
    # mixes bfloat16 inputs with float32 internals, which a caller's strict dtype promotion
    # would refuse.
    with jax.numpy_dtype_promotion("standard"):
        return jax.nn.dot_product_attention(
            q, k, v, mask=mask, is_causal=causal, implementation="cudnn"
        )


def _xla_attention(
    q: Float[Array, "*sequences seq heads head"],
    k: Float[Array, "*sequences kv heads head"],
    v: Float[Array, "*sequences kv heads head"],
    *,
    causal: bool,
    mask: Bool[Array, "1 seq kv"] | None,
) -> Float[Array, "*sequences seq heads head"]:
    """`jax.nn.dot_product_attention(..., implementation="xla")`'s arithmetic (float32
    logits and softmax, masked logits set to -0.7 x float32's largest value, the same
    scale), written as two head-batched products: its own version maps a function over
    the heads, whose transposes cost a training step a tenth of its time on CPU. Under the
    `"bfloat16"` precision policy (decision 0078) the logits and softmax are bfloat16."""
    logits_dtype = jnp.float32 if keeps_float32() else q.dtype
    logits = jnp.einsum("...qhd,...khd->...hqk", q, k, preferred_element_type=logits_dtype)
    logits = logits * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), logits.dtype)
    shape = (1,) * (logits.ndim - 2) + logits.shape[-2:]
    visible = jnp.ones(shape, bool) if mask is None else mask
    if causal:
        visible = visible & jnp.tril(jnp.ones(shape, bool))
    if causal or mask is not None:
        hidden = jnp.asarray(-0.7 * jnp.finfo(logits.dtype).max, logits.dtype)
        logits = jnp.where(visible, logits, hidden)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    return jnp.einsum("...hqk,...khd->...qhd", probs, v)


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
    remat: str | None = eqx.field(static=True)

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
        remat: str | None = None,
        key: PRNGKeyArray,
    ):
        # Two compiled programs whatever the depth: the parts around the blocks (and the
        # blocks' keys), then one block, reused for every block (decision 0048).
        parts = initialise(
            _stack_parts, vocab_size, out_features, emb_features, num_layers, max_seq_len, key=key
        )
        self.token_embedding, self.position_embedding, self.final_norm, self.head = parts[:4]
        self.blocks = tuple(
            initialise(_Block, emb_features, num_heads, mlp_features, key=block_key)
            for block_key in parts[4]
        )
        self.max_seq_len = max_seq_len
        self.dtype = dtype
        self.attention_impl = attention_impl
        self.remat = remat

    def _computing(self) -> "TransformerStack":
        """The stack with its parameters cast to the compute dtype."""
        compute = compute_dtype(self.dtype)  # bfloat16 under a bfloat16 precision policy
        return jax.tree.map(
            lambda leaf: leaf.astype(compute) if eqx.is_inexact_array(leaf) else leaf, self
        )

    def _embed(self, tokens: Int[Array, "sequences seq"]) -> Float[Array, "rows emb"]:
        """The token and position embeddings of each sequence, as rows."""
        sequences, seq = tokens.shape
        x = jax.vmap(self.token_embedding)(tokens.reshape(sequences * seq))
        if sequences == 1:  # as a one-sequence call computed it before decision 0058
            return x + self.position_embedding[:seq]
        emb = x.shape[-1]
        x = x.reshape(sequences, seq, emb) + self.position_embedding[None, :seq]
        return x.reshape(sequences * seq, emb)

    def __call__(
        self, tokens: Int[Array, "*batch seq"], *, causal: bool, kind: str
    ) -> Float[Array, "*batch seq out"]:
        """The logits of one sequence, or of each sequence of a batch at once (any
        leading axes): the batch's rows go through every product together, as one
        matrix, where `jax.vmap` of the one-sequence call would batch each product over
        the sequences (decision 0058)."""
        if tokens.ndim == 0:
            raise ValueError(
                f"{kind} takes token IDs shaped (seq,) or (batch, ..., seq), got a scalar."
            )
        *batch, seq = tokens.shape
        if seq > self.max_seq_len:
            raise ValueError(
                f"{kind} got a sequence of {seq} tokens, longer than max_seq_len "
                f"{self.max_seq_len}."
            )
        model = self._computing()
        implementation = self.attention_impl
        x = apply_blocks(
            model.blocks,
            model._embed(tokens.reshape(math.prod(batch), seq)),
            self.remat,
            lambda block, x: block(x, seq=seq, causal=causal, implementation=implementation),
        )
        logits = dense(model.head, layer_norm(model.final_norm, x)).astype(jnp.float32)
        return logits.reshape(*batch, seq, logits.shape[-1])

    def prefill(
        self, tokens: Int[Array, " seq"], *, capacity: int, length: Int[ArrayLike, ""], kind: str
    ) -> tuple[Float[Array, "seq out"], KVCache]:
        """Causal logits at every position of `tokens` and a cache of `capacity`
        positions holding their keys and values, `length` of them counted as filled."""
        seq = tokens.shape[0]
        if not 1 <= seq <= capacity <= self.max_seq_len:
            raise ValueError(
                f"{kind}.prefill needs 1 <= prompt length <= capacity <= max_seq_len, got a "
                f"prompt of {seq} tokens, capacity {capacity} and max_seq_len "
                f"{self.max_seq_len}."
            )
        model = self._computing()
        x = model._embed(tokens[None])
        keys, values = [], []
        for block in model.blocks:
            x, k, v = block.prefill(x, capacity=capacity, implementation=self.attention_impl)
            keys.append(k)
            values.append(v)
        x = layer_norm(model.final_norm, x)
        logits = dense(model.head, x).astype(jnp.float32)
        return logits, KVCache(tuple(keys), tuple(values), jnp.asarray(length, jnp.int32))

    def decode(
        self, token: Int[ArrayLike, ""], cache: KVCache
    ) -> tuple[Float[Array, " out"], KVCache]:
        """The logits after `token`, placed at position `cache.length`, and the cache with
        that position filled."""
        model = self._computing()
        position = cache.length
        x = model.token_embedding(jnp.asarray(token)) + jax.lax.dynamic_index_in_dim(
            model.position_embedding, position, keepdims=False
        )
        keys, values = [], []
        for block, k, v in zip(model.blocks, cache.keys, cache.values, strict=True):
            x, k, v = block.decode(x, k, v, position)
            keys.append(k)
            values.append(v)
        logits = dense(model.head, layer_norm(model.final_norm, x)).astype(jnp.float32)
        return logits, KVCache(tuple(keys), tuple(values), position + 1)


def _stack_parts(
    vocab_size: int,
    out_features: int,
    emb_features: int,
    num_layers: int,
    max_seq_len: int,
    *,
    key: PRNGKeyArray,
) -> tuple[Any, ...]:
    """A stack's embeddings, final norm and head, and the key of each block."""
    keys = jax.random.split(key, num_layers + 3)
    token_embedding = eqx.nn.Embedding(vocab_size, emb_features, key=keys[0])
    position_embedding = 0.02 * jax.random.normal(keys[1], (max_seq_len, emb_features), jnp.float32)
    head = eqx.nn.Linear(emb_features, out_features, key=keys[-1])
    # A small output head starts every logit near zero: a uniform first prediction.
    head = eqx.tree_at(lambda linear: linear.weight, head, head.weight / math.sqrt(16.0))
    block_keys = tuple(keys[2 + i] for i in range(num_layers))
    return token_embedding, position_embedding, eqx.nn.LayerNorm(emb_features), head, block_keys


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
    remat: bool | str | None = None,
    key: PRNGKeyArray,
) -> TransformerStack:
    """Check a backbone's configuration (errors name `kind`), then build its stack: an
    embedding of `vocab_size + extra_tokens` rows and logits over the `vocab_size` tokens,
    its blocks rematerialised as `remat` asks (`dew.nn.backbones._remat`)."""
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
    policy = remat_policy(kind, remat)
    return TransformerStack(
        vocab_size=vocab_size + extra_tokens,
        out_features=vocab_size,
        dtype=dtype,
        attention_impl=attention_impl,
        remat=policy,
        key=key,
        **sizes,
    )
