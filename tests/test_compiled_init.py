"""The backbones' parameters come from few compiled programs (decision 0048), with the bits
of the eager build: each `jax.random` call its own program, as Equinox's layers run
without dew."""

import equinox as eqx
import jax
import numpy as np
import pytest

from dew.nn._compiled_init import eager_initialisation, initialise
from dew.nn.backbones import BidirectionalTransformer, CausalTransformer, DiT, ViT


def _transformer(kind, layers):
    sizes = {"vocab_size": 13, "emb_features": 24, "num_heads": 3, "mlp_features": 40}
    return lambda key: kind(num_layers=layers, max_seq_len=10, **sizes, key=key)


def _vit(depth):
    return lambda key: ViT(
        image_size=12, patch_size=4, channels=3, width=24, depth=depth, heads=3, key=key
    )


def _dit(depth, **extra):
    sizes = {"image_size": 12, "patch_size": 6, "channels": 2, "width": 24, "heads": 3}
    return lambda key: DiT(depth=depth, **sizes, **extra, key=key)


BUILDS = {
    "causal_transformer": _transformer(CausalTransformer, 3),
    "bidirectional_transformer": _transformer(BidirectionalTransformer, 2),
    "vit": _vit(3),
    "dit_labels": _dit(2, num_classes=4),
    "dit_video": _dit(3, frames=3),
}


def _is_array(leaf):
    return isinstance(leaf, jax.Array | jax.ShapeDtypeStruct)


def _leaves(model):
    return jax.tree.leaves(eqx.filter(model, _is_array))


@pytest.mark.parametrize("name", sorted(BUILDS))
@pytest.mark.parametrize("seed", [0, 7])
def test_every_parameter_has_the_bits_of_the_eager_build(name, seed):
    build = BUILDS[name]
    key = jax.random.key(seed)
    compiled = build(key)
    with eager_initialisation():
        eager = build(key)
    assert jax.tree.structure(compiled) == jax.tree.structure(eager)
    leaves, expected = _leaves(compiled), _leaves(eager)
    assert len(leaves) == len(expected) > 10
    for leaf, want in zip(leaves, expected, strict=True):
        assert leaf.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want), strict=True)
    # equal, not forwarded: every parameter is its own buffer
    pointers = [leaf.unsafe_buffer_pointer() for leaf in leaves]
    assert len(set(pointers)) == len(pointers)


def _compilations(caplog, call):
    """`call()`'s result and the number of XLA compilations it ran."""
    caplog.clear()
    with caplog.at_level("WARNING"), jax.log_compiles():
        result = jax.block_until_ready(call())
    return result, sum(record.getMessage().startswith("Compiling ") for record in caplog.records)


@pytest.mark.parametrize(
    "build",
    [
        # shapes no other test compiles a kernel for
        lambda key: CausalTransformer(
            vocab_size=11,
            emb_features=10,
            num_layers=5,
            num_heads=2,
            mlp_features=17,
            max_seq_len=9,
            key=key,
        ),
        lambda key: ViT(
            image_size=10, patch_size=5, channels=2, width=14, depth=4, heads=2, key=key
        ),
        lambda key: DiT(
            image_size=10,
            patch_size=5,
            channels=2,
            width=14,
            depth=4,
            heads=2,
            num_classes=3,
            key=key,
        ),
    ],
    ids=["causal_transformer", "vit", "dit"],
)
def test_a_backbone_compiles_two_programs_whatever_its_depth(caplog, build):
    key, other = jax.random.key(1), jax.random.key(2)
    jax.block_until_ready((key, other))
    _, compiled = _compilations(caplog, lambda: build(key))
    # eagerly: a kernel for each parameter shape, each split and each slice of a key
    assert compiled == 2
    again, recompiled = _compilations(caplog, lambda: build(other))
    assert recompiled == 0
    with eager_initialisation():
        assert all(map(np.array_equal, _leaves(again), _leaves(build(other))))


def test_a_backbone_built_under_a_trace_is_traced_not_compiled():
    build = BUILDS["causal_transformer"]
    shapes = eqx.filter_eval_shape(build, jax.random.key(0))
    assert [leaf.shape for leaf in _leaves(shapes)] == [
        leaf.shape for leaf in _leaves(build(jax.random.key(0)))
    ]
    arrays = eqx.filter_jit(lambda key: eqx.filter(build(key), eqx.is_array))(jax.random.key(3))
    assert [leaf.shape for leaf in _leaves(arrays)] == [leaf.shape for leaf in _leaves(shapes)]


def test_initialise_keeps_the_constructors_non_array_fields():
    class Scaled(eqx.Module):
        weight: jax.Array
        name: str = eqx.field(static=True)
        activation: object

        def __init__(self, size, name, *, key):
            self.weight = jax.random.normal(key, (size,))
            self.name = name
            self.activation = jax.nn.relu

    built = initialise(Scaled, 3, "first", key=jax.random.key(5))
    assert built.name == "first" and built.activation is jax.nn.relu
    np.testing.assert_array_equal(built.weight, jax.random.normal(jax.random.key(5), (3,)))
    other = initialise(Scaled, 3, "second", key=jax.random.key(5))  # another program
    assert other.name == "second"
