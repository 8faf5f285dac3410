"""Checks of user input shared by the whole package: host-or-traced conditions on arrays,
and the translation of a compiled call's failure into the host-side `ValueError` of the
batch that caused it (the integer check, which needs no JAX, is `dew._integers`)."""

import contextlib
import contextvars
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np

__all__ = [
    "HOST_CHECKING",
    "MissingBatchKeyError",
    "batch_error",
    "check_ids",
    "check_unit_interval",
    "error_if",
    "explain_failure",
    "explanation",
    "failed_check",
    "held_on_host",
    "ids_checked_on_host",
    "settle_failed_calls",
]


def _not_a_failed_check(record: logging.LogRecord) -> bool:
    """False for JAX's log of a failed `eqx.error_if` check: the same error is raised
    to the caller of the compiled call (which `explain_failure` translates), so the
    log would only print its Equinox traceback a second time."""
    error = record.exc_info[1] if record.exc_info else None
    return type(error).__name__ != "_EquinoxRuntimeError"


logging.getLogger("jax._src.callback").addFilter(_not_a_failed_check)


class MissingBatchKeyError(KeyError, ValueError):
    """A batch lacks a key its objective reads: a `KeyError` by kind and a `ValueError` as
    bad input (either `except` clause catches it, and `batch_error` explains a failed call
    with it), whose message reads as written."""

    __module__ = "dew.objectives.base"  # where users import it from

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def error_if(
    value: Any,
    bad: Any,
    message: str,
    *,
    first: Callable[[tuple[int, ...]], str] | None = None,
) -> Any:
    """Return `value`, or raise `ValueError` where any entry of `bad` holds.

    On concrete arrays this is a host check: the `ValueError` reads `message`, or
    `first(index)` for the index of the first bad entry when given. Where either
    is traced it becomes `eqx.error_if(value, any(bad), message)`, which raises
    when the compiled call runs; `explain_failure` turns that failure back into
    the host check's `ValueError`.
    """
    if isinstance(bad, jax.core.Tracer) or isinstance(value, jax.core.Tracer):
        return eqx.error_if(value, jnp.any(bad), message)
    host = np.asarray(bad)
    if host.any():
        if first is None:
            raise ValueError(message)
        raise ValueError(first(tuple(int(i) for i in np.argwhere(host)[0])))
    return value


def held_on_host(batch: Any) -> bool:
    """Whether no array of `batch` is a JAX array: the batch is NumPy data on the host, which
    the objective's own `check_batch` checks there for (nearly) free, so the compiled call
    that takes it is traced under `ids_checked_on_host` (no host callback in it)."""
    return all(not isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(batch))


_host_checked = contextvars.ContextVar("dew_host_checked_ids", default=False)
# True while `dew.objectives.base.check_on_host` runs an objective's `check_batch`: a
# method looked up on the objective is then a plain bound method (decision 0051).
HOST_CHECKING = contextvars.ContextVar("dew_checking_on_host", default=False)


@contextlib.contextmanager
def ids_checked_on_host(checked: bool = True) -> Iterator[None]:
    """While tracing under this context, `check_ids` builds no traced check: the caller
    has run the objective's `check_batch` on the host for every batch the compiled
    call will see (a traced check is a host callback, about 0.2 ms a call on a CPU)."""
    token = _host_checked.set(checked)
    try:
        yield
    finally:
        _host_checked.reset(token)


def check_ids(
    values: Any,
    size: int,
    *,
    subject: str,
    noun: str,
    size_name: str,
    axes: Sequence[str],
) -> Any:
    """Check that every entry of integer `values` lies in `[0, size)`; return `values`.

    The host message names the first bad value and its position along `axes`:
    `"<subject> holds token ID 70 at row 3, position 5; valid IDs are 0 to 63
    (vocab_size=64)."` for `noun="token ID"`, `size_name="vocab_size"`; the traced
    one (see `error_if`) says the same without the value.
    """
    allowed = f"valid {noun.split()[-1]}s are 0 to {size - 1} ({size_name}={size})"

    def first(index: tuple[int, ...]) -> str:
        where = ", ".join(f"{axis} {i}" for axis, i in zip(axes, index, strict=True))
        return f"{subject} holds {noun} {int(np.asarray(values)[index])} at {where}; {allowed}."

    if isinstance(values, jax.core.Tracer):
        if _host_checked.get():
            return values
        bad = jnp.logical_or(values < 0, values >= size)
    else:
        host = np.asarray(values)
        bad = (host < 0) | (host >= size)
    message = f"{subject} holds {noun}s outside [0, {size}); {allowed}."
    return error_if(values, bad, message, first=first)


def check_unit_interval(values: Any, *, subject: str, axes: Sequence[str]) -> Any:
    """Check that every entry of float `values` lies in `[0, 1]` (NaN does not); return
    `values`. Like `check_ids`, the host message names the first bad value and its
    position along `axes`, a traced check (see `error_if`) says the same without them,
    and under `ids_checked_on_host` no traced check is built."""

    def first(index: tuple[int, ...]) -> str:
        where = ", ".join(f"{axis} {i}" for axis, i in zip(axes, index, strict=True))
        value = float(np.asarray(values)[index])
        return f"{subject} holds value {value!r} at {where}; values must lie in [0, 1]."

    if isinstance(values, jax.core.Tracer):
        if _host_checked.get():
            return values
        bad = jnp.logical_not(jnp.logical_and(values >= 0, values <= 1))
    else:
        host = np.asarray(values)
        bad = ~((host >= 0) & (host <= 1))
    message = f"{subject} holds values outside [0, 1] (or NaN); values must lie in [0, 1]."
    return error_if(values, bad, message, first=first)


def settle_failed_calls() -> None:
    """Wait for the compiled calls in flight and forget the failure of any that failed.

    JAX keeps the runtime token of the last call of a computation with host callbacks
    (an `eqx.error_if` check is one) on each device, and its exit handler waits for
    them all. A call whose check fired after it was dispatched leaves a failed token
    there: once dew has raised its own `ValueError` for it, that token would raise the
    check's failure again at every later `jax.effects_barrier()` and at interpreter
    exit, where under `jax.distributed` it also skips the distributed shutdown, so every
    process aborts. Called where dew handles a compiled call's failure. The tokens are
    JAX's own (`jax._src.dispatch.runtime_tokens`): should they move, nothing is done.
    """
    try:
        from jax._src.dispatch import runtime_tokens as tokens
    except ImportError:
        return
    for held in (
        getattr(tokens, "output_runtime_tokens", None),
        getattr(tokens, "current_tokens", None),
    ):
        if not isinstance(held, dict):
            continue
        for key, token in list(held.items()):
            try:
                token.block_until_ready()
            except Exception:  # the failure dew has already raised as its own error
                held.pop(key, None)


def batch_error(objective: Any, batches: Any) -> ValueError | None:
    """The host-side `ValueError` of the first of `batches` that fails
    `objective.check_batch`, or `None` when every one passes.

    `batches` is one batch (a mapping) or an iterable of them; it is only read here,
    so a list that grew since it was handed over is read as it is now.
    """
    if isinstance(batches, Mapping):
        batches = [batches]
    for batch in batches:
        try:
            objective.check_batch(_as_called(batch))
        except ValueError as error:  # a missing key too (`MissingBatchKeyError`)
            return error
        except Exception:
            continue
    return None


def _as_called(batch: Any) -> Any:
    """A batch as the compiled call saw it: NumPy arrays become (concrete) JAX arrays, so
    the checks take their host branch on the same types `loss` and `evaluate` read."""
    return jax.tree.map(
        lambda leaf: jnp.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf, batch
    )


@contextlib.contextmanager
def explain_failure(objective: Any, batches: Iterable[Any] | Mapping[str, Any]) -> Iterator[None]:
    """Around a compiled call (or the point where its outputs are synchronised):
    when it raises, re-run `objective.check_batch` on `batches` on the host and
    raise the first check's `ValueError` instead, `from None`, so no JAX or
    Equinox runtime text reaches the user. When every batch passes, the original
    error propagates unchanged. Nothing runs unless the body raises.

    ```python
    >>> import jax, numpy as np
    >>> from dew.nn.backbones.causal_transformer import CausalTransformer
    >>> from dew.objectives.lm import LMObjective
    >>> model = CausalTransformer(4, 16, 1, 2, 32, 16, key=jax.random.key(0))
    >>> objective = LMObjective(model, seq_len=8)
    >>> batch = {"text": np.full((2, 9), 7, np.int32)}
    >>> loss = jax.jit(objective.loss)
    >>> with explain_failure(objective, batch):
    ...     loss(objective.init_params(), batch, jax.random.key(0))
    Traceback (most recent call last):
    ...
    ValueError: LMObjective: batch['text'] holds token ID 7 at row 0, position 0; valid IDs ...

    ```
    """
    try:
        yield
    except Exception as error:
        explained = explanation(objective, batches, error)
        if explained is None:
            raise
        raise explained from None


def explanation(objective: Any, batches: Any, error: BaseException) -> ValueError | None:
    """The `ValueError` to raise for a compiled call's failure `error`: the first of
    `batches` that `objective`'s host checks refuse (`batch_error`), else the traced
    check's own message (`failed_check`); `None` when neither explains it (a real error,
    to raise unchanged). The failed call is settled first (`settle_failed_calls`)."""
    settle_failed_calls()
    return batch_error(objective, batches) or failed_check(error)


_CHECK_MESSAGE = re.compile(
    r"(?:_EquinoxRuntimeError|equinox\.EquinoxRuntimeError): (.+?)\n\n+-{10,}", re.DOTALL
)


def failed_check(error: BaseException | None) -> ValueError | None:
    """The `ValueError` of a traced `error_if` check that `error` (a compiled call's
    failure, raised at the call or wherever its outputs were fetched) carries, or
    `None` when it carries none. Its message is the check's own traced message: the
    fallback when the batch that failed is no longer at hand to re-check on the host.

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> check = jax.jit(lambda x: eqx.error_if(x, x > 0, "x must be <= 0."))
    >>> try:
    ...     jax.device_get(check(jnp.ones(())))
    ... except Exception as error:
    ...     print(failed_check(error))
    x must be <= 0.

    ```
    """
    while error is not None:
        found = _CHECK_MESSAGE.search(str(error))
        if found:
            return ValueError(found.group(1).strip())
        error = error.__cause__ or error.__context__
    return None
