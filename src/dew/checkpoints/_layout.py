"""How a `TrainState` is laid out in a checkpoint: its array leaves (the run key as raw key
data), the metric history as JSON, and what differs when a checkpoint was written for
another state."""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.steps import MetricHistory, TrainState
from dew.telemetry.records import decode_json_value, encode_json_value

__all__ = [
    "abstract",
    "history_from_json",
    "history_to_json",
    "is_key",
    "saved_leaves",
    "structure_differences",
]

_SHOWN_DIFFERENCES = 6


def is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def saved_leaves(state: TrainState) -> list[Any]:
    """The arrays a checkpoint holds for `state`, copied (the next step may donate
    `state`'s buffers while orbax writes)."""
    return [
        jax.random.key_data(leaf) if is_key(leaf) else jnp.array(leaf, copy=True)
        for leaf in jax.tree.leaves(state)
    ]


def _shape_dtype(leaf: Any) -> tuple[tuple[int, ...], str]:
    """A state leaf's shape and dtype as a checkpoint holds it (keys as raw key data)."""
    if is_key(leaf):
        leaf = jax.random.key_data(leaf)
    return tuple(jnp.shape(leaf)), str(np.dtype(jnp.result_type(leaf)))


def _describe(shape: tuple[int, ...], dtype: str) -> str:
    return f"{dtype}[{', '.join(str(size) for size in shape)}]"


def history_to_json(history: MetricHistory) -> dict[str, Any]:
    """The history as JSON data (non-finite values as `"NaN"`, `"+Inf"`, `"-Inf"`)."""
    return encode_json_value(
        {tag: [list(point) for point in series] for tag, series in history.items()}
    )


def history_from_json(data: Mapping[str, Any]) -> MetricHistory:
    """Inverse of `history_to_json`."""
    decoded = decode_json_value(dict(data))
    return MetricHistory(
        {
            tag: tuple((int(step), value) for step, value in series)
            for tag, series in decoded.items()
        }
    )


def abstract(leaf: Any) -> jax.ShapeDtypeStruct:
    """What orbax restores a template leaf as: its shape and dtype (keys as raw key data)
    and, for a leaf placed over several devices (a multi-process fit's global arrays),
    its sharding, so every process restores straight into its shards."""
    data = jax.random.key_data(leaf) if is_key(leaf) else leaf
    sharding = None
    if isinstance(data, jax.Array) and not isinstance(
        data.sharding, jax.sharding.SingleDeviceSharding
    ):
        sharding = data.sharding
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
