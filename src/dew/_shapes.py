"""dew's built-in synthetic vision data: coloured squares, discs and bars on a black
background, as still images (`shapes`) or as clips of one shape moving at a constant
velocity (`moving_shapes`). Nothing downloads."""

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from dew._datasets import _check_rows, _fraction, _integer, _rows_dataset
from dew.data import Dataset

__all__ = ["SHAPE_KINDS", "moving_shapes", "shapes"]

SHAPE_KINDS = ("square", "disc", "bar")
"""The shape kinds, indexed by their label: square 0, disc 1, bar 2."""
_SQUARE, _DISC = SHAPE_KINDS.index("square"), SHAPE_KINDS.index("disc")

_MIN_IMAGE_SIZE = 12
_SHAPES_SEED = 0
_MOVING_SHAPES_SEED = 1
_POOL_ROW_BYTES = 256  # what `_sample` takes for each row while it draws the pool


class _Pool(NamedTuple):
    """Every row's shape: its label, colour `(rows, 3)`, the bounding box's top-left
    corner on the first frame `(rows, 2)` (whole pixels), its extent `(rows, 2)` (whole
    pixels for squares and bars, the diameter for discs) and its velocity `(rows, 2)`
    in whole pixels a frame, each pair as (row, column)."""

    labels: np.ndarray
    colours: np.ndarray
    corners: np.ndarray
    extents: np.ndarray
    velocities: np.ndarray


def _image_size(builder: str, value: Any) -> int:
    return _integer(builder, "image_size", value, _MIN_IMAGE_SIZE)


def _sample(rows: int, size: int, frames: int, seed: int) -> _Pool:
    """`rows` random shapes that stay inside a `size x size` image for `frames` frames,
    each moving (when `frames > 1`) by up to `max(1, size // 8)` pixels a frame along
    each axis, never standing still."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(SHAPE_KINDS), rows).astype(np.int32)
    colours = rng.uniform(0.3, 1.0, (rows, 3)).astype(np.float32)
    side = rng.integers(size // 4, size // 2 + 1, rows)
    # A lattice disc of radius >= 3 pixels is never a full square.
    diameter = 2 * rng.uniform(max(3.0, 3 * size / 16), max(3.0, size / 4), rows)
    thickness = max(1, size // 8)
    bar = np.stack(
        [rng.integers(size // 2, size - 1, rows), rng.integers(thickness, thickness + 2, rows)],
        axis=1,
    )
    upright = rng.random(rows) < 0.5
    bar = np.where(upright[:, None], bar, bar[:, ::-1])
    extents = np.select(
        [labels[:, None] == _SQUARE, labels[:, None] == _DISC],
        [np.stack([side, side], axis=1), np.stack([diameter, diameter], axis=1)],
        bar,
    ).astype(np.float64)
    room = np.floor(size - extents).astype(np.int64)
    velocities = np.zeros((rows, 2), np.int64)
    if frames > 1:
        reach = np.minimum(max(1, size // 8), room // (frames - 1))
        # Uniform over the box [-reach, reach]^2 without its centre: standing still is out.
        span = 2 * reach + 1
        pick = rng.integers(0, span[:, 0] * span[:, 1] - 1)
        pick = pick + (pick >= reach[:, 0] * span[:, 1] + reach[:, 1])
        velocities = np.stack([pick // span[:, 1], pick % span[:, 1]], axis=1) - reach
    travel = velocities * (frames - 1)
    corners = rng.integers(np.maximum(0, -travel), room - np.maximum(0, travel) + 1)
    return _Pool(labels, colours, corners.astype(np.float64), extents, velocities)


def _draw(pool: _Pool, indices: np.ndarray, size: int, frames: int) -> np.ndarray:
    """The rows `indices` of `pool` drawn as float32 clips `(rows, frames, size, size, 3)`."""
    times = np.arange(frames)[None, :, None]
    extents = pool.extents[indices][:, None, :]
    centres = pool.corners[indices][:, None, :] + pool.velocities[indices][:, None, :] * times
    centres = centres + extents / 2
    pixels = np.arange(size) + 0.5
    # Offsets of the pixel centres from the shape's centre: (rows, frames, size) per axis.
    down = pixels - centres[..., 0:1]
    across = pixels - centres[..., 1:2]
    box = (np.abs(down) < extents[..., 0:1] / 2)[..., :, None] & (
        np.abs(across) < extents[..., 1:2] / 2
    )[..., None, :]
    radius = extents[..., 0:1, None] / 2
    disc = down[..., :, None] ** 2 + across[..., None, :] ** 2 <= radius**2
    inside = np.where((pool.labels[indices] == _DISC)[:, None, None, None], disc, box)
    colours = pool.colours[indices][:, None, None, None, :]
    return inside[..., None].astype(np.float32) * colours


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
    dataset's `classes`).

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
    pool = _sample(rows, size, 1, _SHAPES_SEED)

    def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"images": _draw(pool, indices, size, 1)[:, 0], "labels": pool.labels[indices]}

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
    (square 0, disc 1, bar 2).

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
    pool = _sample(rows, size, frames, _MOVING_SHAPES_SEED)

    def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"clips": _draw(pool, indices, size, frames), "labels": pool.labels[indices]}

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
