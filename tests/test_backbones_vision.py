"""Vision backbones (DiT, ViT): NumPy reference forward passes, adaLN-zero, token masks,
dtypes, configuration errors and the registry."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects

from dew.config import ModelConfig
from dew.nn.backbones import DiT, ViT
from dew.nn.backbones._vision import SelfAttention
from dew.registry import models

SIZES = {"image_size": 8, "patch_size": 4, "channels": 3, "width": 8, "depth": 2, "heads": 2}


def _count(model):
    return sum(leaf.size for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))


def _randomised(model, key, scale=0.3):
    """`model` with every float leaf redrawn: the zero-initialised modulation and head
    become nonzero, so the whole network is exercised."""
    leaves, treedef = jax.tree.flatten(eqx.filter(model, eqx.is_inexact_array))
    keys = jax.random.split(key, len(leaves))
    drawn = [scale * jax.random.normal(k, leaf.shape) for k, leaf in zip(keys, leaves, strict=True)]
    return eqx.combine(jax.tree.unflatten(treedef, drawn), model)


# The NumPy reference: float64, written out from the weights, patch by patch.


def _np(array):
    return np.asarray(array, np.float64)


def _linear(x, linear):
    return x @ _np(linear.weight).T + _np(linear.bias)


def _norm(x, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)


def _affine_norm(x, norm):
    return _norm(x, norm.eps) * _np(norm.weight) + _np(norm.bias)


def _gelu(x):  # jax.nn.gelu's default tanh approximation
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _silu(x):
    return x / (1 + np.exp(-x))


def _attention(x, attention, allowed=None):
    seq, width = x.shape
    heads = attention.heads
    head = width // heads
    qkv = _linear(x, attention.qkv)
    q, k, v = (qkv[:, i * width : (i + 1) * width].reshape(seq, heads, head) for i in range(3))
    logits = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head)
    if allowed is not None:
        logits = np.where(allowed[None], logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return _linear(np.einsum("hqk,khd->qhd", weights, v).reshape(seq, width), attention.out)


def _patches(clip, p):
    """Tokens frame by frame, then patch rows, then patch columns; each (row, col, channel)."""
    frames, height, width, _ = clip.shape
    return np.stack(
        [
            clip[f, r : r + p, c : c + p].reshape(-1)
            for f in range(frames)
            for r in range(0, height, p)
            for c in range(0, width, p)
        ]
    )


def _reference_dit(model, x, t, label):
    clip = _np(x) if model.frames is not None else _np(x)[None]
    frames, size, _, channels = clip.shape
    p = model.patch_size
    h = _linear(_patches(clip, p), model.patch_embedding)
    per_frame = (size // p) ** 2
    h = h + np.tile(_np(model.space_embedding), (frames, 1))
    if model.time_position_embedding is not None:
        h = h + np.repeat(_np(model.time_position_embedding), per_frame, axis=0)
    width = h.shape[1]
    half = width // 2
    angles = 1000 * t * np.exp(-np.log(10000.0) * np.arange(half) / half)
    sinusoid = np.concatenate([np.sin(angles), np.cos(angles)])
    first, second = model.time_mlp.layers
    condition = _linear(_silu(_linear(sinusoid, first)), second)
    if model.label_embedding is not None:
        condition = condition + _np(model.label_embedding.weight)[label]
    for block in model.blocks:
        m = _linear(_silu(condition), block.modulation).reshape(6, width)
        h = h + m[2] * _attention(_norm(h) * (1 + m[1]) + m[0], block.attention)
        mlp = _linear(_gelu(_linear(_norm(h) * (1 + m[4]) + m[3], block.up)), block.down)
        h = h + m[5] * mlp
    shift, scale = _linear(_silu(condition), model.final_modulation).reshape(2, width)
    out = _linear(_norm(h) * (1 + scale) + shift, model.head)
    pictures = np.zeros_like(clip)
    index = 0
    for f in range(frames):
        for r in range(0, size, p):
            for c in range(0, size, p):
                pictures[f, r : r + p, c : c + p] = out[index].reshape(p, p, channels)
                index += 1
    return pictures.reshape(x.shape)


def _reference_vit(model, image, mask):
    h = _linear(_patches(_np(image)[None], model.patch_size), model.patch_embedding)
    h = h + _np(model.position_embedding)
    allowed = (mask[None, :] & mask[:, None]) | np.eye(len(mask), dtype=bool)
    for block in model.blocks:
        h = h + _attention(_affine_norm(h, block.norm_attention), block.attention, allowed)
        h = h + _linear(_gelu(_linear(_affine_norm(h, block.norm_mlp), block.up)), block.down)
    return np.where(mask[:, None], _affine_norm(h, model.final_norm), 0.0)


@pytest.mark.parametrize(
    "extra", [{}, {"frames": 3}, {"num_classes": 4}, {"frames": 2, "num_classes": 3}]
)
def test_dit_matches_a_numpy_reference(extra):
    model = _randomised(DiT(**SIZES, **extra, key=jax.random.key(0)), jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), model.input_shape)
    label = 1 if "num_classes" in extra else None
    # Compiled, as training runs it (one compilation, not one per eager op).
    got = eqx.filter_jit(model)(x, jnp.asarray(0.37), None if label is None else jnp.asarray(label))
    want = _reference_dit(model, x, 0.37, label if label is not None else 0)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_vit_matches_a_numpy_reference_with_and_without_a_mask():
    model = ViT(**SIZES, key=jax.random.key(0))
    image = jax.random.normal(jax.random.key(1), (8, 8, 3))
    mask = np.array([True, False, True, True])
    np.testing.assert_allclose(
        model(image, jnp.asarray(mask)), _reference_vit(model, image, mask), rtol=2e-4, atol=2e-5
    )
    everything = np.ones(4, bool)
    np.testing.assert_allclose(
        model(image), _reference_vit(model, image, everything), rtol=2e-4, atol=2e-5
    )


def test_self_attention_matches_equinox_multihead_attention():
    """Against an implementation dew did not write, with the same weights loaded."""
    width, heads, seq = 8, 2, 5
    ours = SelfAttention(width, heads, key=jax.random.key(0))
    theirs = eqx.nn.MultiheadAttention(
        heads, width, use_query_bias=True, use_key_bias=True, use_value_bias=True,
        use_output_bias=True, key=jax.random.key(1),
    )  # fmt: skip
    weight, bias = ours.qkv.weight, ours.qkv.bias
    theirs = eqx.tree_at(
        lambda m: (
            m.query_proj.weight, m.query_proj.bias, m.key_proj.weight, m.key_proj.bias,
            m.value_proj.weight, m.value_proj.bias, m.output_proj.weight, m.output_proj.bias,
        ),
        theirs,
        (
            weight[:width], bias[:width], weight[width : 2 * width], bias[width : 2 * width],
            weight[2 * width :], bias[2 * width :], ours.out.weight, ours.out.bias,
        ),
    )  # fmt: skip
    x = jax.random.normal(jax.random.key(2), (seq, width))
    np.testing.assert_allclose(ours(x), theirs(x, x, x), rtol=1e-5, atol=1e-6)
    allowed = jax.random.bernoulli(jax.random.key(3), 0.6, (seq, seq)) | jnp.eye(seq, dtype=bool)
    np.testing.assert_allclose(
        ours(x, allowed), theirs(x, x, x, mask=allowed), rtol=1e-5, atol=1e-6
    )


# DiT: shapes, adaLN-zero and its conditioning.


@pytest.mark.parametrize(
    ("extra", "shape"),
    [({}, (16, 16, 3)), ({"frames": 4}, (4, 16, 16, 3)), ({"num_classes": 5}, (16, 16, 3))],
)
@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_a_fresh_dit_returns_exactly_zero_in_the_input_shape(extra, shape):
    model = DiT(16, 4, 3, 16, 2, 4, **extra, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (6, *shape))
    t = jnp.linspace(0.0, 1.0, 6)
    labels = jnp.arange(6) % 6 if "num_classes" in extra else None
    out = jax.vmap(model)(x, t, labels) if labels is not None else jax.vmap(model)(x, t)
    assert out.shape == (6, *shape) and out.dtype == jnp.float32
    assert np.array_equal(out, np.zeros_like(out))


def test_adaln_conditioning_changes_the_output_once_the_weights_are_nonzero():
    model = _randomised(DiT(**SIZES, num_classes=3, key=jax.random.key(0)), jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), model.input_shape)
    base = model(x, jnp.asarray(0.5), jnp.asarray(1))
    assert np.abs(base).max() > 1e-3
    assert not np.allclose(base, model(x, jnp.asarray(0.6), jnp.asarray(1)), atol=1e-4)
    assert not np.allclose(base, model(x, jnp.asarray(0.5), jnp.asarray(2)), atol=1e-4)
    # label=None is the null label, the embedding's last row
    assert model.null_label == 3 and model.label_embedding.weight.shape[0] == 4
    np.testing.assert_array_equal(base, model(x, 0.5, 1))  # Python scalars work alike
    np.testing.assert_array_equal(
        model(x, jnp.asarray(0.5)), model(x, jnp.asarray(0.5), jnp.asarray(3))
    )


def test_a_clip_dit_tells_its_frames_apart():
    model = _randomised(DiT(**SIZES, frames=2, key=jax.random.key(0)), jax.random.key(1))
    frame = jax.random.normal(jax.random.key(2), (8, 8, 3))
    out = model(jnp.stack([frame, frame]), jnp.asarray(0.5))
    assert model.time_position_embedding.shape == (2, 8)
    assert not np.allclose(out[0], out[1], atol=1e-4)


def test_dit_bad_inputs_raise():
    model = DiT(**SIZES, key=jax.random.key(0))
    with rejects(
        ValueError, r"one example of shape \(8, 8, 3\), got \(2, 8, 8, 3\)", parameter="x"
    ):
        model(jnp.zeros((2, 8, 8, 3)), jnp.asarray(0.5))
    with rejects(ValueError, r"time t must be a float scalar, got float32 \(2,\)", parameter="t"):
        model(jnp.zeros((8, 8, 3)), jnp.zeros(2))
    with pytest.raises(ValueError, match="got a label, but it has no classes"):
        model(jnp.zeros((8, 8, 3)), jnp.asarray(0.5), jnp.asarray(0))
    with pytest.raises(ValueError, match="has no class labels"):
        _ = model.null_label
    labelled = DiT(**SIZES, num_classes=3, key=jax.random.key(0))
    with pytest.raises(
        ValueError, match="got label 4; valid labels are 0 to 2 and the null label 3"
    ):
        labelled(jnp.zeros((8, 8, 3)), jnp.asarray(0.5), jnp.asarray(4))


# ViT: the token mask.


@pytest.mark.slow  # about 8 s; CI runs it with the slow tests
def test_masked_patches_reach_no_visible_output_nor_its_gradient():
    model = ViT(**SIZES, key=jax.random.key(0))
    image = jax.random.normal(jax.random.key(1), (8, 8, 3))
    mask = jnp.array([True, False, False, True])
    hidden = np.zeros((8, 8, 3), bool)
    hidden[:4, 4:] = hidden[4:, :4] = True  # patches 1 and 2
    changed = jnp.where(
        jnp.asarray(hidden), 100.0 * jax.random.normal(jax.random.key(2), (8, 8, 3)), image
    )
    out = model(image, mask)
    np.testing.assert_array_equal(out[mask], model(changed, mask)[mask])
    np.testing.assert_array_equal(out[~mask], np.zeros((2, 8)))
    assert np.isfinite(model(jnp.where(jnp.asarray(hidden), jnp.nan, image), mask)).all()
    gradient = jax.grad(lambda x: jnp.sum(jnp.sin(model(x, mask))))(image)
    assert np.array_equal(np.asarray(gradient)[hidden], np.zeros(hidden.sum()))
    assert np.abs(np.asarray(gradient)[~hidden]).min() > 0
    # without the mask the same change does reach every token
    assert not np.allclose(model(image)[mask], model(changed)[mask], atol=1e-4)


def test_encode_tokens_is_the_second_half_of_the_call():
    model = ViT(**SIZES, key=jax.random.key(0))
    assert model.grid == (2, 2) and model.patches == 4 and model.width == 8
    assert model.position_embedding.shape == (4, 8)
    image = jax.random.normal(jax.random.key(1), (8, 8, 3))
    mask = jnp.array([True, True, False, True])
    tokens = jax.vmap(model.patch_embedding)(jnp.asarray(_patches(np.asarray(image)[None], 4)))
    np.testing.assert_allclose(
        model.encode_tokens(tokens + model.position_embedding, mask),
        model(image, mask),
        rtol=1e-5,
        atol=1e-6,
    )
    # masked tokens are not attended: whatever they hold, visible outputs stay as they are
    noise = 10.0 * jax.random.normal(jax.random.key(2), tokens.shape)
    moved = jnp.where(mask[:, None], tokens, noise)
    np.testing.assert_array_equal(
        model.encode_tokens(tokens, mask)[mask], model.encode_tokens(moved, mask)[mask]
    )
    gradient = jax.grad(lambda z: jnp.sum(jnp.sin(model.encode_tokens(z, mask))))(tokens)
    assert np.array_equal(gradient[~mask], np.zeros((1, 8))) and (gradient[mask] != 0).all()
    assert not np.allclose(model.encode_tokens(tokens)[mask], model.encode_tokens(moved)[mask])


def test_vit_bad_inputs_raise():
    model = ViT(**SIZES, key=jax.random.key(0))
    image = jnp.zeros((8, 8, 3))
    with rejects(ValueError, r"token mask must be boolean of shape \(4,\)", parameter="mask"):
        model(image, jnp.ones(5, bool))
    with rejects(ValueError, r"token mask must be boolean of shape \(4,\)", parameter="mask"):
        model(image, jnp.ones(4, jnp.int32))
    with rejects(ValueError, r"one image of shape \(8, 8, 3\), got \(8, 8, 1\)", parameter="image"):
        model(jnp.zeros((8, 8, 1)))


# Both: dtypes, configuration, keys, compilation, sizes, the registry.


def _one_call(model):
    x = jax.random.normal(jax.random.key(5), (8, 8, 3))
    return model(x, jnp.asarray(0.3)) if isinstance(model, DiT) else model(x)


@pytest.mark.parametrize("cls", [DiT, ViT])
@pytest.mark.slow  # about 6 s; CI runs it with the slow tests
def test_bfloat16_computes_in_bfloat16_and_keeps_float32_parameters(cls):
    model32 = _randomised(cls(**SIZES, key=jax.random.key(0)), jax.random.key(1))
    model16 = _randomised(cls(**SIZES, dtype="bfloat16", key=jax.random.key(0)), jax.random.key(1))
    leaves = jax.tree.leaves(eqx.filter(model16, eqx.is_inexact_array))
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.float32)}
    out16, out32 = _one_call(model16), _one_call(model32)
    assert out16.dtype == jnp.float32
    np.testing.assert_allclose(out16, out32, atol=0.1 * float(np.abs(out32).max()))
    assert not np.array_equal(out16, out32)
    assert "bf16" in str(jax.make_jaxpr(lambda: _one_call(model16))())
    assert "bf16" not in str(jax.make_jaxpr(lambda: _one_call(model32))())


@pytest.mark.parametrize("cls", [DiT, ViT])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image_size": 10}, r"image_size \(10\) must be divisible by patch_size \(4\)"),
        ({"width": 10, "heads": 4}, r"width \(10\) must be divisible by heads \(4\)"),
        ({"depth": 0}, "depth must be an integer >= 1, got 0"),
        ({"patch_size": 2.5}, "patch_size must be an integer >= 1, got 2.5"),
        ({"dtype": "float16"}, "dtype 'float16' is not one of 'float32', 'bfloat16'"),
    ],
)
def test_bad_configurations_raise_naming_the_value(cls, change, message):
    with rejects(ValueError, f"{cls.__name__}.{message}", parameter=next(iter(change))):
        cls(**(SIZES | change), key=jax.random.key(0))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"frames": 0}, "DiT.frames must be None or an integer >= 1, got 0"),
        ({"num_classes": 0}, "DiT.num_classes must be None or an integer >= 1, got 0"),
    ],
)
def test_bad_dit_configurations_raise_naming_the_value(change, message):
    with rejects(ValueError, message, parameter=next(iter(change))):
        DiT(**SIZES, **change, key=jax.random.key(0))


@pytest.mark.parametrize("cls", [DiT, ViT])
def test_the_key_is_required(cls):
    with pytest.raises(TypeError, match="key"):
        cls(**SIZES)


def test_a_second_call_does_not_recompile():
    traces = []

    @eqx.filter_jit
    def velocity(model, x, t, labels):
        traces.append(None)
        return jax.vmap(model)(x, t, labels)

    model = DiT(**SIZES, frames=2, num_classes=3, key=jax.random.key(0))
    x = jnp.zeros((4, 2, 8, 8, 3))
    velocity(model, x, jnp.zeros(4), jnp.zeros(4, jnp.int32))
    velocity(model, x + 1, jnp.ones(4), jnp.ones(4, jnp.int32))
    encoder = ViT(**SIZES, key=jax.random.key(0))
    encode = eqx.filter_jit(lambda m, x, mask: traces.append(None) or jax.vmap(m)(x, mask))
    encode(encoder, x[:, 0], jnp.ones((4, 4), bool))
    encode(encoder, x[:, 0] + 1, jnp.zeros((4, 4), bool))
    assert len(traces) == 2


def test_parameter_counts():
    """Width 64, depth 2, patch 4 on 16 x 16 x 3 images: the research note's DiT has 164k
    parameters; ours adds the final layer's adaLN (8,320) and attention biases (512)."""
    width = 64
    dit = DiT(16, 4, 3, width, 2, 4, key=jax.random.key(0))
    block = (width + 1) * 3 * width + (width + 1) * width  # attention
    block += (width + 1) * 4 * width + (4 * width + 1) * width  # MLP
    block += (width + 1) * 6 * width  # adaLN modulation
    embeddings = (48 + 1) * width + 16 * width + 2 * (width + 1) * width
    final = (width + 1) * 2 * width + (width + 1) * 48
    assert _count(dit) == embeddings + 2 * block + final == 173_296
    assert _count(DiT(16, 4, 3, width, 2, 4, frames=4, key=jax.random.key(0))) == 173_296 + 256
    assert _count(DiT(16, 4, 3, width, 2, 4, num_classes=10, key=jax.random.key(0))) == (
        173_296 + 11 * width
    )
    vit_block = block - (width + 1) * 6 * width + 2 * 2 * width  # no adaLN; two affine norms
    vit = ViT(16, 4, 3, width, 2, 4, key=jax.random.key(0))
    assert _count(vit) == (48 + 1) * width + 16 * width + 2 * vit_block + 2 * width == 104_256


def test_the_registry_builds_both():
    assert models["dit"] is DiT and models["vit"] is ViT
    dit = ModelConfig("dit", SIZES | {"num_classes": 2}).build(key=jax.random.key(0))
    vit = ModelConfig("vit", SIZES).build(key=jax.random.key(0))
    assert isinstance(dit, DiT) and dit.null_label == 2
    assert vit(jnp.zeros((8, 8, 3))).shape == (4, 8)
