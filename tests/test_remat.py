"""Rematerialisation of the backbones' blocks (`remat=`, `dew.nn.backbones._remat`): the same
loss and gradients as without it, under every policy and every backbone, and less temporary
memory in the compiled training step of a deep model, read from XLA's own `memory_analysis`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.config import override
from dew.config._builtin import tiny_lm
from dew.nn.backbones import (
    REMAT_POLICIES,
    BidirectionalTransformer,
    CausalTransformer,
    DiT,
    ViT,
)

TOKENS = {"vocab_size": 11, "emb_features": 16, "num_layers": 2, "num_heads": 2}
TOKENS |= {"mlp_features": 32, "max_seq_len": 12}


def _backbone(name, remat):
    key = jax.random.key(7)
    if name == "causal":
        return CausalTransformer(**TOKENS, remat=remat, key=key)
    if name == "bidirectional":
        return BidirectionalTransformer(**TOKENS, remat=remat, key=key)
    if name == "dit":
        return DiT(8, 2, 3, 16, 2, 2, num_classes=3, remat=remat, key=key)
    return ViT(8, 2, 3, 16, 2, 2, remat=remat, key=key)


def _batch(name):
    rows = np.random.default_rng(0)
    if name in ("causal", "bidirectional"):
        return (jnp.asarray(rows.integers(0, 11, (4, 12)), jnp.int32),)
    images = jnp.asarray(rows.random((4, 8, 8, 3)), jnp.float32)
    if name == "dit":
        times = jnp.asarray(rows.random(4), jnp.float32)
        return images, times, jnp.asarray([0, 1, 2, 3], jnp.int32)  # 3: the null label
    mask = jnp.asarray(rows.random((4, 16)) < 0.6)
    return images, mask


def _loss_and_grads(model, batch):
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss(params):
        out = jax.vmap(eqx.combine(params, static))(*batch)
        return jnp.mean(jnp.sin(out) * out)

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize(
    ("name", "remat"),
    [  # every policy on one backbone, then each other backbone (their blocks differ)
        *(("causal", remat) for remat in (True, *REMAT_POLICIES[1:])),
        *((name, True) for name in ("bidirectional", "dit", "vit")),
    ],
)
def test_the_loss_and_gradients_are_those_without_remat(name, remat):
    batch = _batch(name)
    plain, rematerialised = _backbone(name, False), _backbone(name, remat)
    leaves = zip(jax.tree.leaves(plain), jax.tree.leaves(rematerialised), strict=True)
    assert all(np.array_equal(a, b) for a, b in leaves)  # the same parameters: remat is static
    (loss, grads), (again, regrads) = (
        _loss_and_grads(model, batch) for model in (plain, rematerialised)
    )
    np.testing.assert_allclose(again, loss, rtol=1e-6)
    for leaf, releaf in zip(jax.tree.leaves(grads), jax.tree.leaves(regrads), strict=True):
        scale = float(jnp.max(jnp.abs(leaf))) or 1.0
        np.testing.assert_allclose(releaf, leaf, rtol=1e-5, atol=1e-6 * scale)


def _temporary_bytes(remat):
    """XLA's temporary buffer size of a jitted gradient step of a 6-layer causal transformer
    over a batch of 8 sequences of 64 tokens."""
    model = CausalTransformer(32, 32, 6, 2, 128, 64, remat=remat, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tokens = jnp.zeros((8, 64), jnp.int32)

    def loss(params):
        return jnp.mean(jax.vmap(eqx.combine(params, static))(tokens) ** 2)

    compiled = jax.jit(jax.grad(loss)).lower(params).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_the_compiled_step_of_a_deep_model_holds_less_temporary_memory():
    plain = _temporary_bytes(False)
    # Measured on CPU (jax 0.10.2): 13.2 MB without, 3.7 MB with remat=True (one block's
    # activations at a time), 8.0 MB keeping the products ("dots_saveable"). At 8 layers of
    # 64 features over 128 tokens: 102.9, 20.2 and 51.9 MB.
    assert _temporary_bytes(True) < 0.4 * plain
    assert _temporary_bytes("dots_saveable") < 0.75 * plain


def test_a_bad_remat_is_one_error_naming_the_backbone_and_what_is_allowed():
    with pytest.raises(ValueError, match="remat") as caught:
        CausalTransformer(**TOKENS, remat="everything", key=jax.random.key(0))
    assert str(caught.value) == (
        "CausalTransformer.remat 'everything' is not one of True, False, 'nothing_saveable', "
        "'dots_saveable', 'dots_with_no_batch_dims_saveable', 'everything_saveable'."
    )
    with pytest.raises(ValueError, match=r"^DiT\.remat 'yes' is not one of True, False, "):
        DiT(8, 2, 3, 16, 1, 2, remat="yes", key=jax.random.key(0))


def test_a_run_configuration_turns_it_on_and_round_trips(tmp_path):
    config = override(tiny_lm(), {"model.kwargs.remat": "dots_saveable"})
    config.dump_toml(tmp_path / "run.toml")
    again = type(config).load(tmp_path / "run.toml")
    assert again == config and again.model.kwargs["remat"] == "dots_saveable"
    assert again.model.build(key=jax.random.key(0)).stack.remat == "dots_saveable"
