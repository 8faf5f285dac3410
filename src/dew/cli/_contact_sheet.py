"""A batch of images as one PNG contact sheet, each tile captioned with its label (Pillow)."""

import math
import os
import pathlib
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from dew.tracking._render import to_uint8

__all__ = ["CAPTION", "GAP", "TILE", "contact_sheet", "tile_scale"]

TILE = 64
"""The least height or width a tile is drawn at: smaller images are enlarged by a whole
factor (nearest neighbour, so each pixel stays a square of one colour)."""
CAPTION = 14
"""The height of the caption strip under each tile, in pixels."""
GAP = 2
"""The background between tiles, in pixels."""
COLUMNS = 8
"""The most tiles in a row of the sheet (a clip's frames make a row of their own)."""


def _pillow() -> Any:
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise ImportError(
            "the contact sheet needs Pillow: pip install pillow (or 'dew-ml[images]').",
            name="PIL",
        ) from None
    return Image, ImageDraw, ImageFont


def tile_scale(height: int, width: int) -> int:
    """The whole factor an image of `height` x `width` is enlarged by on the sheet."""
    return max(1, math.ceil(TILE / max(height, width)))


def _pixels(images: np.ndarray) -> tuple[np.ndarray, str]:
    """`images` as uint8 RGB, and how their values were read: uint8 as they are, floats in
    [0, 1] as dew's image sources give them, other floats stretched from their range."""
    images = np.asarray(images)
    if images.dtype == np.uint8:
        pixels, scale = images, "uint8"
    else:
        values = np.asarray(images, np.float64)
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if low >= 0 and high <= 1:
            pixels, scale = to_uint8(values), "[0, 1]"
        else:
            span = high - low or 1.0
            pixels, scale = to_uint8((values - low) / span), f"stretched from [{low:g}, {high:g}]"
    if pixels.shape[-1] == 1:
        pixels = np.repeat(pixels, 3, axis=-1)
    return pixels[..., :3], scale


def _fitted(caption: str, font: Any, width: int) -> str:
    """`caption`, cut to end in `...` where it is wider than `width` pixels in `font`."""
    if font.getlength(caption) <= width:
        return caption
    while caption and font.getlength(caption + "...") > width:
        caption = caption[:-1]
    return caption + "..."


def contact_sheet(
    images: np.ndarray, captions: Sequence[str], out: str | os.PathLike[str]
) -> tuple[pathlib.Path, str]:
    """Write `images` (`(rows, height, width, channels)`, or clips `(rows, frames, height,
    width, channels)` whose frames make a row each) as a PNG at `out`, each image (a clip's
    first frame) captioned with `captions[row]`; return the path and how the values were
    read (`_pixels`). The file is written under a temporary name, then renamed.

    **Raises:** `ImportError` without Pillow; `ValueError` for an `out` that is not a
    `.png` file name.
    """
    target = pathlib.Path(out)
    if target.suffix.lower() != ".png":
        raise ValueError(f"--out names the contact sheet, a .png file; got {os.fspath(out)!r}.")
    image, image_draw, image_font = _pillow()
    pixels, scale = _pixels(images)
    clips = pixels if pixels.ndim == 5 else pixels[:, None]
    rows, frames, height, width, _ = clips.shape
    factor = tile_scale(height, width)
    tile_h, tile_w = height * factor, width * factor
    columns = frames if frames > 1 else min(COLUMNS, rows)
    lines = rows if frames > 1 else math.ceil(rows / columns)
    cell_h, cell_w = tile_h + CAPTION + GAP, tile_w + GAP
    sheet = image.new("RGB", (columns * cell_w + GAP, lines * cell_h + GAP), (32, 32, 32))
    draw = image_draw.Draw(sheet)
    font = image_font.load_default()
    for row in range(rows):
        for frame in range(frames):
            line, column = (row, frame) if frames > 1 else divmod(row, columns)
            x, y = GAP + column * cell_w, GAP + line * cell_h
            enlarged = clips[row, frame].repeat(factor, axis=0).repeat(factor, axis=1)
            sheet.paste(image.fromarray(np.ascontiguousarray(enlarged), "RGB"), (x, y))
            if frame == 0:
                caption = _fitted(captions[row], font, tile_w - 2)
                draw.text((x + 1, y + tile_h), caption, fill=(230, 230, 230), font=font)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        sheet.save(temporary, format="PNG")
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return target, scale
