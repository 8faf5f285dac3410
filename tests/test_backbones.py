"""Backbones: a NumPy reference forward pass, causality, dtypes and configuration errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize(
    ("backbone", "remat"),
    [(CausalTransformer, False), (CausalTransformer, True), (BidirectionalTransformer, False)],
)
def test_a_batch_of_sequences_is_the_vmapped_call_in_values_and_gradients(backbone, remat):
    """Token IDs with leading batch axes go through the stack as the rows of one matrix
    (decision 0058): the logits and gradients are those of `jax.vmap` over the sequences."""
    model = backbone(**SIZES, remat=remat, key=jax.random.key(3))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 7, (2, 3, 9)), jnp.int32)
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss_and_grads(params, batched):
        def loss(params):
            call = eqx.combine(params, static)
            out = call(tokens) if batched else jax.vmap(jax.vmap(call))(tokens)
            return jnp.mean(jnp.sin(out) * out), out

        return jax.value_and_grad(loss, has_aux=True)(params)

    loss_and_grads = jax.jit(loss_and_grads, static_argnums=1)
    ((loss, logits), grads), ((again, mapped), regrads) = (
        loss_and_grads(params, batched) for batched in (True, False)
    )
    assert logits.shape == (2, 3, 9, 7)
    np.testing.assert_allclose(logits, mapped, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, again, rtol=1e-6)
    for leaf, releaf in zip(jax.tree.leaves(grads), jax.tree.leaves(regrads), strict=True):
        scale = float(jnp.max(jnp.abs(releaf))) or 1.0
        np.testing.assert_allclose(leaf, releaf, rtol=1e-5, atol=1e-6 * scale)


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


# The key/value cache: prefill and decode against the full forward pass.
def test_the_parameter_tree_a_checkpoint_holds_is_unchanged_by_the_cache():
    """The cache lives outside the model: a checkpoint written before it restores into
    the same parameter paths (the parameters of one block are written out here)."""
    model = CausalTransformer(**(SIZES | {"num_layers": 1}), key=jax.random.key(0))
    params = eqx.filter(model, eqx.is_inexact_array)
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
    block = [
        f".stack.blocks[0].{layer}.{leaf}"
        for layer in ("norm_attention", "qkv", "out", "norm_mlp", "up", "down")
        for leaf in ("weight", "bias")
    ]
    assert paths == [
        ".stack.token_embedding.weight",
        ".stack.position_embedding",
        *block,
        ".stack.final_norm.weight",
        ".stack.final_norm.bias",
        ".stack.head.weight",
        ".stack.head.bias",
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_logits_are_the_forward_pass_logits_bit_for_bit(dtype):
    model = CausalTransformer(**SIZES, dtype=dtype, key=jax.random.key(5))
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, 7, 9), jnp.int32)
    logits, cache = eqx.filter_jit(lambda m, t: m.prefill(t, capacity=11))(model, tokens)
    np.testing.assert_array_equal(logits, eqx.filter_jit(model)(tokens))
    assert int(cache.length) == 9 and cache.capacity == 11
    assert len(cache.keys) == len(cache.values) == SIZES["num_layers"]
    assert cache.keys[0].shape == (11, 2, 8)
    assert cache.keys[0].dtype == jnp.dtype(dtype)


CAPACITY = SIZES["max_seq_len"]


@eqx.filter_jit
def _cached_logits(model, prompts, tokens, lengths):
    """Per row: a prefill over `prompts[i]` (right-padded: its first `lengths[i]` tokens
    count), then a decode step for each of `tokens[i, lengths[i]:]`. Returns the logits
    after every position from `lengths[i] - 1` on (zeros before) and the cache lengths."""

    def row(prompt, sequence, length):
        logits, cache = model.prefill(prompt, capacity=CAPACITY, length=length)
        out = jnp.zeros((CAPACITY, logits.shape[-1])).at[length - 1].set(logits[length - 1])

        def step(position, carry):
            out, cache = carry
            logits, cache = model.decode(sequence[position], cache)
            return out.at[position].set(logits), cache

        out, cache = jax.lax.fori_loop(length, CAPACITY, step, (out, cache))
        return out, cache.length

    return jax.vmap(row)(prompts, tokens, lengths)


def _check_cached_logits(model, rng, lengths, width):
    """Rows of `CAPACITY` tokens, prompts of `width` holding each row's first `lengths[i]`
    tokens and then other tokens (padding the decode steps overwrite before reading)."""
    rows = len(lengths)
    tokens = jnp.asarray(rng.integers(0, 7, (rows, CAPACITY)), jnp.int32)
    shift = jnp.asarray(rng.integers(1, 7, (rows, width)), jnp.int32)
    padding = jnp.arange(width)[None, :] >= jnp.asarray(lengths)[:, None]
    prompts = jnp.where(padding, (tokens[:, :width] + shift) % 7, tokens[:, :width])
    logits, filled = _cached_logits(model, prompts, tokens, jnp.asarray(lengths, jnp.int32))
    np.testing.assert_array_equal(filled, CAPACITY)
    full = jax.vmap(model)(tokens)
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(
            logits[row, length - 1 :], full[row, length - 1 :], rtol=1e-5, atol=1e-5
        )


def test_decoding_with_the_cache_gives_the_forward_pass_logits():
    """Rows of one batch prefilled to different lengths decode as the full forward pass
    computes each row alone, to float32 rounding."""
    model = CausalTransformer(**(SIZES | {"num_layers": 1}), key=jax.random.key(6))
    _check_cached_logits(model, np.random.default_rng(6), [1, 3, 6, 2], width=6)


@pytest.mark.slow  # about 20 s: a compilation per model structure and prompt width
@settings(max_examples=16)
@given(
    st.sampled_from([(1, 1), (2, 2)]),  # layers, heads
    st.sampled_from([4, 12]),  # prompt width
    st.data(),
)
def test_decoding_with_the_cache_gives_the_forward_pass_logits_for_any_sizes(
    structure, width, data
):
    layers, heads = structure
    lengths = data.draw(st.lists(st.integers(1, width), min_size=3, max_size=3), label="lengths")
    sizes = SIZES | {"num_layers": layers, "num_heads": heads, "emb_features": 8 * heads}
    model = CausalTransformer(**sizes, key=jax.random.key(layers))
    _check_cached_logits(model, np.random.default_rng(sum(lengths) * width), lengths, width)


@pytest.mark.parametrize(
    ("seq", "capacity", "message"),
    [
        (5, 4, "got a prompt of 5 tokens, capacity 4 and max_seq_len 12"),
        (5, 13, "got a prompt of 5 tokens, capacity 13 and max_seq_len 12"),
        (0, 4, "got a prompt of 0 tokens, capacity 4"),
    ],
)
def test_a_prefill_that_does_not_fit_its_cache_raises(seq, capacity, message):
    model = CausalTransformer(**SIZES, key=jax.random.key(0))
    with pytest.raises(ValueError, match=message):
        model.prefill(jnp.zeros(seq, jnp.int32), capacity=capacity)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("masking", ["none", "causal", "mask", "causal and mask"])
def test_the_xla_attention_is_jax_dot_product_attention_values_and_gradients(dtype, masking):
    """The stack's own attention formulation against JAX's, whose arithmetic it copies."""
    from dew.nn.backbones._transformer import _xla_attention

    q, k, v = (
        jax.random.normal(key, (5, 2, 4), jnp.float32).astype(dtype)
        for key in jax.random.split(jax.random.key(3), 3)
    )
    causal = "causal" in masking
    visible = jnp.broadcast_to(jnp.arange(5) <= 3, (1, 5, 5))  # as a decode step masks
    mask = visible if "mask" in masking else None

    def ours(q, k, v):
        return _xla_attention(q, k, v, causal=causal, mask=mask)

    def theirs(q, k, v):
        return jax.nn.dot_product_attention(
            q, k, v, mask=mask, is_causal=causal, implementation="xla"
        )

    def values_and_gradients(attention):
        squares = jax.grad(lambda *x: jnp.sum(attention(*x).astype(jnp.float32) ** 2), (0, 1, 2))
        return (attention(q, k, v), *squares(q, k, v))

    # JAX's attention mixes bfloat16 and float32 in its gradient, which strict promotion
    # refuses; ours computes under the tests' strict promotion.
    with jax.numpy_dtype_promotion("standard"):
        expected = values_and_gradients(theirs)
    tolerance = 1e-6 if dtype == jnp.float32 else 1e-2
    for got, want in zip(values_and_gradients(ours), expected, strict=True):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_allclose(
            np.asarray(got, np.float32),
            np.asarray(want, np.float32),
            rtol=tolerance,
            atol=tolerance,
        )
