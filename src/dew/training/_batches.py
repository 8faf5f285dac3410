"""Drawing the training batches: one per step, stacked for a fused block, skipped on resume."""

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _draw(batches: Iterator[Any], step: int, steps: int) -> Any:
    """The batch of `step`."""
    try:
        return next(batches)
    except StopIteration:
        raise ValueError(
            f"Dataset.train ran out of batches at step {step} of {steps}; "
            "make it yield at least one batch per step (e.g. itertools.cycle)."
        ) from None


def _stack(batches: list[Any]) -> Any:
    """Batches stacked on a new leading axis (device arrays stay on the device)."""
    return jax.tree.map(
        lambda *leaves: jnp.stack(leaves) if isinstance(leaves[0], jax.Array) else np.stack(leaves),
        *batches,
    )


def _skip(batches: Iterator[Any], count: int) -> Iterator[Any]:
    """Draw and discard the `count` batches a resumed run's checkpoint had consumed."""
    for index in range(count):
        try:
            next(batches)
        except StopIteration:
            raise ValueError(
                f"resuming needs the {count} training batches the checkpointed run consumed "
                f"replayed first, but Dataset.train ended after {index}."
            ) from None
    return batches
