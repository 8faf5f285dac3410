"""`dew.data.image_folder`: a folder with one sub-folder of images per class (the convention
torchvision's `ImageFolder` and Keras's `image_dataset_from_directory` read), decoded once into
a cache, as step-indexed rows of `{"images", "labels"}`."""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from dew._integers import check_integer
from dew.data._dataset import Dataset
from dew.data._image_cache import image_cache
from dew.data._indexed import check_fraction, fingerprint_of, indexed_dataset

__all__ = ["IMAGE_EXTENSIONS", "ImageRows", "find_images", "image_folder", "image_folder_entry"]

IMAGE_EXTENSIONS = (
    ".bmp",
    ".gif",
    ".jpeg",
    ".jpg",
    ".pgm",
    ".png",
    ".ppm",
    ".tif",
    ".tiff",
    ".webp",
)
"""The file name endings `image_folder` reads (any case): torchvision's `IMG_EXTENSIONS` and
Keras's `.gif`. Other files (a README, a `.csv`) are left out."""

_OWNER = "image_folder"


@dataclasses.dataclass(frozen=True, eq=False)
class ImageRows:
    """`Rows` of decoded images: `read(indices)` is `{"images": float32 (rows, height, width,
    channels) in [0, 1] (the cached uint8 / 255), "labels": int32 (rows,)}`."""

    images: np.ndarray
    labels: np.ndarray
    fingerprint: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def read(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        indices = np.asarray(indices, np.int64).reshape(-1)
        pixels = np.asarray(self.images[indices], np.float32)
        return {"images": pixels / np.float32(255), "labels": self.labels[indices]}


def _visible(name: str) -> bool:
    return not name.startswith(".")


def _class_names(
    root: pathlib.Path, path: str | os.PathLike[str], classes: Sequence[str] | None
) -> list[str]:
    shown = repr(os.fspath(path))
    found = sorted(
        entry.name for entry in os.scandir(root) if entry.is_dir() and _visible(entry.name)
    )
    if classes is None:
        if not found:
            raise ValueError(
                f"{_OWNER}: {shown} has no class folders; put each class's images in a "
                f"sub-folder named after it ({os.path.join(os.fspath(path), 'cat', '1.png')!r}, "
                "...)."
            )
        chosen = found
    else:
        missing = [name for name in classes if name not in found]
        if missing:
            listed = ", ".join(repr(name) for name in found) or "none"
            raise ValueError(
                f"{_OWNER}: classes names {missing[0]!r}, but {shown} has no such folder "
                f"(its class folders: {listed})."
            )
        chosen = list(classes)
    if len(chosen) < 2:
        raise ValueError(
            f"{_OWNER}: {shown} has one class folder ({chosen[0]!r}); a classifier needs two "
            "or more: put each class's images in a folder of its own."
        )
    return chosen


def find_images(
    path: str | os.PathLike[str], classes: Sequence[str] | None = None
) -> tuple[list[pathlib.Path], np.ndarray, tuple[str, ...]]:
    """`(files, labels, classes)` of an image folder: the class folders (`classes`, or every
    sub-folder in sorted order; names starting with `.` left out), and under each, at any
    depth, the files with an image ending (`IMAGE_EXTENSIONS`, any case), labelled by their
    class folder's place; a folder's files (sorted by name) come before its sub-folders'
    (each in turn, sorted by name).

    **Raises:** `FileNotFoundError` for a missing folder; `NotADirectoryError` for a file;
    `ValueError` for a folder with no or one class folder, a class folder with no image, or
    a class that names no folder.
    """
    shown = repr(os.fspath(path))
    root = pathlib.Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"{_OWNER}: no folder at {shown}.")
    if not root.is_dir():
        raise NotADirectoryError(
            f"{_OWNER}: {shown} is a file; image_folder reads a folder with one sub-folder of "
            "images per class."
        )
    names = _class_names(root, path, classes)
    files: list[pathlib.Path] = []
    labels: list[np.ndarray] = []
    for label, name in enumerate(names):
        found = []
        for folder, subfolders, entries in os.walk(root / name):
            subfolders[:] = sorted(entry for entry in subfolders if _visible(entry))
            found.extend(
                pathlib.Path(folder) / entry
                for entry in sorted(entries)
                if _visible(entry) and entry.lower().endswith(IMAGE_EXTENSIONS)
            )
        if not found:
            raise ValueError(
                f"{_OWNER}: the class folder {os.fspath(root / name)!r} holds no image (files "
                f"ending {', '.join(IMAGE_EXTENSIONS)})."
            )
        files.extend(found)
        labels.append(np.full(len(found), label, np.int32))
    return files, np.concatenate(labels), tuple(names)


def _size(value: object) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        height, width = value
    else:
        height = width = value
    try:
        return (
            check_integer(f"{_OWNER}: size", height, minimum=1),
            check_integer(f"{_OWNER}: size", width, minimum=1),
        )
    except (TypeError, ValueError):
        raise ValueError(
            f"{_OWNER}: size must be a positive int (a square) or (height, width), got {value!r}."
        ) from None


def _classes(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if (
        isinstance(value, str)
        or not isinstance(value, Sequence)
        or not all(isinstance(name, str) and name for name in value)
    ):
        raise TypeError(f"{_OWNER}: classes must be a list of class folder names, got {value!r}.")
    if len(set(value)) != len(value):
        repeated = next(name for name in value if list(value).count(name) > 1)
        raise ValueError(f"{_OWNER}: classes names {repeated!r} twice.")
    return tuple(value)


def image_folder(
    path: str | os.PathLike[str],
    *,
    size: int | Sequence[int] | None = None,
    batch: int,
    val_fraction: float = 0.0,
    seed: int = 0,
    classes: Sequence[str] | None = None,
    channels: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> Dataset:
    """Labelled images from a folder with one sub-folder per class, for a classifier:
    `{"images": float32 (rows, height, width, channels) in [0, 1], "labels": int32 (rows,)}`,
    label `i` the `i`-th class (`Dataset.classes` names them).

    ```text
    path/
      cat/ 001.png 002.jpg ...
      dog/ 001.png ...
    ```

    Every file is decoded once by Pillow into a memory-mapped cache of uint8 pixels that
    later calls read instead (decoding per batch is slower than a small model's step).
    Training batches are a function of the step (`dew.data.StepBatches`).

    **Arguments:**

    - `path`: the folder. Its sub-folders are the classes, in sorted order (names starting
      with `.` left out); under each, at any depth, every file ending in an image extension
      (`.png`, `.jpg`, `.jpeg`, `.bmp`, `.gif`, `.webp`, `.tif`, `.tiff`, `.ppm`, `.pgm`, any
      case) is one row: a folder's files sorted by name, then its sub-folders' in turn.
    - `size`: the images' size: an int (a square) or `(height, width)`; each image is resized
      to it with Pillow's bilinear filter (antialiased when it shrinks; the aspect ratio is
      not kept). `None`: every image must already have one size.
    - `batch`: the rows of one process's batch.
    - `val_fraction`: the share of images held out for validation (`ceil(val_fraction *
      rows)`), drawn from the decoded pixels' digest and `seed`.
    - `seed`: the hold-out's and the training order's seed.
    - `classes`: the class folders to read, in label order (default: every sub-folder).
    - `channels`: 1 (greyscale, Pillow's `L`), 3 (`RGB`) or 4 (`RGBA`). `None`: 1 when every
      image is greyscale (8- or 16-bit, with or without alpha), else 3; alpha is dropped
      unless `channels=4`. 16-bit greyscale is read at 8 bits.
    - `cache_dir`: the decoded images' cache folder; default `$DEW_CACHE_DIR`, else
      `~/.cache/dew/images` (`$XDG_CACHE_HOME` respected). A run configuration trained with
      `dew train` keeps it in the run folder (`<run>/data-cache`) unless it names one.
    - `progress`: a progress bar (images decoded) on stderr while the cache builds; `None`
      shows it where stderr is a terminal.

    **Raises:** in one line each, naming the value: `FileNotFoundError` for a missing folder;
    `NotADirectoryError` for a file; `ValueError` for a folder with fewer than two class
    folders, a class folder with no image, a file Pillow cannot read or decode, images of
    different sizes with no `size`, a 32-bit integer or float image, too few rows for the
    split or the batch; `ImportError` without Pillow (`pip install 'dew-ml[images]'`).

    ```python
    >>> import pathlib, tempfile
    >>> import numpy as np
    >>> from PIL import Image
    >>> from dew.data import Partition
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for label, name in enumerate(["dark", "light"]):
    ...     (folder / name).mkdir()
    ...     for number in range(4):
    ...         pixels = np.full((6, 6), 60 + 120 * label + number, np.uint8)
    ...         Image.fromarray(pixels).save(folder / name / f"{number}.png")
    >>> data = image_folder(folder, size=4, batch=2, val_fraction=0.25,
    ...                     cache_dir=folder / ".cache")
    >>> batch = data.train.batch_at(0, Partition())
    >>> batch["images"].shape, batch["images"].dtype.name, data.classes, data.records
    ((2, 4, 4, 1), 'float32', ('dark', 'light'), 6)

    ```
    """
    batch = check_integer(f"{_OWNER}: batch", batch, minimum=1)
    seed = check_integer(f"{_OWNER}: seed", seed, minimum=0)
    val_fraction = check_fraction(_OWNER, val_fraction)
    chosen_size = _size(size)
    if channels is not None and (isinstance(channels, bool) or channels not in (1, 3, 4)):
        raise ValueError(f"{_OWNER}: channels must be 1, 3, 4 or None, got {channels!r}.")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"{_OWNER}: progress must be None, True or False, got {progress!r}.")
    files, labels, names = find_images(path, _classes(classes))
    cache = image_cache(
        _OWNER,
        files,
        labels,
        names,
        size=chosen_size,
        channels=channels,
        cache_dir=cache_dir,
        progress=progress,
    )
    rows = ImageRows(cache.images, cache.labels, fingerprint_of("image_folder", cache.content))
    held = math.ceil(val_fraction * len(rows)) if val_fraction > 0 else 0  # as hold_out
    if len(rows) - held < batch:
        raise ValueError(
            f"{_OWNER}: batch={batch} is more than the {len(rows) - held} training image(s) "
            f"({len(rows)} in {os.fspath(path)!r}, {held} held out by "
            f"val_fraction={val_fraction}); lower batch or val_fraction, or add images."
        )
    data = indexed_dataset(rows, batch=batch, seed=seed, val_fraction=val_fraction)
    return dataclasses.replace(data, classes=names)


def image_folder_entry(
    *,
    path: str,
    size: int | Sequence[int] | None = None,
    val_fraction: float = 0.0,
    classes: Sequence[str] | None = None,
    channels: int | None = None,
    cache_dir: str | None = None,
    batch_size: int,
    seed: int,
) -> Dataset:
    """`image_folder` as the dataset registry names it (`[data] name = "image_folder"`):
    `batch_size` and `seed` come from the trainer, the rest from the configuration, e.g.

    ```toml
    [data]
    name = "image_folder"

    [data.kwargs]
    path = "flowers"            # flowers/daisy/*.jpg, flowers/rose/*.jpg, ...
    size = [64, 64]             # or 64
    val_fraction = 0.1
    classes = ["daisy", "rose"] # optional: the folders to read, in label order
    ```
    """
    return image_folder(
        path,
        size=size,
        batch=batch_size,
        val_fraction=val_fraction,
        seed=seed,
        classes=classes,
        channels=channels,
        cache_dir=cache_dir,
    )
