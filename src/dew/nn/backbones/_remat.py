"""Rematerialisation of a backbone's blocks (`remat=`): each block's activations recomputed in
the backward pass instead of kept from the forward one, under `jax.checkpoint`."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp

__all__ = ["REMAT_POLICIES", "apply_blocks", "remat_policy"]

REMAT_POLICIES = (
    "nothing_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "everything_saveable",
)
"""The `jax.checkpoint_policies` a backbone's `remat` may name: what each block keeps from its
forward pass for the backward one. `"nothing_saveable"` (what `remat=True` means) keeps only
the block's input and recomputes the rest; `"dots_saveable"` keeps the matrix products'
outputs and recomputes the cheap elementwise work between them;
`"dots_with_no_batch_dims_saveable"` keeps the products without batch dimensions (the
projections and the MLP, not attention's logits); `"everything_saveable"` keeps everything
(as without `remat`, with the block still one checkpointed call)."""

_X = TypeVar("_X")


def remat_policy(kind: str, remat: bool | str | None) -> str | None:
    """The policy name `remat` asks for: `None` (no rematerialisation) for `False` and
    `None`, `"nothing_saveable"` for `True`, a name of `REMAT_POLICIES` as given. Anything
    else raises a `ValueError` naming `kind`."""
    if remat is None or remat is False:
        return None
    if remat is True:
        return "nothing_saveable"
    if isinstance(remat, str) and remat in REMAT_POLICIES:
        return remat
    allowed = ", ".join(repr(name) for name in REMAT_POLICIES)
    raise ValueError(f"{kind}.remat {remat!r} is not one of True, False, {allowed}.")


def apply_blocks(
    blocks: Sequence[Any], x: _X, policy: str | None, call: Callable[[Any, _X], _X]
) -> _X:
    """`x` through each block in turn, `call(block, x)` giving the next `x`.

    With a `policy`, each call is under `jax.checkpoint` with that policy, and the blocks run
    as one `jax.lax.scan` over their parameters stacked along a new leading axis (blocks of
    one structure, as a backbone's are): XLA keeps a scan's checkpointed body to one block's
    activations at a time, where it schedules the recomputations of an unrolled loop of
    checkpointed calls together (on CPU that held more memory than no checkpoint at all;
    decision 0057). The stacking is a copy of the blocks' parameters each call."""
    if policy is None:
        for block in blocks:
            x = call(block, x)
        return x
    checkpointed = jax.checkpoint(
        lambda arrays, static, x: call(eqx.combine(arrays, static), x),
        policy=getattr(jax.checkpoint_policies, policy),
        static_argnums=(1,),
    )
    parts = [eqx.partition(block, eqx.is_array) for block in blocks]
    static = parts[0][1]
    if len(blocks) < 2 or any(
        jax.tree.structure(arrays) != jax.tree.structure(parts[0][0]) or other != static
        for arrays, other in parts
    ):
        for arrays, other in parts:
            x = checkpointed(arrays, other, x)
        return x
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(arrays for arrays, _ in parts))
    x, _ = jax.lax.scan(lambda x, arrays: (checkpointed(arrays, static, x), None), x, stacked)
    return x
