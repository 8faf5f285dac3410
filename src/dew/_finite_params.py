"""The non-finite guard's look at the parameters (`check_params`): one compiled reduction
over every floating-point leaf, at a runner's save and return points (`dew._nonfinite`
holds the rest of the guard: the switch, its advice and the loss's check)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from dew._nonfinite import stopped

__all__ = ["check_params"]


@jax.jit
def _all_finite(leaves: list[jax.Array]) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))


def check_params(params: Any, step: int, *, loss: float | None = None) -> None:
    """Raise a `ValueError` naming `step` when a floating-point leaf of `params` is not
    finite (one compiled reduction and one fetch: for save and return points only)."""
    leaves = jax.tree.leaves(eqx.filter(params, eqx.is_inexact_array))
    if leaves and not bool(_all_finite(leaves)):
        seen = "" if loss is None else f" (the step's loss, taken before its update, was {loss})"
        raise stopped(f"training params are not finite at step {step}{seen}")
