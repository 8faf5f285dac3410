"""The integer check of user input, `check_integer`: Python ints and NumPy and JAX integer
scalars alike.

It imports neither NumPy nor JAX, so the names, the configuration and the `dew` command's
reading commands that check integers start without them: an array of either library exists
only once that library is imported, so the check finds the array types in `sys.modules`
(as array-api-compat's `is_numpy_array` and `is_jax_array` do).
"""

import numbers
import sys
from typing import Any

__all__ = ["NotAnIntegerError", "check_integer"]


class NotAnIntegerError(TypeError, ValueError):
    """A value that should be an integer is not one: a `TypeError` by kind and a
    `ValueError` as bad input, so either `except` clause catches it."""


def check_integer(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    optional: bool = False,
) -> Any:
    """Check that `value` is an integer in `[minimum, maximum]` and return it as a Python `int`.

    Python ints and NumPy/JAX integer scalars are integers alike; `bool`, floats
    (even `3.0`), strings and arrays with axes are not. With `optional=True`,
    `None` passes (and is returned).

    **Raises:** one message form, `"<name> must be <allowed>, got <value>."`: a
    `NotAnIntegerError` (both a `TypeError` and a `ValueError`) for a value of the wrong
    type, a `ValueError` for an integer out of range.

    ```python
    >>> import numpy as np
    >>> check_integer("steps", np.int64(3), minimum=1)
    3
    >>> check_integer("steps", True, minimum=1)
    Traceback (most recent call last):
    ...
    dew._integers.NotAnIntegerError: steps must be an integer >= 1, got True.

    ```
    """
    if optional and value is None:
        return None
    message = f"{name} must be {_allowed(minimum, maximum, optional)}, got {value!r}."
    if not _integral(value):
        raise NotAnIntegerError(message)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(message)
    return int(value)


def _integral(value: Any) -> bool:
    """Whether `value` is an integer: an `int` or NumPy integer but no bool, or a NumPy or
    concrete JAX array with no axes and an integer dtype."""
    np, jax = sys.modules.get("numpy"), sys.modules.get("jax")
    if isinstance(value, bool) or (np is not None and isinstance(value, np.bool_)):
        return False
    if isinstance(value, numbers.Integral):
        return True
    if np is None:  # no NumPy array exists, nor a JAX one (JAX imports NumPy)
        return False
    if jax is None:
        return isinstance(value, np.ndarray) and _integer_scalar(value, np)
    return (
        isinstance(value, np.ndarray | jax.Array)
        and not isinstance(value, jax.core.Tracer)
        and _integer_scalar(value, jax.numpy)
    )


def _integer_scalar(array: Any, numpy: Any) -> bool:
    return array.shape == () and bool(numpy.issubdtype(array.dtype, numpy.integer))


def _allowed(minimum: int | None, maximum: int | None, optional: bool) -> str:
    if minimum is not None and maximum is not None:
        allowed = f"an integer between {minimum} and {maximum}"
    elif minimum is not None:
        allowed = f"an integer >= {minimum}"
    elif maximum is not None:
        allowed = f"an integer <= {maximum}"
    else:
        allowed = "an integer"
    return f"None or {allowed}" if optional else allowed
