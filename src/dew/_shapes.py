"""dew's built-in synthetic vision data: coloured squares, discs and bars on a black
background, as still images (`shapes`) or as clips of one shape moving at a constant
velocity (`moving_shapes`). Nothing downloads."""

import dataclasses
from typing import Any

import numpy as np

from dew._datasets import _check_rows, _fraction, _integer, _rows_dataset
from dew._shape_drawing import MIN_IMAGE_SIZE, SHAPE_KINDS, draw_shapes, sample_shapes
from dew.data import Dataset

__all__ = ["SHAPE_KINDS", "moving_shapes", "shapes"]

_SHAPES_SEED = 0
_MOVING_SHAPES_SEED = 1
_POOL_ROW_BYTES = 256  # what `sample_shapes` takes for each row while it draws the pool


def _image_size(builder: str, value: Any) -> int:
    return _integer(builder, "image_size", value, MIN_IMAGE_SIZE)


def shapes(
    *,
    rows: int = 1024,
    image_size: int = 16,
    val_fraction: float | int = 0.1,
    batch_size: int,
    seed: int,
) -> Dataset:
    """Synthetic images of one coloured shape on a black background: batches of
    `"images"`, float32 `(rows, image_size, image_size, 3)` in `[0, 1]`, and `"labels"`,
    int32 `(rows,)`, the shape's kind in `SHAPE_KINDS`: square 0, disc 1, bar 2 (the
    dataset's `classes`, which name the labels in previews and predictions).

    Background pixels are exactly 0; the shape is one colour, each channel drawn from
    `[0.3, 1]`, so `image.max(-1) > 0` is its mask. Kinds are drawn uniformly. Squares
    have sides of `image_size // 4` to `image_size // 2` pixels; discs a radius of
    `3 * image_size / 16` (at least 3) to `image_size / 4` pixels (any real number; a
    lattice disc that wide is never a full square); bars are `image_size // 2` to
    `image_size - 2` pixels long and `max(1, image_size // 8)` or one more thick,
    upright or lying. Every shape lies wholly inside the image, its bounding box at a
    random whole-pixel position.

    **Arguments:**

    - `rows`: how many images the dataset holds.
    - `image_size`: the images' height and width, at least 12.
    - `val_fraction`: the share of rows (the last ones, rounded up) held out for
      validation; `0` gives a dataset without validation data.
    - `batch_size`: rows per batch of each partition; `seed`: the shuffle's seed.

    The images are fixed (the same for every seed, so runs with different seeds validate
    on the same rows); `seed` shuffles the training order, and batches, partitions and
    validation behave as in `token_windows`.

    ```python
    >>> from dew.data import Partition
    >>> batch = next(shapes(batch_size=4, seed=0).train(Partition()))
    >>> batch["images"].shape, batch["images"].dtype.name, batch["labels"].dtype.name
    ((4, 16, 16, 3), 'float32', 'int32')

    ```
    """
    rows = _integer("shapes", "rows", rows, 1)
    size = _image_size("shapes", image_size)
    val_fraction = _fraction("shapes", val_fraction)
    batch_size = _integer("shapes", "batch_size", batch_size, 1)
    seed = _integer("shapes", "seed", seed, 0)
    _check_rows("shapes", "rows", rows, _POOL_ROW_BYTES)
    pool = sample_shapes(rows, size, 1, _SHAPES_SEED)

    def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"images": draw_shapes(pool, indices, size, 1)[:, 0], "labels": pool.labels[indices]}

    data = _rows_dataset(
        "shapes",
        rows,
        gather,
        val_fraction=val_fraction,
        batch_size=batch_size,
        seed=seed,
        shape=(rows, size, _SHAPES_SEED),
    )
    return dataclasses.replace(data, classes=SHAPE_KINDS)


def moving_shapes(
    *,
    rows: int = 1024,
    image_size: int = 16,
    frames: int = 4,
    val_fraction: float | int = 0.1,
    batch_size: int,
    seed: int,
) -> Dataset:
    """Synthetic clips of one coloured shape moving at a constant velocity on a black
    background: batches of `"clips"`, float32 `(rows, frames, image_size, image_size, 3)`
    in `[0, 1]`, and `"labels"`, int32 `(rows,)`, the shape's kind in `SHAPE_KINDS`
    (square 0, disc 1, bar 2; the dataset's `classes`).

    The shapes are drawn as in `shapes`. Each clip's shape moves by a whole number of
    pixels a frame, up to `max(1, image_size // 8)` along each axis and never standing
    still, and it stays wholly inside every frame (it neither wraps nor leaves), so
    its pixels simply translate and its centroid is linear in the frame number.

    **Arguments:**

    - `rows`: how many clips the dataset holds.
    - `image_size`: the frames' height and width, at least 12.
    - `frames`: frames per clip, from 2 to `image_size // 2 + 1` (so that every shape
      can move at least a pixel a frame without leaving the image).
    - `val_fraction`, `batch_size`, `seed`: as in `shapes`; the clips are fixed and `seed`
      shuffles the training order.

    ```python
    >>> from dew.data import Partition
    >>> batch = next(moving_shapes(batch_size=2, seed=0).train(Partition()))
    >>> batch["clips"].shape, batch["labels"].shape
    ((2, 4, 16, 16, 3), (2,))

    ```
    """
    rows = _integer("moving_shapes", "rows", rows, 1)
    size = _image_size("moving_shapes", image_size)
    frames = _integer("moving_shapes", "frames", frames, 2)
    if frames > size // 2 + 1:
        raise ValueError(
            f"moving_shapes: frames must be at most image_size // 2 + 1 = {size // 2 + 1} "
            f"(so that every shape can move a pixel a frame inside the {size}x{size} image), "
            f"got {frames}."
        )
    val_fraction = _fraction("moving_shapes", val_fraction)
    batch_size = _integer("moving_shapes", "batch_size", batch_size, 1)
    seed = _integer("moving_shapes", "seed", seed, 0)
    _check_rows("moving_shapes", "rows", rows, _POOL_ROW_BYTES)
    pool = sample_shapes(rows, size, frames, _MOVING_SHAPES_SEED)

    def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"clips": draw_shapes(pool, indices, size, frames), "labels": pool.labels[indices]}

    data = _rows_dataset(
        "moving_shapes",
        rows,
        gather,
        val_fraction=val_fraction,
        batch_size=batch_size,
        seed=seed,
        shape=(rows, size, frames, _MOVING_SHAPES_SEED),
    )
    return dataclasses.replace(data, classes=SHAPE_KINDS)
