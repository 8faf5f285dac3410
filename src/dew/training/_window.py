"""The training window: the training metrics of every step since the last log step, summed
on the device inside the compiled step and fetched only at the log step (decision 0025).

`Trainer.fit(..., train_reduction="mean")` (the default) reports each training metric as its
mean over the window; `"last"` reports the log step's own values, as dew did before. The
window is a monoid carried beside the state: compensated float32 sums (`two_sum`, as
`dew.metrics.Sum` keeps them, so a NaN or an infinity at any step of the window shows in its
mean), a step count, and the last step's values. It is the one training output of a compiled
step, donated like the state, so between two log steps the loop adds no synchronisation and no
copy, and each call carries one buffer for its metrics whatever their number; at the log step
one fetch takes it, and the window starts again empty.
"""

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from dew._reductions import TRAIN_REDUCTIONS
from dew.metrics._sums import two_sum

__all__ = [
    "TRAIN_REDUCTIONS",
    "TrainWindow",
    "WindowedCalls",
    "as_given",
    "beside",
    "check_train_reduction",
]

LAST_VALUED: frozenset[str] = frozenset({"learning_rate"})
"""Training metrics a window reports at its last step: a setting, not a measurement (the
rate of the log step's update reads against the schedule at that step)."""


def check_train_reduction(train_reduction: object) -> bool:
    """Check a `train_reduction` argument; `True` when the window's mean is reported."""
    if not isinstance(train_reduction, str) or train_reduction not in TRAIN_REDUCTIONS:
        allowed = " or ".join(repr(value) for value in TRAIN_REDUCTIONS)
        raise ValueError(f"train_reduction must be {allowed}, got {train_reduction!r}.")
    return train_reduction == "mean"


class TrainWindow(eqx.Module):
    """The training metrics `names` of the steps of a window: their sums, the step count and
    the last step's values, in one `(3, metrics + 1)` float32 array.

    Row 0 and row 1 (`hi + lo`) are each metric's compensated sum (Knuth's TwoSum, as in
    `dew.metrics.Sum`), the last column counting the steps (compensated too, so exact far past
    2**24); row 2 holds the last step's values. One buffer whatever the metrics: the least a
    compiled call can carry, and the one output a step returns besides the state."""

    sums: Float[Array, "3 slots"]
    names: tuple[str, ...] = eqx.field(static=True)

    @staticmethod
    def empty(names: tuple[str, ...]) -> "TrainWindow":
        """The identity: no step summed (one compiled call: a new window starts at every
        log step)."""
        return TrainWindow(_empty(len(names)), names)

    def add(self, outputs: Mapping[str, Any]) -> "TrainWindow":
        """The window with one more step's `outputs` (inside the compiled step)."""
        values = [jnp.asarray(outputs[name], jnp.float32).reshape(()) for name in self.names]
        step = jnp.stack([*values, jnp.ones((), jnp.float32)])
        hi, error = two_sum(self.sums[0], step)
        hi, lo = two_sum(hi, error + self.sums[1])
        return TrainWindow(jnp.stack([hi, lo, step]), self.names)

    def means(self) -> dict[str, float]:
        """Each metric's mean over the window, the last-valued ones (`learning_rate`) at the
        last step (a fetched window: on the host, in float64)."""
        return window_values(self.names, self.sums, mean=True)


def window_values(names: tuple[str, ...], sums: Any, *, mean: bool) -> dict[str, float]:
    """What a fetched window reports: with `mean`, each metric's mean over the window in
    float64 and the last-valued ones at the last step; else every metric at the last step."""
    sums = np.asarray(sums, np.float64)
    values = {name: float(value) for name, value in zip(names, sums[2, :-1], strict=True)}
    if mean:
        total = sums[0] + sums[1]
        with np.errstate(invalid="ignore"):  # inf - inf within a window is a NaN mean: data
            means = total[:-1] / total[-1]
        values.update(
            (name, float(value))
            for name, value in zip(names, means, strict=True)
            if name not in LAST_VALUED
        )
    return values


@functools.partial(jax.jit, static_argnums=0)
def _empty(metrics: int) -> Array:
    return jnp.zeros((3, metrics + 1), jnp.float32)


def window_names(outputs: Iterable[str]) -> tuple[str, ...]:
    """The training metrics a window holds, in its column order (sorted)."""
    return tuple(sorted(outputs))


def accumulated(window: Array, outputs: Mapping[str, Any]) -> Array:
    """A window's array with one more step's `outputs`. The compiled step carries the bare
    array: an array is flattened in the dispatch's C++ fast path, a Module would cost Python
    per call."""
    return TrainWindow(window, window_names(outputs)).add(outputs).sums


class WindowedCalls:
    """A fit's compiled calls and its window: `step` and `fused` run one call and keep the
    window, the calls' one training output; `values` fetches what a log step reports and
    starts a new window; `loss` is the last step's loss, for the checks before a save.

    **Arguments:**

    - `step_call`, `fused_call`: the compiled calls (`compiled_steps`).
    - `objective_leaves`, `state_def`: what every call takes besides the state and batch.
    - `mean`: report window means (`train_reduction="mean"`), else the last step's values.
    - `names_of`: `(leaves, batch) -> outputs' names`, traced once when the first window
      starts.
    - `place`: places a new window's array where the calls take it (replicated in a
      multi-process fit).
    """

    def __init__(
        self,
        step_call: Callable[..., Any],
        fused_call: Callable[..., Any],
        objective_leaves: list[Any],
        state_def: Any,
        *,
        mean: bool,
        names_of: Callable[[list[Any], Any], tuple[str, ...]],
        place: Callable[[Any], Any],
    ) -> None:
        self.step_call, self.fused_call = step_call, fused_call
        self.objective_leaves, self.state_def = objective_leaves, state_def
        self.mean, self.names_of, self.place = mean, names_of, place
        self.names: tuple[str, ...] | None = None
        self.window: Any = None  # the current window, on the device (None: none begun)
        self.fetched: Any = None  # the last window fetched, on the host
        # When the current window's first call was made (`time.perf_counter`); `None` for
        # the fit's first window, which compiles the step (decision 0080).
        self.opened: float | None = None

    def _opening(self, call: Callable[..., Any], leaves: list[Any], batch: Any, first: Any) -> Any:
        """The first call of a window (the fit's first, or the one after a log step): a new
        window, timed from this call, except the fit's first, whose call compiles the step
        and whose steps are the device's first runs (decision 0080)."""
        compiling = self.names is None
        if compiling:
            self.names = window_names(self.names_of(leaves, first))
        assert self.names is not None
        # The bare zeros (`TrainWindow.empty`'s): an Equinox module costs 4x the jitted
        # zeros, at every log step.
        window = self.place(_empty(len(self.names)))
        self.opened = None if compiling else time.perf_counter()
        leaves, self.window = call(leaves, window, batch, self.objective_leaves, self.state_def)
        return leaves

    def step(self, leaves: list[Any], batch: Any) -> list[Any]:
        """One compiled step; returns the new leaves (the window kept, on the device)."""
        if self.window is None:
            return self._opening(self.step_call, leaves, batch, batch)
        leaves, self.window = self.step_call(
            leaves, self.window, batch, self.objective_leaves, self.state_def
        )
        return leaves

    def fused(self, leaves: list[Any], batches: Any, first: Any) -> list[Any]:
        """One fused call over stacked `batches` (`first`: one step's batch); returns the new
        leaves."""
        if self.window is None:
            return self._opening(self.fused_call, leaves, batches, first)
        leaves, self.window = self.fused_call(
            leaves, self.window, batches, self.objective_leaves, self.state_def
        )
        return leaves

    def values(self) -> dict[str, float]:
        """What a log step reports (one fetch), the window then emptied: each metric's mean
        over the window and the last-valued ones (`learning_rate`) at the last step; with
        `mean=False`, every metric at the last step."""
        assert self.names is not None and self.window is not None
        self.fetched, self.window = jax.device_get(self.window), None
        return window_values(self.names, self.fetched, mean=self.mean)

    def loss(self) -> float | None:
        """The last step's loss (`None`: no step ran), fetched when a log step has not."""
        if self.window is not None:
            self.fetched = jax.device_get(self.window)
        if self.fetched is None:
            return None
        assert self.names is not None
        return float(self.fetched[2, self.names.index("loss")])


def as_given(window: Any) -> Any:
    """A window placed as made."""
    return window


def beside(leaves: list[Any]) -> Callable[[Any], Any]:
    """Where a one-process fit puts a new window: as made (uncommitted, as the step's outputs
    are from uncommitted leaves), or on the device of leaves committed to one (a restored
    checkpoint's are). Otherwise the step compiles twice: for the first window, uncommitted,
    and for the next, which the step's committed inputs commit."""
    for leaf in leaves:
        if getattr(leaf, "committed", False) and len(leaf.devices()) == 1:
            (device,) = leaf.devices()
            return functools.partial(jax.device_put, device=device)
    return as_given
