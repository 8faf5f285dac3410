"""Gradient accumulation: one optimizer step's gradients summed over micro-batches.

`dew.steps.train_step(..., accumulate=k)` (and so `Trainer.fit(..., accumulate=k)`) splits
its batch into `k` micro-batches and runs the objective's loss and its gradient on one at a
time, in a `jax.lax.scan`, so only one micro-batch's activations are alive at once. What the
step returns is what the whole batch would give: each micro-batch's loss, aux metrics and
gradients are weighted by the micro-batch's weight (the objective's `loss_weight(batch)`: the
denominator of its loss, the count of the LM's targets or the sum of a classifier's sample
weights; else the micro-batch's rows), summed, and divided by the total weight once. For a
loss that is a weighted mean (every built-in one), that is the big batch's loss and
gradient, up to float rounding; a mean of the micro-batches' means would not be when the
micro-batches hold different numbers of targets.

Micro-batch `i` holds the rows `i, i + k, i + 2k, ...` of the batch (a strided split): a
batch whose rows are laid out over several devices in contiguous blocks then gives every
device a share of every micro-batch. Its key is `jax.random.split(key, k)[i]` of the step's
key (an objective's counters, `dew._domains`).
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dew._integers import check_integer

__all__ = ["accumulated_gradients", "check_accumulate", "micro_batches", "wide_dtype"]


def check_accumulate(accumulate: object, name: str = "accumulate") -> int:
    """Check an `accumulate` argument: an integer >= 1, the micro-batches of one optimizer
    step (`dew._integers.check_integer`: a bool or a float is refused)."""
    return check_integer(name, accumulate, minimum=1)


def micro_batches(batch: Any, accumulate: int) -> Any:
    """`batch`'s leaves with a leading axis of `accumulate` micro-batches: leaf `x` of `rows`
    rows becomes `x[i::accumulate]` at index `i` (a strided split).

    **Raises:** `ValueError` naming the batch's rows when `accumulate` does not divide them
    (at trace time, before anything runs), or when a leaf has no row axis or another
    number of rows than the first."""
    leaves = jax.tree.leaves(batch)
    rows = {int(jnp.shape(leaf)[0]) for leaf in leaves if jnp.ndim(leaf)}
    if not leaves or len(rows) != 1 or any(jnp.ndim(leaf) == 0 for leaf in leaves):
        shapes = sorted({tuple(jnp.shape(leaf)) for leaf in leaves})
        raise ValueError(
            f"accumulate={accumulate} splits a batch's rows into micro-batches, so every leaf "
            f"of the batch needs one leading row axis of one length, got shapes {shapes}."
        )
    (count,) = rows
    if count % accumulate:
        raise ValueError(
            f"accumulate={accumulate} must divide the batch's rows, got a batch of {count} "
            f"rows: use a batch size that is a multiple of {accumulate}, or an accumulate "
            "that divides the batch size."
        )

    def split(leaf: Any) -> Any:
        leaf = jnp.asarray(leaf)
        shaped = leaf.reshape(count // accumulate, accumulate, *leaf.shape[1:])
        return jnp.moveaxis(shaped, 1, 0)

    return jax.tree.map(split, batch)


def wide_dtype(dtype: Any) -> Any:
    """The dtype a sum of `dtype` values is kept in: a float of 32 bits at least (a bfloat16
    model's gradients are summed in float32 and cast back once; float64 stays)."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize >= 4:
        return dtype
    return jnp.dtype(jnp.float32)


def accumulated_gradients(
    loss_of: Callable[..., tuple[Any, Any]],
    weight_of: Callable[[Any], Any] | None,
    params: Any,
    batch: Any,
    key: Any,
    accumulate: int,
) -> tuple[tuple[Any, dict[str, Any]], Any]:
    """`((loss, aux), grads)` of `loss_of(params, batch, key)` over `accumulate`
    micro-batches: each micro-batch's loss, aux values and gradients weighted by
    `weight_of(micro_batch)` (`None`: its rows), summed in float32 or wider, and divided by
    the total weight (a total of zero gives zeros). Traced inside a step."""
    stacked = micro_batches(batch, accumulate)
    keys = jax.random.split(key, accumulate)
    first = jax.tree.map(lambda leaf: leaf[0], stacked)
    rows = jax.tree.leaves(first)[0].shape[0]
    (loss_shape, aux_shape) = jax.eval_shape(loss_of, params, first, keys[0])

    def zeros(like: Any) -> Any:
        return jnp.zeros(jnp.shape(like), wide_dtype(like.dtype))

    def weighted(total: Any, value: Any, weight: Any) -> Any:
        # A micro-batch of weight zero adds nothing, even where its own mean is 0/0.
        term = jnp.asarray(value).astype(total.dtype) * weight.astype(total.dtype)
        return total + jnp.where(weight != 0, term, jnp.zeros_like(term))

    def body(carry: tuple[Any, ...], micro: tuple[Any, Any]) -> tuple[tuple[Any, ...], None]:
        total_weight, total_loss, total_aux, total_grads = carry
        micro_batch, micro_key = micro
        grad = jax.value_and_grad(loss_of, has_aux=True)
        (loss, aux), grads = grad(params, micro_batch, micro_key)
        weight = jnp.asarray(rows if weight_of is None else weight_of(micro_batch))
        weight = weight.astype(total_weight.dtype)
        carry = (
            total_weight + weight,
            weighted(total_loss, loss, weight),
            {name: weighted(total_aux[name], value, weight) for name, value in aux.items()},
            jax.tree.map(lambda total, g: weighted(total, g, weight), total_grads, grads),
        )
        return carry, None

    weight_dtype = wide_dtype(loss_shape.dtype)
    start = (
        jnp.zeros((), weight_dtype),
        zeros(loss_shape),
        {name: zeros(shape) for name, shape in aux_shape.items()},
        jax.tree.map(zeros, params),
    )
    (total, loss, aux, grads), _ = jax.lax.scan(body, start, (stacked, keys))
    counted = total > 0
    divisor = jnp.where(counted, total, jnp.ones_like(total))

    def mean(value: Any, like: Any) -> Any:
        quotient = value / divisor.astype(value.dtype)
        return jnp.where(counted, quotient, jnp.zeros_like(quotient)).astype(like.dtype)

    aux = {name: mean(value, aux_shape[name]) for name, value in aux.items()}
    grads = jax.tree.map(mean, grads, params)
    return (mean(loss, loss_shape), aux), grads
