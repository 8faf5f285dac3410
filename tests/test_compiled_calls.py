"""dew._compiled_calls: the one cache of calls compiled per objective structure."""

import gc

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

from dew._compiled_calls import ByIdentity, CompiledCalls, partitioned


class Scaled(eqx.Module):
    weight: jax.Array
    power: int = eqx.field(static=True)

    def __call__(self, x):
        return self.weight * x**self.power


class Listed(eqx.Module):
    weight: jax.Array
    powers: list = eqx.field(static=True)  # a static field that does not hash


def _counting():
    built = []

    def build(treedef, static, *rest):
        built.append((treedef, static, rest))

        def call(leaves, x):
            return eqx.combine(jax.tree.unflatten(treedef, leaves), static)(x)

        return jax.jit(call)

    return build, built


def test_partitioned_splits_an_objective_into_leaves_treedef_and_static():
    model = Scaled(jnp.array([1.0, 2.0]), 3)
    leaves, treedef, static = partitioned(model)
    assert [leaf.tolist() for leaf in leaves] == [[1.0, 2.0]] and static.power == 3
    assert static.weight is None  # the arrays travel as leaves, not in the key
    rebuilt = eqx.combine(jax.tree.unflatten(treedef, leaves), static)
    assert eqx.tree_equal(rebuilt, model)


def test_one_structure_is_built_once_and_a_new_static_is_built_anew():
    build, built = _counting()
    calls = CompiledCalls(build)
    first, twin = Scaled(jnp.ones(2), 2), Scaled(jnp.full(2, 5.0), 2)  # one structure
    _, treedef, static = partitioned(first)
    call = calls(treedef, static, "sgd")
    twin_leaves, twin_def, twin_static = partitioned(twin)
    assert twin_static is not static
    assert calls(twin_def, twin_static, "sgd") is call  # a hit: equal treedef and static
    assert len(built) == 1 and calls.cache_info().hits == 1
    # the twin's own arrays go through the shared call: 5 * 3**2
    assert call(twin_leaves, jnp.float32(3.0)).tolist() == [45.0, 45.0]
    cubed_leaves, cubed_def, cubed = partitioned(Scaled(jnp.ones(2), 3))
    cubed_call = calls(cubed_def, cubed, "sgd")  # a miss: another static field
    assert cubed_call is not call and len(built) == 2
    assert cubed_call(cubed_leaves, jnp.float32(2.0)).tolist() == [8.0, 8.0]
    assert calls(treedef, static, "adam") is not call and len(built) == 3  # another extra part


def test_an_unhashable_static_is_built_for_its_caller_alone():
    build, built = _counting()
    calls = CompiledCalls(build)
    _, treedef, static = partitioned(Listed(jnp.ones(2), [1, 2]))
    with pytest.raises(TypeError):
        hash(static)
    first, second = calls(treedef, static), calls(treedef, static)
    assert first is not second and len(built) == 2
    assert calls.cache_info().currsize == 0  # nothing kept


def test_a_type_error_raised_while_building_is_not_taken_for_an_unhashable_key():
    def build(treedef, static):
        raise TypeError("a bug in the build")

    calls = CompiledCalls(build)
    _, treedef, static = partitioned(Scaled(jnp.ones(2), 2))
    with pytest.raises(TypeError, match="a bug in the build"):
        calls(treedef, static)


def test_by_identity_remembers_a_value_while_its_objects_live():
    class Thing:
        pass

    made = ByIdentity()
    first, second = Thing(), Thing()
    value = made.get((first, second), list)
    assert made.get((first, second), list) is value
    assert made.get((second, first), list) is not value  # other identities, another value
    assert made.get((Thing(), second), list) is not value
    kept = (id(first), id(second))
    assert kept in made._entries
    del first
    gc.collect()
    assert kept not in made._entries  # forgotten with its object
    numbers = (1, 2)  # ints are not weakly referenceable: a fresh value each time
    assert made.get(numbers, list) is not made.get(numbers, list)
