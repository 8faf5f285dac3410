"""Equinox layers applied to every row of an array at once: the forms the backbones use
inside a training step (decision 0049).

Both read the layer's own fields, so a model's parameter tree stays Equinox's."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float

from dew._precision import keeps_float32

__all__ = ["column_parallel", "dense", "layer_norm", "row_parallel"]


def column_parallel(*names: str) -> dict[str, PartitionSpec]:
    """`tensor_sharding` entries (`Trainer(strategy="fsdp+tensor")`) splitting each Linear
    field in `names` by its outputs over a mesh's `"model"` axis: its weight's rows and its
    bias."""
    return {
        key: spec
        for name in names
        for key, spec in (
            (f"{name}.weight", PartitionSpec("model")),
            (f"{name}.bias", PartitionSpec("model")),
        )
    }


def row_parallel(*names: str) -> dict[str, PartitionSpec]:
    """`tensor_sharding` entries splitting each Linear field in `names` by its inputs over a
    mesh's `"model"` axis (its weight's columns; its bias, added after the sum, whole)."""
    return {f"{name}.weight": PartitionSpec(None, "model") for name in names}


def dense(layer: eqx.nn.Linear, x: Float[Array, "*rows in"]) -> Float[Array, "*rows out"]:
    """`layer` applied to every row of `x` as one matrix product.

    `jax.vmap(layer)` computes the same values, but its `weight @ row` batches into a
    product whose result XLA transposes back, on the way in and in the gradient: a
    third of a training step's time on CPU (decision 0049)."""
    y = x @ layer.weight.T
    return y if layer.bias is None else y + jnp.broadcast_to(layer.bias, y.shape)


def layer_norm(layer: eqx.nn.LayerNorm, x: Float[Array, "*rows features"]) -> Array:
    """`jax.vmap(layer)` over every row of `x` (a norm over the last axis), computed as
    Equinox computes it: in float32 at least, the two-pass variance, `eps` under the root,
    then the weight and the bias; the result in `x`'s dtype.

    Written here rather than mapped because of what autodiff makes of it: Equinox's form
    (the mean computed twice, `jnp.var`, a `maximum` against zero that a two-pass variance
    never needs) gives a gradient whose elementwise terms XLA's CPU compiler fuses into every
    later layer's gradient instead of storing once, so a step recomputed each layer's norm
    gradient in every layer below it: a fifth of a 4-layer step at width 256 (decision 0049).
    The values are the same up to float rounding. Under the `"bfloat16"` precision policy
    (decision 0078) a bfloat16 `x` is normalised in bfloat16 instead."""
    if layer.shape != x.shape[-1:]:
        raise ValueError(
            f"layer_norm of shape {layer.shape} cannot normalise rows of shape {x.shape[-1:]}."
        )
    dtype = x.dtype
    if keeps_float32():
        with jax.numpy_dtype_promotion("standard"):
            dtype = jnp.result_type(x.dtype, jnp.float32)
    x32 = x.astype(dtype)
    centered = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
    out = centered * jax.lax.rsqrt(variance + layer.eps)
    if layer.weight is not None:
        out = jnp.broadcast_to(layer.weight.astype(dtype), out.shape) * out
    if layer.bias is not None:
        out = out + jnp.broadcast_to(layer.bias.astype(dtype), out.shape)
    return out.astype(x.dtype)
