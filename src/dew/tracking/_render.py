"""The encoders previews render with: 8-bit pixels, PNG images, animated GIF clips and
the histogram of representations' spread.

They need only NumPy and the standard library (the grids they encode are laid out, and
captioned with Pillow's bitmap font, by `dew.tracking._grid`), so the bytes are dew's own,
and every tracker shows the very same bytes (`dew.tracking._preview`).
"""

import struct
import zlib
from typing import Any

import numpy as np

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


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


# PNG colour types by channels: grey, grey and alpha, RGB, RGBA.
_PNG_COLOUR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}


def png_bytes(image: np.ndarray) -> bytes:
    """Encode an `(height, width)` or `(height, width, 1|2|3|4)` uint8 image as PNG:
    grey, grey and alpha, RGB or RGBA."""
    image = np.asarray(image, np.uint8)
    if image.ndim == 2:
        image = image[..., None]
    height, width, channels = image.shape
    colour_type = _PNG_COLOUR_TYPES.get(channels)
    if colour_type is None:
        raise ValueError(
            f"a PNG needs 1 (grey), 2 (grey and alpha), 3 (RGB) or 4 (RGBA) channels, got "
            f"{channels}."
        )
    raw = b"".join(b"\x00" + image[row].tobytes() for row in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 6))
        + _chunk(b"IEND", b"")
    )


def _palette_indices(frames: np.ndarray) -> tuple[np.ndarray, bytes]:
    """Map uint8 RGB or gray frames onto a fixed 256-colour palette."""
    if frames.shape[-1] == 1:
        palette = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
        return frames[..., 0], palette.tobytes()
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
    return indices, palette.tobytes()


def _lzw(indices: np.ndarray, min_code_size: int = 8) -> bytes:
    """GIF's variable-width LZW compression of a frame's palette indices."""
    clear, end = 1 << min_code_size, (1 << min_code_size) + 1
    codes: dict[bytes, int] = {bytes([i]): i for i in range(clear)}
    next_code, width = end + 1, min_code_size + 1
    bits, bit_count, out = 0, 0, bytearray()

    def emit(code: int) -> None:
        nonlocal bits, bit_count
        bits |= code << bit_count
        bit_count += width
        while bit_count >= 8:
            out.append(bits & 0xFF)
            bits >>= 8
            bit_count -= 8

    emit(clear)
    data = indices.tobytes()
    current = data[:1]
    for value in data[1:]:
        candidate = current + bytes([value])
        if candidate in codes:
            current = candidate
            continue
        emit(codes[current])
        if next_code < 4096:
            codes[candidate] = next_code
            next_code += 1
            if next_code > (1 << width) and width < 12:
                width += 1
        else:
            emit(clear)
            codes = {bytes([i]): i for i in range(clear)}
            next_code, width = end + 1, min_code_size + 1
        current = bytes([value])
    if current:
        emit(codes[current])
    emit(end)
    if bit_count:
        out.append(bits & 0xFF)
    return bytes(out)


def gif_bytes(frames: np.ndarray, frame_ms: int = 100) -> bytes:
    """Encode `(frames, height, width, 1|2|3|4)` uint8 frames as a looping animated GIF.

    A GIF has no partial transparency, so an alpha channel (the second of two, the
    fourth of four) is dropped: grey and alpha frames show their grey, RGBA frames
    their RGB.
    """
    frames = np.asarray(frames, np.uint8)
    if frames.ndim != 4 or frames.shape[-1] not in (1, 2, 3, 4):
        raise ValueError(
            f"a GIF needs frames shaped (frames, height, width, channels) with 1 (grey), 2 "
            f"(grey and alpha), 3 (RGB) or 4 (RGBA) channels, got {frames.shape}."
        )
    if frames.shape[-1] in (2, 4):
        frames = frames[..., :-1]
    _, height, width, _ = frames.shape
    indices, palette = _palette_indices(frames)
    out = bytearray(b"GIF89a")
    out += struct.pack("<HHBBB", width, height, 0xF7, 0, 0)  # global 256-colour table
    out += palette
    out += b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"  # loop forever
    for frame in indices:
        out += struct.pack("<BBBBHB", 0x21, 0xF9, 4, 0, max(1, frame_ms // 10), 0) + b"\x00"
        out += struct.pack("<BHHHHB", 0x2C, 0, 0, width, height, 0)
        data = _lzw(frame)
        out += b"\x08"
        for start in range(0, len(data), 255):
            block = data[start : start + 255]
            out += bytes([len(block)]) + block
        out += b"\x00"
    out += b"\x3b"
    return bytes(out)


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
