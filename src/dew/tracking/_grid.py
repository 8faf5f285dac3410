"""One labelled grid of a preview's images or clips: every sample a cell, enlarged to a
readable size, its caption under it, the real rows beside the generated ones.

The layout, from the inputs alone (`grid_frames`):

- Each image is enlarged by the whole factor `cell_scale(height, width)` =
  `max(1, ceil(CELL / max(height, width)))`, nearest neighbour (every pixel becomes a
  square of one colour, nothing is smoothed), so a cell is at least `CELL` (64) pixels on
  its longer side; a larger image is shown as it is, never shrunk.
- Samples are columns, at most `COLUMNS` (8) to a band; more wrap into further bands. A
  band holds one line per kind of row, "generated" first and then "real" (the reference
  rows, where the preview has them), each line named in a header column on the left.
- Under every cell of a line whose samples have captions (a class name, a label, a prompt)
  is a caption band of one or two lines of Pillow's default bitmap font (no font file is
  read: `PIL.ImageFont.load_default_imagefont`), the caption wrapped at spaces and cut with
  `...` where it is longer; a real row is captioned as the generated row of its column.
- `GAP` (2) pixels of `BACKGROUND` separate and surround the cells.

Pixels are RGB: grey rows are repeated into the three channels and an alpha channel is
dropped (a GIF has no partial transparency; a grid shows every sample the same way).
Clips are laid out the same way, every frame of the grid holding frame `f` of every clip.
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "BACKGROUND",
    "CAPTION_LINES",
    "CELL",
    "COLUMNS",
    "GAP",
    "HEADER_PAD",
    "LINE_HEIGHT",
    "TEXT",
    "caption_lines",
    "cell_scale",
    "font",
    "grid_frames",
    "pillow",
]

CELL = 64
"""The least height or width of a cell, in pixels: smaller images are enlarged to it."""
COLUMNS = 8
"""The most samples (columns) in one band of the grid."""
GAP = 2
"""The background between and around cells, in pixels."""
CAPTION_LINES = 2
"""The most lines of text under a cell."""
LINE_HEIGHT = 11
"""The height of a line of Pillow's default bitmap font."""
HEADER_PAD = 3
"""The space left and right of a line's name in the header column."""
BACKGROUND = (73, 73, 85)
"""The colour between cells (one of the GIF palette's own, so clips show it exactly)."""
TEXT = (255, 255, 255)
"""The colour of captions and line names."""


@functools.cache
def pillow() -> Any:
    """Pillow's `Image`, `ImageDraw` and `ImageFont` modules, imported on first use (previews
    draw and encode their grids with them)."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise ImportError(
            "previews draw and encode their grids with Pillow: pip install pillow (dew-ml depends "
            "on it).",
            name="PIL",
        ) from None
    return Image, ImageDraw, ImageFont


@functools.cache
def font() -> Any:
    """Pillow's default bitmap font (6 by 11 pixels a character, Latin-1), read from
    Pillow itself: nothing is downloaded."""
    return pillow()[2].load_default_imagefont()


def cell_scale(height: int, width: int) -> int:
    """The whole factor an image of `height` x `width` is enlarged by in a grid."""
    return max(1, math.ceil(CELL / max(height, width)))


def _drawable(text: str) -> str:
    """`text` as the bitmap font draws it: one line, Latin-1, other characters as `?`."""
    flat = " ".join(str(text).split())
    return "".join(
        character if character.isprintable() and ord(character) < 256 else "?" for character in flat
    )


def caption_lines(caption: str | None, width: int) -> list[str]:
    """The lines `caption` is drawn as under a cell `width` pixels wide: wrapped at
    spaces, at most `CAPTION_LINES`, the last cut to end in `...` where more is left."""
    if caption is None:
        return []
    text, face = _drawable(caption), font()
    per_line = max(1, (width - 2) // max(1, int(face.getlength("M"))))
    lines = textwrap.wrap(text, per_line, break_on_hyphens=False) or [""]
    if len(lines) > CAPTION_LINES:
        last = " ".join(lines[CAPTION_LINES - 1 :])
        lines = [*lines[: CAPTION_LINES - 1], last[: max(0, per_line - 3)] + "..."]
    return lines


def _rgb(cells: np.ndarray) -> np.ndarray:
    """uint8 `(..., channels)` as RGB: grey repeated, alpha dropped."""
    if cells.shape[-1] in (2, 4):
        cells = cells[..., :-1]
    if cells.shape[-1] == 1:
        cells = np.repeat(cells, 3, axis=-1)
    return cells


def grid_frames(
    lines: Sequence[tuple[str, np.ndarray]], captions: Sequence[str | None] | None
) -> np.ndarray:
    """The frames of one grid, uint8 `(frames, height, width, 3)`.

    **Arguments:**

    - `lines`: each kind of row, `(name, cells)` with `cells` uint8
      `(samples, frames, height, width, channels)` (one frame for images): the generated
      rows, then the real ones. Every line has the same frames.
    - `captions`: one caption per sample (column), `None` where a sample has none; `None`
      for no captions at all.
    """
    image, image_draw, _ = pillow()
    face = font()
    names = [name for name, _ in lines]
    cells = [_rgb(np.asarray(array, np.uint8)) for _, array in lines]
    frames = cells[0].shape[1]
    scales = [cell_scale(*array.shape[2:4]) for array in cells]
    cell_h = max(array.shape[2] * scale for array, scale in zip(cells, scales, strict=True))
    cell_w = max(array.shape[3] * scale for array, scale in zip(cells, scales, strict=True))
    samples = max(len(array) for array in cells)
    columns = min(COLUMNS, samples)
    bands = math.ceil(samples / columns)
    wrapped = [caption_lines(caption, cell_w) for caption in (captions or ())]
    caption_h = max((len(found) for found in wrapped), default=0) * LINE_HEIGHT
    caption_h += 2 if caption_h else 0
    header_w = max(int(face.getlength(name)) for name in names) + 2 * HEADER_PAD
    line_h = cell_h + caption_h + GAP
    height = GAP + bands * len(lines) * line_h
    width = GAP + header_w + columns * (cell_w + GAP)
    canvas = image.new("RGB", (width, height), BACKGROUND)
    draw = image_draw.Draw(canvas)
    places: list[tuple[int, int, int, int]] = []  # (line, sample, top, left)
    for band in range(bands):
        for number, name in enumerate(names):
            top = GAP + (band * len(lines) + number) * line_h
            draw.text((HEADER_PAD, top + (cell_h - LINE_HEIGHT) // 2), name, TEXT, font=face)
            for column in range(columns):
                sample = band * columns + column
                if sample >= len(cells[number]):
                    continue
                left = GAP + header_w + column * (cell_w + GAP)
                places.append((number, sample, top, left))
                for row, text in enumerate(wrapped[sample] if sample < len(wrapped) else []):
                    at = (left + 1, top + cell_h + 1 + row * LINE_HEIGHT)
                    draw.text(at, text, TEXT, font=face)
    grid = np.repeat(np.asarray(canvas)[None], frames, axis=0)
    for number, sample, top, left in places:
        scale = scales[number]
        enlarged = cells[number][sample].repeat(scale, axis=1).repeat(scale, axis=2)
        grid[:, top : top + enlarged.shape[1], left : left + enlarged.shape[2]] = enlarged
    return grid
