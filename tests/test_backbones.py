"""Backbones: a NumPy reference forward pass, causality, dtypes and configuration errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects

from dew.nn.backbones import BidirectionalTransformer, CausalTransformer

SIZES = {
    "vocab_size": 7,
    "emb_features": 16,
    "num_layers": 2,
    "num_heads": 2,
    "mlp_features": 24,
    "max_seq_len": 12,
}


def _layer_norm(x, norm):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.eps) * np.asarray(norm.weight) + np.asarray(norm.bias)


def _linear(x, linear):
    return x @ np.asarray(linear.weight, np.float64).T + np.asarray(linear.bias, np.float64)


def _gelu(x):  # jax.nn.gelu's default tanh approximation
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _reference_forward(model, tokens, causal):
    """The pre-norm transformer written out in float64 NumPy from the module's weights."""
    stack = model.stack
    seq = len(tokens)
    x = np.asarray(stack.token_embedding.weight, np.float64)[tokens]
    x = x + np.asarray(stack.position_embedding, np.float64)[:seq]
    for block in stack.blocks:
        heads = block.num_heads
        head = x.shape[1] // heads
        h = _layer_norm(x, block.norm_attention)
        qkv = _linear(h, block.qkv).reshape(seq, 3, heads, head)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        logits = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head)
        if causal:
            logits = np.where(np.tril(np.ones((seq, seq), bool)), logits, -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        attended = np.einsum("hqk,khd->qhd", weights, v).reshape(seq, -1)
        x = x + _linear(attended, block.out)
        x = x + _linear(_gelu(_linear(_layer_norm(x, block.norm_mlp), block.up)), block.down)
    return _linear(_layer_norm(x, stack.final_norm), stack.head)


@pytest.mark.parametrize("seq", [1, 5, 12])
def test_causal_transformer_matches_a_numpy_reference(seq):
    model = CausalTransformer(**SIZES, key=jax.random.key(3))
    tokens = np.random.default_rng(seq).integers(0, 7, seq).astype(np.int32)
    expected = _reference_forward(model, tokens, causal=True)
    np.testing.assert_allclose(
        eqx.filter_jit(model)(jnp.asarray(tokens)), expected, rtol=2e-4, atol=2e-5
    )


def test_bidirectional_transformer_matches_a_numpy_reference():
    model = BidirectionalTransformer(**SIZES, key=jax.random.key(4))
    tokens = np.array([0, 7, 3, 7, 6], np.int32)  # 7 is the mask token
    expected = _reference_forward(model, tokens, causal=False)
    np.testing.assert_allclose(model(jnp.asarray(tokens)), expected, rtol=2e-4, atol=2e-5)
    assert model.mask_id == 7
    assert model(jnp.asarray(tokens)).shape == (5, 7)


def test_causal_logits_ignore_later_tokens_and_bidirectional_ones_do_not():
    causal = CausalTransformer(**SIZES, key=jax.random.key(0))
    bidirectional = BidirectionalTransformer(**SIZES, key=jax.random.key(0))
    causal, bidirectional = eqx.filter_jit(causal), eqx.filter_jit(bidirectional)
    tokens = jnp.array([1, 2, 3, 4, 5, 6], jnp.int32)
    changed = tokens.at[4].set(0)
    np.testing.assert_array_equal(causal(tokens)[:4], causal(changed)[:4])
    assert not np.allclose(causal(tokens)[4:], causal(changed)[4:])
    assert not np.allclose(bidirectional(tokens)[:4], bidirectional(changed)[:4])


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_bfloat16_computes_in_bfloat16_and_keeps_float32_parameters():
    model32 = CausalTransformer(**SIZES, dtype="float32", key=jax.random.key(0))
    model16 = CausalTransformer(**SIZES, dtype="bfloat16", key=jax.random.key(0))
    leaves = jax.tree.leaves(eqx.filter(model16, eqx.is_inexact_array))
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.float32)}
    tokens = jnp.array([1, 2, 3], jnp.int32)
    logits16 = model16(tokens)
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, model32(tokens), atol=0.1)
    assert not np.array_equal(logits16, model32(tokens))
    jaxpr = str(jax.make_jaxpr(model16)(tokens))
    assert "bf16" in jaxpr


def test_models_vmap_over_a_batch_and_jit():
    model = CausalTransformer(**SIZES, key=jax.random.key(0))
    batch = jnp.zeros((3, 5), jnp.int32)
    logits = eqx.filter_jit(lambda m, b: jax.vmap(m)(b))(model, batch)
    assert logits.shape == (3, 5, 7)


def test_sequences_longer_than_max_seq_len_raise():
    model = CausalTransformer(**SIZES, key=jax.random.key(0))
    with pytest.raises(ValueError, match="sequence of 13 tokens, longer than max_seq_len 12"):
        model(jnp.zeros(13, jnp.int32))


def test_cudnn_attention_raises_clearly_without_a_gpu():
    if jax.default_backend() == "gpu":
        pytest.skip("this machine has a GPU; the cudnn path is exercised by the device check")
    with pytest.raises(ValueError, match="attention_impl 'cudnn' needs a CUDA GPU, but the"):
        CausalTransformer(**SIZES, dtype="bfloat16", attention_impl="cudnn", key=jax.random.key(0))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"dtype": "float16"}, ValueError, "dtype 'float16' is not one of 'float32', 'bfloat16'"),
        ({"attention_impl": "flash"}, ValueError, "attention_impl 'flash' is not one of"),
        ({"emb_features": 15}, ValueError, r"emb_features \(15\) must be divisible by num_heads"),
        ({"num_layers": 0}, ValueError, "num_layers must be an integer >= 1, got 0"),
        ({"vocab_size": 2.5}, ValueError, "vocab_size must be an integer >= 1"),
    ],
)
def test_bad_configurations_raise(change, error, message):
    with rejects(error, message, parameter=next(iter(change))):
        CausalTransformer(**(SIZES | change), key=jax.random.key(0))


@pytest.mark.parametrize("backbone", [CausalTransformer, BidirectionalTransformer])
def test_the_initialisation_key_is_a_required_keyword(backbone):
    # As in eqx.nn: no silent default key, and no key by position.
    with pytest.raises(TypeError, match="key"):
        backbone(**SIZES)
    with pytest.raises(TypeError):
        backbone(*SIZES.values(), "float32", "xla", jax.random.key(0))
    a, b = (backbone(**SIZES, key=jax.random.key(seed)) for seed in (0, 1))
    assert not np.array_equal(a.stack.head.weight, b.stack.head.weight)
