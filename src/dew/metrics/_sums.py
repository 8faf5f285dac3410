"""Compensated float32 sums that stay accurate over long passes on the device.

A plain float32 running sum stops counting past 2**24 and drifts on long passes.
`Sum` keeps a sum as an unevaluated pair `hi + lo` of float32 values and adds with
Knuth's error-free TwoSum, so a pass of 10**8 weighted tokens keeps about 48 bits
of relative precision, under jit and inside `lax.scan`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Shaped

__all__ = ["Sum", "two_sum"]


def two_sum(
    a: Float[Array, "*shape"], b: Float[Array, "*shape"]
) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"]]:
    """Knuth's TwoSum: `s + e == a + b` exactly, with `s = fl(a + b)`.

    Where `s` is not finite (an infinite PSNR, a NaN loss) the error term is 0,
    so infinities and NaNs pass through a sum as they would through `a + b`.
    """
    s = a + b
    b_virtual = s - a
    a_virtual = s - b_virtual
    error = (a - a_virtual) + (b - b_virtual)
    return s, jnp.where(jnp.isfinite(s), error, jnp.zeros_like(error))


class Sum(eqx.Module):
    """A compensated sum `hi + lo` of float32 values.

    ```python
    >>> import jax.numpy as jnp
    >>> total = Sum.zero()
    >>> for _ in range(3):
    ...     total = total.add(Sum.of(jnp.full((4,), 0.1, jnp.float32)))
    >>> round(float(total.value()), 6)
    1.2

    ```
    """

    hi: Float[Array, ""]
    lo: Float[Array, ""]

    @staticmethod
    def zero() -> Sum:
        """The empty sum."""
        return Sum(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))

    @staticmethod
    def of(values: Shaped[Array, ...]) -> Sum:
        """The compensated sum of all elements of `values` (cast to float32).

        Elements are summed in blocks of 256 with XLA's reduction and the block
        totals are combined with TwoSum, which bounds the error of a large batch to
        that of one 256-element float32 sum.
        """
        flat = jnp.ravel(jnp.asarray(values, jnp.float32))
        size = flat.shape[0]
        block = 256
        if size <= block:
            return Sum(jnp.sum(flat), jnp.zeros((), jnp.float32))
        partial = jnp.sum(jnp.pad(flat, (0, (-size) % block)).reshape(-1, block), axis=1)

        def combine(left, right):
            (left_hi, left_lo), (right_hi, right_lo) = left, right
            total, error = two_sum(left_hi, right_hi)
            return total, error + left_lo + right_lo

        # One variadic reduction combines the block totals with TwoSum, so its error
        # stays at O(eps) whatever order XLA reduces in.
        zero = np.float32(0.0)
        hi, lo = jax.lax.reduce((partial, jnp.zeros_like(partial)), (zero, zero), combine, (0,))
        hi, lo = two_sum(hi, lo)
        return Sum(hi, lo)

    def add(self, other: Sum) -> Sum:
        """The sum of two compensated sums (associative up to rounding of `lo`)."""
        hi, error = two_sum(self.hi, other.hi)
        lo = error + self.lo + other.lo
        hi, lo = two_sum(hi, lo)
        return Sum(hi, lo)

    def value(self) -> Float[Array, ""]:
        """The sum rounded to float32."""
        return self.hi + self.lo
