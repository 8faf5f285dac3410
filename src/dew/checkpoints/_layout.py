"""How a `TrainState` is laid out in a checkpoint: its array leaves (the run key as raw key
data), the metric history as JSON, and what differs when a checkpoint was written for
another state."""

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.steps import MetricHistory, TrainState
from dew.telemetry.records import decode_json_value, encode_json_value

__all__ = [
    "LAYOUT",
    "abstract",
    "history_from_json",
    "history_to_json",
    "is_key",
    "layout",
    "params_positions",
    "recorded_arrays",
    "saved_leaves",
    "structure_differences",
]

LAYOUT = "layout"
"""The key of the checkpoint's JSON item that says how many of its arrays are the params and
the EMA params (`layout`)."""

_SHOWN_DIFFERENCES = 6


def is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def saved_leaves(state: TrainState) -> list[Any]:
    """The arrays a checkpoint holds for `state`: its leaves, the run key as raw key data.

    Not copies: orbax copies each array to host memory before its `save` returns (its
    default, synchronous transfer), so the next step may donate `state`'s buffers while
    orbax writes (decision 0050)."""
    return [jax.random.key_data(leaf) if is_key(leaf) else leaf for leaf in jax.tree.leaves(state)]


def _shape_dtype(leaf: Any) -> tuple[tuple[int, ...], str]:
    """A state leaf's shape and dtype as a checkpoint holds it (keys as raw key data)."""
    if is_key(leaf):
        leaf = jax.random.key_data(leaf)
    return tuple(jnp.shape(leaf)), str(np.dtype(jnp.result_type(leaf)))


def _describe(shape: tuple[int, ...], dtype: str) -> str:
    return f"{dtype}[{', '.join(str(size) for size in shape)}]"


def history_to_json(history: MetricHistory) -> dict[str, Any]:
    """The history as JSON data (non-finite values as `"NaN"`, `"+Inf"`, `"-Inf"`): each
    series a list of `[step, value]`. A point of an int step and a finite float, what
    `Trainer.fit` records, is written as it is; any other goes through
    `encode_json_value`, which every point went through before and which takes some
    twenty times as long (a checkpoint holds the whole history)."""
    return {
        tag: [
            [step, value]
            if type(step) is int and type(value) is float and math.isfinite(value)
            else encode_json_value([step, value])
            for step, value in series
        ]
        for tag, series in history.items()
    }


def history_from_json(data: Mapping[str, Any]) -> MetricHistory:
    """Inverse of `history_to_json`."""
    return MetricHistory(
        {
            tag: tuple(
                (int(step), value if type(value) is float else decode_json_value(value))
                for step, value in series
            )
            for tag, series in data.items()
        }
    )


def abstract(leaf: Any) -> jax.ShapeDtypeStruct:
    """What orbax restores a template leaf as: its shape, dtype (keys as raw key data) and,
    for an array, its sharding, so orbax reads each array straight into the template's
    placement (a multi-process fit's global arrays: every process into its own shards)
    and needs no second conversion, nor the saved shardings read to choose one."""
    data = jax.random.key_data(leaf) if is_key(leaf) else leaf
    sharding = data.sharding if isinstance(data, jax.Array) else None
    return jax.ShapeDtypeStruct(jnp.shape(data), jnp.result_type(data), sharding=sharding)


def structure_differences(
    saved: list[tuple[tuple[int, ...], str]], template: TrainState
) -> str | None:
    """Where the saved arrays' shapes and dtypes differ from `template`'s (one indented
    line each, the first few), or `None` when they agree."""
    expected = [
        (jax.tree_util.keystr(path), *_shape_dtype(leaf))
        for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]
    ]
    differing = [
        f"  {path}: saved {_describe(*saved[index])}, expected {_describe(shape, dtype)}"
        if index < len(saved)
        else f"  {path}: not saved, expected {_describe(shape, dtype)}"
        for index, (path, shape, dtype) in enumerate(expected)
        if index >= len(saved) or saved[index] != (shape, dtype)
    ]
    differing += [
        f"  saved array {index} ({_describe(*saved[index])}): not in this state"
        for index in range(len(expected), len(saved))
    ]
    if not differing:
        return None
    shown = differing[:_SHOWN_DIFFERENCES]
    if len(differing) > len(shown):
        shown.append(f"  ... and {len(differing) - len(shown)} more")
    return "\n".join(shown)


def layout(state: TrainState) -> dict[str, Any]:
    """How many of a checkpoint's arrays are `state`'s params and EMA params, and every
    array's shape and dtype (`arrays`, so a restore checks a template against the JSON item
    instead of reading each array's metadata). The arrays are the state's leaves in order
    (`saved_leaves`): the step, the params, the optimizer state, the run key, then the EMA
    params; so the params start at array 1 and the EMA params end the list, and neither needs
    the optimizer to be found."""
    return {
        "params": len(jax.tree.leaves(state.params)),
        "ema_params": len(jax.tree.leaves(state.ema_params)),
        "arrays": [
            [list(shape), dtype] for shape, dtype in map(_shape_dtype, jax.tree.leaves(state))
        ],
    }


def recorded_arrays(recorded: Mapping[str, Any] | None) -> list[tuple[tuple[int, ...], str]] | None:
    """The saved arrays' shapes and dtypes as a checkpoint's layout records them, or `None`
    when it records none (a checkpoint written before layouts recorded them) or records
    something else."""
    arrays = recorded.get("arrays") if isinstance(recorded, Mapping) else None
    if not isinstance(arrays, list):
        return None
    try:
        return [(tuple(int(size) for size in shape), str(dtype)) for shape, dtype in arrays]
    except (TypeError, ValueError):
        return None


def params_positions(
    saved: list[tuple[tuple[int, ...], str]],
    recorded: Mapping[str, Any] | None,
    params: Any,
    *,
    ema: bool,
) -> list[int]:
    """Where `params` (with `ema`, the EMA params) lie among a checkpoint's saved arrays
    (their shapes and dtypes, `saved`), by the layout the checkpoint `recorded` (`layout`;
    `None` for a checkpoint written before checkpoints recorded one: the params counted as
    `params`'s, and the EMA params too where `ema` asks for them).

    **Raises:** `ValueError` when the checkpoint holds no EMA params and `ema` asks for
    them, or when its params differ from `params` in number, shape or dtype: one line naming
    the first leaf that differs (a checkpoint written for another model).
    """
    expected = [
        (jax.tree_util.keystr(path), *_shape_dtype(leaf))
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    ]
    count = len(expected)
    stored = {"params": count, "ema_params": count if ema else 0}
    if recorded is not None:
        stored = {part: int(recorded.get(part, 0)) for part in stored}
    what = "EMA params" if ema else "params"
    if ema and stored["ema_params"] == 0:
        raise ValueError("it holds no EMA params (the run kept none)")
    number = stored["ema_params"] if ema else stored["params"]
    start = len(saved) - number if ema else 1
    if start < 1 or start + number > len(saved):
        raise ValueError(f"its {what} do not fit its {len(saved)} arrays (a damaged layout)")
    for index, (path, shape, dtype) in enumerate(expected):
        if index >= number:
            raise _another_model(what, number, count, f"{path}: not saved")
        if saved[start + index] != (shape, dtype):
            found = f"saved {_describe(*saved[start + index])}, expected {_describe(shape, dtype)}"
            raise _another_model(what, number, count, f"{path}: {found}")
    if number > count:
        extra = f"saved array {start + count} ({_describe(*saved[start + count])}), not in it"
        raise _another_model(what, number, count, extra)
    return list(range(start, start + number))


def _another_model(what: str, stored: int, count: int, first: str) -> ValueError:
    return ValueError(
        f"it was written for another model: its {what} are {stored} arrays, this model's "
        f"{count}, and the first that differs is {first}"
    )
