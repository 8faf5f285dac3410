"""Decode once: an image folder's images decoded by Pillow, converted, resized and stored as
uint8 in a memory-mapped cache keyed by the files, the classes and the decoding settings.

A cache is a folder `images-<key>` under the cache folder (`dew.data._cache_folder`: built
under a temporary name, fsynced and renamed, so a build that dies midway leaves no cache that
is read), holding

- `images.npy`: uint8 `(rows, height, width, channels)`, row `i` the `i`-th file;
- `labels.npy`: int32 `(rows,)`, each file's class index;
- `cache.json`: the key, the shape, the classes, the counts and `content`, a digest of the
  pixels, the labels and the class names (what the rows' fingerprint is: touching or moving
  the folder rebuilds the cache but keeps the split and the batch order).

The key is a digest of each file's resolved path, size and modification time, its label, the
class names, the size asked for and the channels asked for: a changed, added or removed file
builds a new cache.

Decoding is the cost a cache saves: measured on 32x32 PNGs (2 shared CPU cores, load 7), Pillow
decodes and converts a batch of 64 at 104 batches/s, 0.9x `tiny_classifier`'s 115 steps/s,
while batches read from the cache come at 4,753 a second, 41x (`benchmarks/data.py --part
images`; decision 0037).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dew.data._cache_folder import cached_folder, default_cache_dir, fsync
from dew.data._optional import optional

__all__ = ["GREY_MODES", "ImageCache", "image_cache", "decode_image", "scan_images"]

FORMAT = 1
GREY_MODES = frozenset({"1", "L", "LA", "La", "I;16", "I;16L", "I;16B", "I;16N"})
"""Pillow's greyscale modes (alpha, where there is one, is dropped unless `channels=4`)."""
_UNREAD_MODES = {"I": "32-bit integer", "F": "32-bit float"}
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_CHUNK = 64  # images a thread decodes together
_THREADS = 16


def _pillow(owner: str) -> Any:
    return optional("PIL.Image", "images", owner)


@dataclasses.dataclass(frozen=True, eq=False)
class ImageCache:
    """A built cache: `images` (memory-mapped uint8, rows x height x width x channels),
    `labels` (int32), the `key` it was found by and the `content` digest of its rows."""

    path: pathlib.Path
    images: np.ndarray
    labels: np.ndarray
    key: str
    content: str
    built: bool


def scan_images(owner: str, files: Sequence[pathlib.Path]) -> list[tuple[str, tuple[int, int]]]:
    """Each file's Pillow mode and (height, width), read from its header (no decoding).

    **Raises:** `ValueError` naming a file Pillow cannot read, or one whose mode dew does not
    read (32-bit integer or float)."""
    image_module = _pillow(owner)
    found = []
    for path in files:
        try:
            with image_module.open(path) as image:
                mode, (width, height) = image.mode, image.size
        except Exception as error:  # Pillow raises many kinds for a file it cannot read
            raise ValueError(
                f"{owner}: Pillow cannot read {os.fspath(path)!r} ({_reason(error)})."
            ) from None
        if mode in _UNREAD_MODES:
            raise ValueError(
                f"{owner}: {os.fspath(path)!r} is a {_UNREAD_MODES[mode]} image (Pillow mode "
                f"{mode!r}), which has no fixed [0, 1] scale; save it as 8- or 16-bit."
            )
        found.append((mode, (height, width)))
    return found


def _reason(error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def decode_image(
    owner: str, path: pathlib.Path, channels: int, size: tuple[int, int] | None
) -> np.ndarray:
    """One file as uint8 `(height, width, channels)`: Pillow's decode, 16-bit greyscale
    scaled to 8 bits (`round(value / 257)`), converted to `L`, `RGB` or `RGBA` (Pillow's
    `convert`: alpha dropped, greyscale repeated), then resized to `size` (height, width)
    with Pillow's bilinear filter (antialiased when it shrinks) where it differs."""
    image_module = _pillow(owner)
    try:
        with image_module.open(path) as image:
            if image.mode.startswith("I;16"):
                values = np.asarray(image, np.float64)
                image = image_module.fromarray(np.round(values / 257).astype(np.uint8), "L")
            converted = image.convert(_MODES[channels])
        if size is not None and converted.size != (size[1], size[0]):
            converted = converted.resize((size[1], size[0]), image_module.Resampling.BILINEAR)
        array = np.asarray(converted, np.uint8)
    except Exception as error:  # a truncated or damaged file fails here, not in the header
        raise ValueError(
            f"{owner}: Pillow cannot decode {os.fspath(path)!r} ({_reason(error)})."
        ) from None
    return array[..., None] if channels == 1 else array


def _key(
    files: Sequence[pathlib.Path],
    labels: np.ndarray,
    classes: Sequence[str],
    size: tuple[int, int] | None,
    channels: int | None,
) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((FORMAT, tuple(classes), size, channels)).encode())
    for path, label in zip(files, labels.tolist(), strict=True):
        status = path.stat()
        digest.update(repr((str(path.resolve()), status.st_size, status.st_mtime_ns)).encode())
        digest.update(repr(label).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def _load(folder: pathlib.Path, key: str) -> ImageCache | None:
    """The cache in `folder`, or `None` where it is absent or not whole."""
    try:
        meta = json.loads((folder / "cache.json").read_text())
        if meta.get("format") != FORMAT or meta.get("key") != key:
            return None
        images = np.load(folder / "images.npy", mmap_mode="r", allow_pickle=False)
        labels = np.load(folder / "labels.npy", allow_pickle=False)
        if list(images.shape) != meta["shape"] or images.dtype != np.uint8:
            return None
        if labels.shape != (images.shape[0],) or labels.dtype != np.int32:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ImageCache(folder, images, labels, key, str(meta["content"]), built=False)


def _decoded(
    owner: str, files: Sequence[pathlib.Path], channels: int, size: tuple[int, int] | None
) -> Iterator[np.ndarray]:
    """The files decoded, `_CHUNK` at a time, in order, by a thread pool (Pillow releases
    the GIL while it decodes and resizes) with at most two chunks a thread in flight."""

    def chunk(start: int) -> np.ndarray:
        return np.stack(
            [decode_image(owner, path, channels, size) for path in files[start : start + _CHUNK]]
        )

    workers = max(1, min(_THREADS, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        pending: collections.deque[concurrent.futures.Future[np.ndarray]] = collections.deque()
        starts = iter(range(0, len(files), _CHUNK))
        for start in itertools.islice(starts, 2 * workers):
            pending.append(pool.submit(chunk, start))
        while pending:
            decoded = pending.popleft().result()
            for start in itertools.islice(starts, 1):
                pending.append(pool.submit(chunk, start))
            yield decoded


def _write(
    owner: str,
    folder: pathlib.Path,
    files: Sequence[pathlib.Path],
    labels: np.ndarray,
    classes: Sequence[str],
    shape: tuple[int, int, int],
    key: str,
    show: bool,
) -> None:
    height, width, channels = shape
    images = np.lib.format.open_memmap(
        folder / "images.npy", mode="w+", dtype=np.uint8, shape=(len(files), *shape)
    )
    content = hashlib.blake2b(digest_size=16)
    content.update(repr((tuple(classes), shape)).encode())
    bar = tqdm(
        total=len(files),
        unit="img",
        desc=f"decoding {len(files)} image{'s' * (len(files) != 1)}",
        disable=not show,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    with bar:
        start = 0
        for chunk in _decoded(owner, files, channels, (height, width)):
            images[start : start + len(chunk)] = chunk
            content.update(chunk.data)
            start += len(chunk)
            bar.update(len(chunk))
    images.flush()
    del images
    content.update(labels.tobytes())
    np.save(folder / "labels.npy", labels)
    counts = np.bincount(labels, minlength=len(classes)).tolist()
    meta = {
        "format": FORMAT,
        "key": key,
        "content": content.hexdigest(),
        "shape": [len(files), height, width, channels],
        "classes": list(classes),
        "counts": dict(zip(classes, counts, strict=True)),
    }
    (folder / "cache.json").write_text(json.dumps(meta, indent=1) + "\n")
    for name in ("images.npy", "labels.npy", "cache.json"):
        fsync(folder / name)


def _shape(
    owner: str,
    files: Sequence[pathlib.Path],
    size: tuple[int, int] | None,
    channels: int | None,
) -> tuple[int, int, int]:
    """(height, width, channels) of the cache: `size`, or the files' one size; `channels`,
    or 1 where every file is greyscale and 3 otherwise."""
    found = scan_images(owner, files)
    if size is None:
        first = found[0][1]
        for path, (_, shape) in zip(files, found, strict=True):
            if shape != first:
                raise ValueError(
                    f"{owner}: the images differ in size ({os.fspath(files[0])!r} is "
                    f"{first[0]}x{first[1]}, {os.fspath(path)!r} is {shape[0]}x{shape[1]}, "
                    "height x width); pass size= (an int, or (height, width)) to resize every "
                    "image to one size."
                )
        size = first
    if channels is None:
        channels = 1 if all(mode in GREY_MODES for mode, _ in found) else 3
    return (size[0], size[1], channels)


def image_cache(
    owner: str,
    files: Sequence[pathlib.Path],
    labels: np.ndarray,
    classes: Sequence[str],
    *,
    size: tuple[int, int] | None,
    channels: int | None,
    cache_dir: str | os.PathLike[str] | None,
    progress: bool | None,
) -> ImageCache:
    """The decoded images of `files` (labelled `labels`, int32): read where a whole cache with
    the same key exists in `cache_dir` (default `default_cache_dir("images")`), else every
    file's header scanned (`scan_images`, for the size and the channels), every file decoded
    (`decode_image`) and the cache built (a progress bar on stderr when `progress`, or when
    `progress is None` and stderr is a terminal), then read."""
    cache_dir = default_cache_dir("images") if cache_dir is None else pathlib.Path(cache_dir)
    key = _key(files, labels, classes, size, channels)
    show = sys.stderr.isatty() if progress is None else bool(progress)

    def write(folder: pathlib.Path) -> None:
        shape = _shape(owner, files, size, channels)
        _write(owner, folder, files, labels, classes, shape, key, show)

    found, built = cached_folder(
        owner,
        cache_dir,
        f"images-{key}",
        load=lambda folder: _load(folder, key),
        write=write,
        what="image cache",
    )
    return dataclasses.replace(found, built=built)
