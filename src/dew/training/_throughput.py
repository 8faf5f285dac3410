"""Throughput and model FLOP utilisation, measured on the host at log steps (decision 0080).

A log step's window is timed from the moment its first compiled call was made
(`_window.WindowedCalls.opened`) to the fetch of the window, which waits for its steps, and
counted by the batches drawn since the last log step (the trainer keeps them anyway, to
explain a failed step). The fit's first window goes untimed: its first call compiles the
step, and its steps are the device's first runs of it. Nothing is added per step: the rates
are worked out at the log step.
`mfu` needs the step's FLOPs, counted once per fit by XLA's cost analysis (`step_flops`).
"""

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend as jex
import numpy as np

from dew._throughput import EXAMPLES_PER_SECOND, MFU, TOKENS_PER_SECOND, peak_flops
from dew.objectives.base import CountsTokens

__all__ = ["Throughput", "compute_dtype", "device_kind", "step_flops"]


def device_kind() -> str:
    """The kind of the devices a fit runs on (`jax.devices()[0].device_kind`)."""
    return jax.devices()[0].device_kind


def compute_dtype(params: Any, precision: str = "float32") -> str:
    """The dtype a step's matmuls run in: `"bfloat16"` under a bfloat16 `precision` policy
    (decision 0078) or when every floating array of `params` is half precision, else
    `"float32"`."""
    if precision != "float32":
        return "bfloat16"
    floating = [
        leaf.dtype
        for leaf in jax.tree.leaves(params)
        if hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating)
    ]
    half = floating and all(np.dtype(dtype).itemsize == 2 for dtype in floating)
    return "bfloat16" if half else "float32"


def _flops(lowered: Any) -> float:
    """XLA's FLOP count of a lowered computation (`cost_analysis()` is a dict in this JAX,
    a list of one dict per module in older ones)."""
    analysis = lowered.cost_analysis()
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    return float((analysis or {}).get("flops", 0.0))


def _subjaxprs(params: dict[str, Any]) -> list[Any]:
    found = []
    for value in params.values():
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, jex.core.ClosedJaxpr | jex.core.Jaxpr):
                found.append(item)
    return found


def _closed(jaxpr: Any) -> Any:
    return jaxpr if isinstance(jaxpr, jex.core.ClosedJaxpr) else jex.core.ClosedJaxpr(jaxpr, ())


def _xla_flops(jaxpr: Any) -> float:
    """XLA's count for one closed jaxpr, lowered on its own (its loops' bodies once)."""
    shapes = [jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in jaxpr.in_avals]
    return _flops(jax.jit(jex.core.jaxpr_as_fun(jaxpr)).lower(*shapes))


def _loop_flops(jaxpr: Any) -> float:
    """What XLA's count of `jaxpr` misses of its scans: XLA's cost analysis counts a loop's
    body once whatever its trip count, so each scan adds `length - counted` more runs of
    its body (a body's own scans counted in full), `counted` being the copies XLA saw
    (`unroll` of them, or every one when unrolled whole)."""
    missing = 0.0
    for eqn in _closed(jaxpr).jaxpr.eqns:
        if eqn.primitive.name == "scan":
            body, length, unroll = eqn.params["jaxpr"], eqn.params["length"], eqn.params["unroll"]
            counted = length if unroll is True or unroll >= length else max(int(unroll), 1)
            once = _xla_flops(body)
            missing += (length - counted) * once + length * _loop_flops(body)
        else:
            missing += sum(_loop_flops(sub) for sub in _subjaxprs(eqn.params))
    return missing


def step_flops(call: Any, *args: Any) -> float:
    """The FLOPs of one run of the jitted `call` on `args` (arrays or
    `jax.ShapeDtypeStruct`s): XLA's cost analysis of the HLO JAX lowers it to, before
    XLA's passes (the whole computation, not one device's share of a partitioned one, and
    its loops still loops), with every scan's body counted as many times as it runs. A
    rematerialised forward pass is counted again, as the step runs it; a `while_loop`'s
    body, whose trip count is known only at run time, once."""
    traced = call.trace(*args)
    return _flops(traced.lower()) + _loop_flops(traced.jaxpr)


class Throughput:
    """What a log step reports of the training speed (`measured`): `examples_per_second`,
    `tokens_per_second` for an objective that counts its tokens, and `mfu` where `peak`
    (one device's peak FLOP/s) is known, from `flops(batch)`, the FLOPs of one step on a
    batch like `batch` (called once). `processes`: how many processes' shares make one
    global batch; `devices`: how many devices the step runs on."""

    def __init__(
        self,
        objective: Any,
        *,
        dtype: str,
        flops: Callable[[Any], float],
        processes: int = 1,
        devices: int = 1,
    ) -> None:
        self.objective = objective
        self.counts_tokens = isinstance(objective, CountsTokens)
        self.peak = peak_flops(device_kind(), dtype)
        self.flops_of, self.flops = flops, None
        self.processes, self.devices = processes, devices

    def measured(self, opened: float, batches: Sequence[Any]) -> dict[str, float]:
        """The rates over `batches`, the steps run since `opened` (a `time.perf_counter`
        reading), now that they have run; `{}` when none was timed."""
        seconds = time.perf_counter() - opened
        if not batches or not seconds > 0:
            return {}
        values = {EXAMPLES_PER_SECOND: self.processes * sum(map(_rows, batches)) / seconds}
        if self.counts_tokens:
            tokens = sum(self.objective.batch_tokens(batch) for batch in batches)
            values[TOKENS_PER_SECOND] = self.processes * tokens / seconds
        if self.peak is not None:
            if self.flops is None:  # counted once per fit, at its first report
                self.flops = self.flops_of(batches[-1])
            values[MFU] = self.flops * len(batches) / seconds / (self.peak * self.devices)
        return {name: value for name, value in values.items() if math.isfinite(value)}


def _rows(batch: Any) -> int:
    """A batch's rows: the leading axis of its first array with one."""
    for leaf in jax.tree.leaves(batch):
        if np.ndim(leaf):
            return int(np.shape(leaf)[0])
    return 0
