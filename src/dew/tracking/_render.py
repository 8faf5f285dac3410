"""The encoders previews render with: 8-bit pixels, PNG images, animated GIF clips and
the histogram of representations' spread.

The grids they encode are laid out, and captioned with Pillow's bitmap font, by
`dew.tracking._grid`; Pillow encodes them too (decision 0070), so every tracker shows the very
same bytes (`dew.tracking._preview`). Pillow is imported on the first encoding, never when
dew is.
"""

import io
from typing import Any

import numpy as np

from dew.tracking._grid import pillow

__all__ = [
    "gif_bytes",
    "histogram",
    "png_bytes",
    "to_uint8",
]


def to_uint8(pixels: Any, data_range: float = 1.0) -> np.ndarray:
    """Scale values in `[0, data_range]` to uint8 (clipping; NaN becomes 0)."""
    array = np.asarray(pixels, np.float64)
    array = np.nan_to_num(array / data_range, nan=0.0, posinf=1.0, neginf=0.0)
    return np.clip(np.rint(array * 255.0), 0, 255).astype(np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    """Encode an `(height, width)` or `(height, width, 1|2|3|4)` uint8 image as PNG:
    grey, grey and alpha, RGB or RGBA (Pillow's encoder, zlib level 6)."""
    image = np.asarray(image, np.uint8)
    if image.ndim == 2:
        image = image[..., None]
    channels = image.shape[-1]
    if image.ndim != 3 or channels not in (1, 2, 3, 4):
        raise ValueError(
            f"a PNG needs 1 (grey), 2 (grey and alpha), 3 (RGB) or 4 (RGBA) channels, got "
            f"{channels}."
        )
    out = io.BytesIO()
    pixels = image[..., 0] if channels == 1 else image
    pillow()[0].fromarray(np.ascontiguousarray(pixels)).save(out, "PNG", compress_level=6)
    return out.getvalue()


def _palette_indices(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map uint8 RGB or gray frames onto a fixed 256-colour palette: the indices and the
    palette's `(256, 3)` colours."""
    if frames.shape[-1] == 1:
        palette = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
        return frames[..., 0], palette
    # 8 red x 8 green x 4 blue levels: a fixed palette keeps the encoding exact for
    # the quantised colours and costs no search.
    red = (frames[..., 0].astype(np.uint16) * 8) // 256
    green = (frames[..., 1].astype(np.uint16) * 8) // 256
    blue = (frames[..., 2].astype(np.uint16) * 4) // 256
    indices = (red * 32 + green * 4 + blue).astype(np.uint8)
    levels_rg = np.rint(np.arange(8) * 255 / 7).astype(np.uint8)
    levels_b = np.rint(np.arange(4) * 255 / 3).astype(np.uint8)
    palette = np.array(
        [
            (levels_rg[r], levels_rg[g], levels_b[b])
            for r in range(8)
            for g in range(8)
            for b in range(4)
        ],
        np.uint8,
    )
    return indices, palette


def gif_bytes(frames: np.ndarray, frame_ms: int = 100) -> bytes:
    """Encode `(frames, height, width, 1|2|3|4)` uint8 frames as a looping animated GIF
    (Pillow's encoder), each frame shown `frame_ms` milliseconds.

    Colours are mapped onto a fixed palette: grey frames keep every grey exactly, colour
    frames show each channel's level among 8 of red and green and 4 of blue (`value *
    levels // 256`). A GIF has no partial transparency, so an alpha channel (the second of
    two, the fourth of four) is dropped: grey and alpha frames show their grey, RGBA frames
    their RGB. Pillow writes a run of identical frames as one frame shown for their summed
    time, so a clip that stands still is one frame long.
    """
    frames = np.asarray(frames, np.uint8)
    if frames.ndim != 4 or frames.shape[-1] not in (1, 2, 3, 4) or not len(frames):
        raise ValueError(
            f"a GIF needs frames shaped (frames, height, width, channels), at least one frame, "
            f"with 1 (grey), 2 (grey and alpha), 3 (RGB) or 4 (RGBA) channels, got "
            f"{frames.shape}."
        )
    if frames.shape[-1] in (2, 4):
        frames = frames[..., :-1]
    indices, palette = _palette_indices(frames)
    image_module = pillow()[0]
    images = []
    for frame in indices:
        image = image_module.fromarray(np.ascontiguousarray(frame))
        image.putpalette(palette.tobytes())  # an "L" image becomes a "P" one
        images.append(image)
    out = io.BytesIO()
    images[0].save(
        out,
        "GIF",
        save_all=True,
        append_images=images[1:],
        duration=max(10, frame_ms),
        loop=0,
    )
    return out.getvalue()


def histogram(features: Any, bins: int = 30) -> dict[str, Any]:
    """The histogram of per-dimension spread (standard deviation over rows).

    Dimensions whose spread is not finite (NaN features) are counted in
    `non_finite` and left out of the bins.
    """
    spread = np.std(np.asarray(features, np.float64), axis=0)
    finite = spread[np.isfinite(spread)]
    counts, edges = np.histogram(finite, bins=bins, range=None if finite.size else (0.0, 1.0))
    return {
        "quantity": "per-dimension standard deviation",
        "dimensions": int(spread.shape[0]),
        "counts": counts.tolist(),
        "edges": edges.tolist(),
        "non_finite": int(spread.size - finite.size),
        "spread": [float(value) if np.isfinite(value) else str(value) for value in spread],
    }
