"""The backbones' row-wise layers (`dense`, `layer_norm`) against `jax.vmap` of Equinox's
own layers, and what they are for: a training step whose compiled gradient does not
recompute every layer's norm gradient in every layer below it (decision 0049)."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.nn.backbones import CausalTransformer
from dew.nn.backbones._layers import dense, layer_norm
from dew.objectives.base import combine, trainable


def _values_and_gradients(function, layer, x):
    """`function(layer, x)` and the gradients of a fixed weighting of it with respect to
    the layer's arrays and `x`."""
    weights = jax.random.normal(jax.random.key(9), function(layer, x).shape, jnp.float32)

    def scalar(layer, x):
        return jnp.sum(function(layer, x).astype(jnp.float32) * weights)

    with jax.numpy_dtype_promotion("standard"):
        layer_grads, x_grads = jax.grad(scalar, argnums=(0, 1))(layer, x)
    return [function(layer, x), x_grads, *jax.tree.leaves(layer_grads)]


def _equinox(layer, x):
    return jax.vmap(jax.vmap(layer))(x)


def _assert_same(got, want, dtype):
    tolerance = 2e-6 if dtype == jnp.float32 else 2e-2
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tolerance, atol=tolerance
        )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_is_equinox_layer_norm_mapped_over_rows(dtype, affine):
    norm = eqx.nn.LayerNorm(6, use_weight=affine, use_bias=affine)
    if affine:  # away from Equinox's ones and zeros, so a swapped weight and bias shows
        norm = eqx.tree_at(
            lambda n: (n.weight, n.bias),
            norm,
            (1 + 0.3 * jnp.arange(6.0), 0.1 * jnp.arange(6.0) - 0.2),
        )
    # A large common offset: a variance computed as E[x^2] - E[x]^2 would lose it.
    x = (100 + jax.random.normal(jax.random.key(1), (3, 4, 6))).astype(dtype)
    _assert_same(
        _values_and_gradients(layer_norm, norm, x),
        _values_and_gradients(_equinox, norm, x),
        dtype,
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_is_equinox_linear_mapped_over_rows(dtype, use_bias):
    linear = eqx.nn.Linear(6, 5, use_bias=use_bias, key=jax.random.key(2))
    linear = jax.tree.map(lambda leaf: leaf.astype(dtype), linear)
    x = jax.random.normal(jax.random.key(3), (3, 4, 6)).astype(dtype)
    _assert_same(
        _values_and_gradients(dense, linear, x),
        _values_and_gradients(_equinox, linear, x),
        dtype,
    )


def test_layer_norm_names_a_row_size_that_does_not_match():
    with pytest.raises(ValueError, match=r"shape \(6,\) cannot normalise rows of shape \(5,\)"):
        layer_norm(eqx.nn.LayerNorm(6), jnp.zeros((2, 5)))


def _fusion_sizes(num_layers: int, *, batched: bool = False) -> list[int]:
    """Instructions in each fusion of a compiled LM training gradient, the model called on
    the batch (`batched`) or `jax.vmap`ped over its sequences."""
    model = CausalTransformer(
        vocab_size=16,
        emb_features=32,
        num_layers=num_layers,
        num_heads=4,
        mlp_features=64,
        max_seq_len=32,
        key=jax.random.key(0),
    )

    def loss(params, rows):
        call = combine(params, model)
        logits = call(rows[:, :-1]) if batched else jax.vmap(call)(rows[:, :-1])
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, rows[:, 1:, None], axis=-1))

    rows = jnp.zeros((8, 33), jnp.int32)
    text = jax.jit(jax.grad(loss)).lower(trainable(model), rows).compile().as_text()
    bodies = {
        match[1]: match[2]
        for match in re.finditer(r"\n%?([\w.-]+) [^\n]*\{\n(.*?)\n\}", text, re.S)
    }
    entry = text[text.index("\nENTRY") :]
    called = re.findall(r"fusion\(.*?calls=%?([\w.-]+)", entry)
    return [
        len(re.findall(r"= \S+ (?!parameter)[\w-]+\(", bodies.get(name, ""))) for name in called
    ]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU fusion decisions")
def test_a_deeper_stack_does_not_recompute_each_layer_norm_gradient_below_it():
    """With `jax.vmap(eqx.nn.LayerNorm)` XLA's CPU compiler fused each layer's norm gradient
    into every fusion below it that reads the residual stream's gradient, so the largest
    fusion grew by about 50 instructions a layer (140 at 2 layers, 347 at 6) and the step
    by a quadratic term. With `layer_norm` a layer adds about 10 (30 and 68)."""
    growth = max(_fusion_sizes(6)) - max(_fusion_sizes(2))
    assert growth < 100, growth


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU fusion decisions")
def test_a_batch_call_compiles_to_less_work_than_the_vmapped_call():
    """Called on the batch, the stack's rows form one matrix, and XLA stores the residual
    stream's gradient once per layer for the products that read it instead of recomputing
    it inside three fusions per layer (decision 0058): at 6 layers 2,600 fused
    instructions against 4,000."""
    batched, mapped = sum(_fusion_sizes(6, batched=True)), sum(_fusion_sizes(6))
    assert batched < 0.8 * mapped, (batched, mapped)
