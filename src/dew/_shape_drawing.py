"""Drawing dew's synthetic shapes: one coloured square, disc or bar on a black background,
still or moving at a constant velocity. Pure NumPy, below the core: the `shapes` and
`moving_shapes` datasets draw their rows with it, and `dew.metrics.shape_classifier` draws
the rows its classifier learns the kinds from."""

from typing import NamedTuple

import numpy as np

__all__ = ["MIN_IMAGE_SIZE", "SHAPE_KINDS", "ShapePool", "draw_shapes", "sample_shapes"]

SHAPE_KINDS = ("square", "disc", "bar")
"""The shape kinds, indexed by their label: square 0, disc 1, bar 2."""
_SQUARE, _DISC = SHAPE_KINDS.index("square"), SHAPE_KINDS.index("disc")
MIN_IMAGE_SIZE = 12
"""The smallest image the shapes are drawn in."""


class ShapePool(NamedTuple):
    """Every row's shape: its label, colour `(rows, 3)`, the bounding box's top-left
    corner on the first frame `(rows, 2)` (whole pixels), its extent `(rows, 2)` (whole
    pixels for squares and bars, the diameter for discs) and its velocity `(rows, 2)`
    in whole pixels a frame, each pair as (row, column)."""

    labels: np.ndarray
    colours: np.ndarray
    corners: np.ndarray
    extents: np.ndarray
    velocities: np.ndarray


def sample_shapes(rows: int, size: int, frames: int, seed: int) -> ShapePool:
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
    return ShapePool(labels, colours, corners.astype(np.float64), extents, velocities)


def draw_shapes(pool: ShapePool, indices: np.ndarray, size: int, frames: int) -> np.ndarray:
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
