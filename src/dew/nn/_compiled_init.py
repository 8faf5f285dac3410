"""Initialising parameters in few XLA programs, with the bits of the eager calls
(decision 0048).

`initialise(constructor, *args, key=key, **kwargs)` is `constructor(*args, key=key,
**kwargs)` computed by one jitted program, compiled once per constructor and arguments and
reused by every later call with another key: a transformer's blocks, all of one shape, cost
one compilation whatever the depth. The constructor is traced to a jaxpr, and the program
evaluates it with every floating-point input of each operation behind an optimisation
barrier: each operation is one eager mode would have compiled as its own program, and XLA
(default options) compiles it as it would there, never folding or reassociating across
operations (`0.02 * normal(...)` would otherwise become one multiplication by a folded
`0.02 * sqrt(2)`, and some entries would change in the last bit). Under a trace (a model
built inside `jax.jit` or `eqx.filter_eval_shape`), and inside `eager_initialisation()`
(the reference the tests compare with: each operation its own program, as before), the
constructor is called as it is."""

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.extend

__all__ = ["INITIALISER_OPTIONS", "eager_initialisation", "initialise"]

INITIALISER_OPTIONS: dict[str, Any] = {}
"""The XLA options an initialiser program is compiled with: XLA's defaults (optimisation
level 1, which compiles faster, changes bits: decision 0048)."""


_EAGER = contextvars.ContextVar("dew_eager_initialisation", default=False)


@contextlib.contextmanager
def eager_initialisation() -> Iterator[None]:
    """Within this context `initialise` calls its constructor as it is, eagerly."""
    token = _EAGER.set(True)
    try:
        yield
    finally:
        _EAGER.reset(token)


def _separated(jaxpr: Any, consts: list[Any], *args: Any) -> list[Any]:
    """`jaxpr` evaluated with every floating-point input of each of its operations passed
    through an optimisation barrier: XLA compiles each operation as the eager call's own
    program does, and cannot fold or reassociate across them (`0.02 * normal(...)` stays
    a multiplication of the normal draw, never one by a folded `0.02 * sqrt(2)`)."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(var: Any) -> Any:
        inexact = jax.numpy.issubdtype(var.aval.dtype, jax.numpy.inexact)
        value = var.val if isinstance(var, jax.extend.core.Literal) else env[var]
        if inexact:
            return jax.lax.optimization_barrier(value)
        return value

    for eqn in jaxpr.eqns:
        params = eqn.primitive.get_bind_params(eqn.params)
        outputs = eqn.primitive.bind(*map(read, eqn.invars), **params)
        if not eqn.primitive.multiple_results:
            outputs = [outputs]
        env.update(zip(eqn.outvars, outputs, strict=True))
    literal = jax.extend.core.Literal
    return [var.val if isinstance(var, literal) else env[var] for var in jaxpr.outvars]


class _Program:
    """One constructor and its arguments as a jitted function of the key, with the
    non-array part of what it builds kept from its trace."""

    def __init__(self, constructor: Callable[..., Any], args: tuple, kwargs: tuple) -> None:
        self.constructor = constructor
        self.args = args
        self.kwargs = dict(kwargs)
        self.static: Any = None
        self.tree: Any = None
        self.jitted = jax.jit(self._arrays, compiler_options=INITIALISER_OPTIONS)

    def _leaves(self, key: Any) -> list[Any]:
        built = self.constructor(*self.args, key=key, **self.kwargs)
        arrays, self.static = eqx.partition(built, eqx.is_array)
        leaves, self.tree = jax.tree.flatten(arrays)
        return leaves

    def _arrays(self, key: Any) -> Any:
        closed = jax.make_jaxpr(self._leaves)(key)
        return _separated(closed.jaxpr, closed.consts, key)

    def __call__(self, key: Any) -> Any:
        leaves = self.jitted(key)
        return eqx.combine(jax.tree.unflatten(self.tree, leaves), self.static)


@functools.lru_cache(maxsize=64)
def _program(constructor: Callable[..., Any], args: tuple, kwargs: tuple) -> _Program:
    return _Program(constructor, args, kwargs)


def initialise(constructor: Callable[..., Any], *args: Any, key: Any, **kwargs: Any) -> Any:
    """`constructor(*args, key=key, **kwargs)`, its arrays computed by one compiled
    program per `constructor` and arguments (which must be hashable)."""
    if _EAGER.get() or isinstance(key, jax.core.Tracer):
        return constructor(*args, key=key, **kwargs)
    return _program(constructor, args, tuple(sorted(kwargs.items())))(key)
