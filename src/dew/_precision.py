"""Precision policies: the dtype a compiled step computes in, its params kept in float32.

`Trainer(..., precision=...)`, `dew.steps.train_step(..., precision=...)` and
`dew.evaluate(..., precision=...)` take one of `PRECISIONS` (decision 0078):

- `"float32"`: everything in float32, the step as it was before policies.
- `"mixed_bfloat16"` (Keras's `mixed_bfloat16`; jmp's `params=float32,compute=bfloat16,
  output=float32`): the params and the optimizer state stay float32; inside the compiled
  step every floating param and every floating array of the batch is cast to bfloat16, so
  the matrix products run in bfloat16, and gradients come back through the casts as
  float32 for the float32 update. The numerically delicate parts stay float32: the
  built-in backbones' layer norms, attention logits and softmax and their outputs, and
  the objectives' losses (their log-softmax and their means), as PyTorch's autocast keeps
  them.
- `"bfloat16"` (jmp's `params=float32,compute=bfloat16,output=bfloat16`): the same casts,
  and the built-in layer norms and attention softmax run in bfloat16 too: no conversion
  inside a block, the least memory traffic and the least precision.

Under every policy the loss and the aux metrics a step returns are float32 before anything
sums them (the training window, an accumulated step's micro-batches), and an evaluation's
artifacts are float32 before the metrics reduce them (with their compensated sums).

The policy reaches the built-in layers through a context variable set while the step is
traced (`computing_in`), read by `compute_dtype` and `keeps_float32`; the compiled calls
are cached per policy, so no trace is reused under another.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from dew._precisions import PRECISIONS, check_precision

__all__ = [
    "PRECISIONS",
    "check_precision",
    "compute_dtype",
    "computing_in",
    "in_compute",
    "in_float32",
    "keeps_float32",
    "with_precision",
]

_COMPUTE = {"float32": jnp.dtype(jnp.float32), "bfloat16": jnp.dtype(jnp.bfloat16)}
_ACTIVE: contextvars.ContextVar[str] = contextvars.ContextVar("dew_precision", default="float32")


def _policy_dtype(precision: str) -> Any:
    return _COMPUTE["float32" if precision == "float32" else "bfloat16"]


def compute_dtype(declared: str = "float32") -> Any:
    """The dtype a built-in backbone computes in: its own `dtype` (`declared`), or bfloat16
    when the policy being traced computes in bfloat16 (the narrower of the two)."""
    if _ACTIVE.get() == "float32":
        return _COMPUTE[declared]
    return _COMPUTE["bfloat16"]


def keeps_float32() -> bool:
    """Whether the built-in layer norms and attention softmax compute in float32 (at least)
    under the policy being traced: every policy but `"bfloat16"`."""
    return _ACTIVE.get() != "bfloat16"


@contextlib.contextmanager
def computing_in(precision: str) -> Iterator[None]:
    """Trace the body under `precision` (what `compute_dtype` and `keeps_float32` read);
    under a bfloat16 policy with standard dtype promotion too, for the body's backward pass
    as much as its forward one: JAX's own attention and the objective's float32 values mix
    with the cast bfloat16 ones (a caller's strict promotion would refuse them, decision
    0011)."""
    token = _ACTIVE.set(check_precision(precision))
    try:
        if precision == "float32":
            yield
        else:
            with jax.numpy_dtype_promotion("standard"):
                yield
    finally:
        _ACTIVE.reset(token)


def in_compute(tree: Any, precision: str) -> Any:
    """`tree` with every floating array (float32 or wider, or narrower) cast to the policy's
    compute dtype; integer arrays, keys and other leaves unchanged."""
    if precision == "float32":
        return tree
    dtype = _policy_dtype(precision)

    def cast(leaf: Any) -> Any:
        if eqx.is_inexact_array(leaf) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.astype(dtype)
        return leaf

    return jax.tree.map(cast, tree)


def in_float32(tree: Any) -> Any:
    """`tree` with every floating array narrower than float32 cast to float32 (wider ones,
    float64 under x64, kept): what a sum of its values is reduced in."""

    def cast(leaf: Any) -> Any:
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
            return jnp.asarray(leaf, jnp.float32)
        return leaf

    return jax.tree.map(cast, tree)


def with_precision(function: Callable[..., Any], precision: str) -> Callable[..., Any]:
    """`function(params, batch, *rest)` (an objective's `loss` or `evaluate`) computed under
    `precision`: its params and batch cast to the compute dtype, traced in `computing_in`
    (the objective's own float32 values, a noise draw, meet the cast ones and stay
    float32), its result's floating arrays float32. `"float32"` returns `function` itself.
    A gradient of it is taken in `computing_in` too (`dew.steps.train_step`)."""
    if check_precision(precision) == "float32":
        return function

    def computed(params: Any, batch: Any, *rest: Any) -> Any:
        with computing_in(precision):
            result = function(in_compute(params, precision), in_compute(batch, precision), *rest)
        return in_float32(result)

    return computed
