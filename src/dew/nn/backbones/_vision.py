"""Pieces shared by the vision backbones (`DiT`, `ViT`): the configuration check, patch
tokens, masked multi-head self-attention and the compute-dtype cast."""

from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from dew._integers import check_integer
from dew._precision import compute_dtype
from dew.nn.backbones._layers import column_parallel, dense, row_parallel
from dew.nn.backbones._transformer import COMPUTE_DTYPES, _xla_attention

_M = TypeVar("_M", bound=eqx.Module)

__all__ = [
    "SelfAttention",
    "check_vision_configuration",
    "in_compute_dtype",
    "patchify",
    "unpatchify",
]


def check_vision_configuration(
    kind: str,
    *,
    image_size: int,
    patch_size: int,
    channels: int,
    width: int,
    depth: int,
    heads: int,
    dtype: str,
    frames: int | None = None,
    num_classes: int | None = None,
) -> None:
    """Raise a clear `ValueError` for sizes the backbone cannot run; errors name `kind`."""
    for field, value in (
        ("image_size", image_size),
        ("patch_size", patch_size),
        ("channels", channels),
        ("width", width),
        ("depth", depth),
        ("heads", heads),
    ):
        check_integer(f"{kind}.{field}", value, minimum=1)
    check_integer(f"{kind}.frames", frames, minimum=1, optional=True)
    check_integer(f"{kind}.num_classes", num_classes, minimum=1, optional=True)
    if image_size % patch_size:
        raise ValueError(
            f"{kind}.image_size ({image_size}) must be divisible by patch_size ({patch_size})."
        )
    if width % heads:
        raise ValueError(f"{kind}.width ({width}) must be divisible by heads ({heads}).")
    if dtype not in COMPUTE_DTYPES:
        allowed = ", ".join(repr(name) for name in COMPUTE_DTYPES)
        raise ValueError(f"{kind}.dtype {dtype!r} is not one of {allowed}.")


def patchify(
    clip: Float[Array, "frames height width channels"], patch_size: int
) -> Float[Array, "tokens patch_features"]:
    """Cut a clip into non-overlapping `patch_size` squares, frame by frame and row by row
    within a frame; each token is one patch flattened as (row, column, channel)."""
    frames, height, width, channels = clip.shape
    p = patch_size
    patches = clip.reshape(frames, height // p, p, width // p, p, channels)
    return patches.transpose(0, 1, 3, 2, 4, 5).reshape(-1, p * p * channels)


def unpatchify(
    tokens: Float[Array, "tokens patch_features"],
    shape: tuple[int, ...],
    patch_size: int,
) -> Float[Array, "frames height width channels"]:
    """The inverse of `patchify` for a clip of `shape` (frames, height, width, channels)."""
    frames, height, width, channels = shape
    p = patch_size
    patches = tokens.reshape(frames, height // p, width // p, p, p, channels)
    return patches.transpose(0, 1, 3, 2, 4, 5).reshape(shape)


def in_compute_dtype(module: _M, dtype: str) -> _M:
    """`module` with every floating-point array cast to the compute dtype `dtype` (bfloat16
    under a bfloat16 precision policy, `dew._precision.compute_dtype`)."""
    compute = compute_dtype(dtype)
    return jax.tree.map(
        lambda leaf: leaf.astype(compute) if eqx.is_inexact_array(leaf) else leaf, module
    )


class SelfAttention(eqx.Module):
    """Multi-head self-attention with a fused query/key/value projection (with biases)
    and an output projection; an optional `(keys,)` boolean mask hides keys from every
    query."""

    qkv: eqx.nn.Linear
    out: eqx.nn.Linear
    heads: int = eqx.field(static=True)

    def __init__(self, width: int, heads: int, *, key: PRNGKeyArray):
        qkv_key, out_key = jax.random.split(key)
        self.qkv = eqx.nn.Linear(width, 3 * width, key=qkv_key)
        self.out = eqx.nn.Linear(width, width, key=out_key)
        self.heads = heads

    def tensor_sharding(self) -> dict[str, jax.sharding.PartitionSpec]:
        """The split over a mesh's `"model"` axis (`Trainer(strategy="fsdp+tensor")`): the
        fused query/key/value projection by its outputs, the output projection by its inputs
        (the heads)."""
        return {**column_parallel("qkv"), **row_parallel("out")}

    def __call__(
        self, x: Float[Array, "seq width"], mask: Bool[Array, "seq seq"] | None = None
    ) -> Float[Array, "seq width"]:
        """Attend from every row of `x` to the rows `mask[query]` allows (all without one)."""
        seq, width = x.shape
        qkv = dense(self.qkv, x).reshape(seq, 3, self.heads, width // self.heads)
        if qkv.dtype != jnp.float32:  # bfloat16: the same arithmetic, written out
            # jax.nn.dot_product_attention's bfloat16 products name a dot algorithm whose
            # lowering (at the compiled call, past any promotion context here) refuses a
            # caller's strict promotion; the written-out form also follows the precision
            # policy (bfloat16 logits under "bfloat16", decision 0078).
            visible = None if mask is None else mask[None]
            attended = _xla_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], causal=False, mask=visible)
            return dense(self.out, attended.reshape(seq, width))
        # jax.nn.dot_product_attention mixes bfloat16 inputs with float32 internals,
        # which a caller's strict dtype promotion would refuse.
        with jax.numpy_dtype_promotion("standard"):
            attended = jax.nn.dot_product_attention(
                qkv[:, 0],
                qkv[:, 1],
                qkv[:, 2],
                mask=None if mask is None else mask[None],
                implementation="xla",
            )
        return dense(self.out, attended.reshape(seq, width))
