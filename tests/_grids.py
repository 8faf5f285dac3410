"""Reading a preview grid back (`dew.tracking._grid`): where each cell, caption and line name
must be, from the documented layout rule and the inputs alone, and what each must hold,
computed here with NumPy (`repeat`: nearest neighbour) and Pillow (the captions drawn again
in the default bitmap font). The tracker tests decode what each tracker stored and check it
with `check_png_grid` / `check_gif_grid`."""

import io
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from dew.tracking._grid import BACKGROUND, CELL, COLUMNS, GAP, HEADER_PAD, LINE_HEIGHT, TEXT

FONT = ImageFont.load_default_imagefont()


def uint8(values) -> np.ndarray:
    """Values in [0, 1] as 8-bit pixels, rounded to nearest (NaN as 0)."""
    array = np.nan_to_num(np.asarray(values, np.float64), nan=0.0)
    return np.clip(np.rint(array * 255), 0, 255).astype(np.uint8)


def rgb(pixels: np.ndarray) -> np.ndarray:
    """uint8 `(..., channels)` as the grid shows it: grey repeated, alpha dropped."""
    colour = pixels[..., :3] if pixels.shape[-1] in (3, 4) else pixels[..., :1]
    return np.broadcast_to(colour, (*colour.shape[:-1], 3))


def gif_colours(pixels: np.ndarray) -> np.ndarray:
    """RGB as the preview GIF's fixed palette shows it: 8 levels of red and green, 4 of
    blue, each channel's level the value's bin (`value * levels // 256`)."""
    levels = np.array([8, 8, 4])
    bins = (pixels.astype(np.int64) * levels) // 256
    return np.rint(bins * 255 / (levels - 1)).astype(np.uint8)


def _band(text, size: tuple[int, int], at: tuple[int, int]) -> np.ndarray:
    """A strip of background with `text` (a string, or lines under one another) at `at`."""
    band = Image.new("RGB", size, BACKGROUND)
    draw = ImageDraw.Draw(band)
    for number, line in enumerate([text] if isinstance(text, str) else text):
        draw.text((at[0], at[1] + number * LINE_HEIGHT), line, TEXT, font=FONT)
    return np.asarray(band)


def check_grid(picture, lines, captions, *, colours=lambda pixels: pixels):
    """Check one frame of a grid, `picture` uint8 `(height, width, 3)`.

    - `lines`: `(name, samples)`, samples uint8 `(rows, height, width, channels)`, the
      generated line first; every line's samples the same size.
    - `captions`: the caption of each column, a string or its lines, or `None`.
    - `colours`: how the file shows an RGB value (`gif_colours` for a GIF).
    """
    height, width = lines[0][1].shape[1:3]
    factor = max(1, math.ceil(CELL / max(height, width)))
    cell_h, cell_w = height * factor, width * factor
    header = max(int(FONT.getlength(name)) for name, _ in lines) + 2 * HEADER_PAD
    most = max((1 if isinstance(text, str) else len(text) for text in captions or ()), default=0)
    caption_h = most * LINE_HEIGHT + 2 if most else 0
    rows = len(lines[0][1])
    columns = min(COLUMNS, rows)
    bands = math.ceil(rows / columns)
    line_h = cell_h + caption_h + GAP
    assert picture.shape == (
        GAP + bands * len(lines) * line_h,
        GAP + header + columns * (cell_w + GAP),
        3,
    )
    for band in range(bands):
        for number, (name, samples) in enumerate(lines):
            top = GAP + (band * len(lines) + number) * line_h
            named = _band(name, (GAP + header, cell_h), (HEADER_PAD, (cell_h - LINE_HEIGHT) // 2))
            np.testing.assert_array_equal(picture[top : top + cell_h, : GAP + header], named)
            for column in range(columns):
                row = band * columns + column
                if row >= rows:
                    continue
                left = GAP + header + column * (cell_w + GAP)
                cell = picture[top : top + cell_h, left : left + cell_w]
                expected = rgb(samples[row]).repeat(factor, axis=0).repeat(factor, axis=1)
                np.testing.assert_array_equal(cell, colours(expected), err_msg=f"{name} {row}")
                if captions:
                    below = picture[top + cell_h : top + cell_h + caption_h, left : left + cell_w]
                    drawn = _band(captions[row], (cell_w, caption_h), (1, 1))
                    np.testing.assert_array_equal(below, drawn, err_msg=f"caption {row}")


def check_png_grid(content: bytes, lines, captions) -> np.ndarray:
    """Decode a grid PNG with Pillow and check it (`check_grid`); return its pixels."""
    image = Image.open(io.BytesIO(content))
    assert (image.format, image.mode) == ("PNG", "RGB")
    pixels = np.asarray(image)
    check_grid(pixels, lines, captions)
    return pixels


def check_gif_grid(content: bytes, lines, captions) -> int:
    """Decode an animated grid GIF with Pillow and check every frame: frame `f` holds frame
    `f` of every clip (`lines`' samples are `(rows, frames, height, width, channels)`).
    Returns the frame count."""
    gif = Image.open(io.BytesIO(content))
    frames = lines[0][1].shape[1]
    assert (gif.format, gif.n_frames, gif.info["loop"]) == ("GIF", frames, 0)
    for frame in range(frames):
        gif.seek(frame)
        shown = [(name, clips[:, frame]) for name, clips in lines]
        check_grid(np.asarray(gif.convert("RGB")), shown, captions, colours=gif_colours)
    return gif.n_frames
