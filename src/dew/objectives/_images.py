"""Batch checks shared by the vision objectives: float images or clips in `[0, 1]` of the
model's shape, and integer class labels, one per row."""

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array

from dew._checks import check_ids, check_unit_interval

__all__ = ["checked_labels", "checked_pixels"]

_LAYOUTS = {
    "images": (("rows", "height", "width", "channels"), ("row", "y", "x", "channel")),
    "clips": (
        ("rows", "frames", "height", "width", "channels"),
        ("row", "frame", "y", "x", "channel"),
    ),
}


def checked_pixels(
    kind: str, batch: Mapping[str, Any], field: str, example_shape: tuple[int, ...]
) -> Array:
    """`batch[field]` as float32, checked: floating, shaped `(rows, *example_shape)`
    and every value in `[0, 1]` (on the host a `ValueError` naming the first bad value and
    its position; traced an `eqx.error_if`). `field` is `"images"` or `"clips"`."""
    values = batch[field]
    dtype = getattr(values, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{kind} needs float values in [0, 1] in batch[{field!r}], got dtype {dtype}; "
            "convert 8-bit images with .astype(np.float32) / 255."
        )
    layout, axes = _LAYOUTS[field]
    if values.ndim != len(example_shape) + 1 or tuple(values.shape[1:]) != example_shape:
        raise ValueError(
            f"{kind} needs batch[{field!r}] shaped ({', '.join(layout)}) = "
            f"(rows, {', '.join(map(str, example_shape))}) for its model, got shape "
            f"{tuple(values.shape)}."
        )
    checked = check_unit_interval(values, subject=f"{kind}: batch[{field!r}]", axes=axes)
    return jnp.asarray(checked, jnp.float32)


def checked_labels(
    kind: str, labels: Any, rows: int, num_classes: int | None, size_name: str
) -> Array:
    """Integer class `labels` shaped `(rows,)`, checked, as int32; with `num_classes` every
    label must lie in `[0, num_classes)` (named `size_name` in the message)."""
    dtype = getattr(labels, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(
            f"{kind} needs integer class labels in batch['labels'], got dtype {dtype}."
        )
    if tuple(labels.shape) != (rows,):
        raise ValueError(
            f"{kind} needs one label per row in batch['labels'], shaped ({rows},), got shape "
            f"{tuple(labels.shape)}."
        )
    if num_classes is not None:
        labels = check_ids(
            labels,
            num_classes,
            subject=f"{kind}: batch['labels']",
            noun="label",
            size_name=size_name,
            axes=("row",),
        )
    return jnp.asarray(labels, jnp.int32)
