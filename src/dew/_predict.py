"""Class predictions of a trained classifier run (`dew predict`): its input rows read from
`.npy` / `.npz` files or image files, checked against the rows the run trained on, and scored
in batches of one fixed shape, so the model compiles once."""

import os
import pathlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from dew._integers import check_integer
from dew.config._load import LoadedRun, example_batch
from dew.objectives.classifier import ClassifierObjective

__all__ = ["Predictions", "classifier_of", "input_rows", "predict_classes", "read_rows"]

_OWNER = "dew predict"


class Predictions(NamedTuple):
    """The `top_k` classes of each row, most probable first (`classes`: int64 `(rows, k)`)
    and their softmax probabilities (`probabilities`: float32 `(rows, k)`)."""

    classes: np.ndarray
    probabilities: np.ndarray


def classifier_of(loaded: LoadedRun) -> ClassifierObjective:
    """The loaded run's `ClassifierObjective`; any other objective is a `ValueError`."""
    objective = loaded.objective
    if not isinstance(objective, ClassifierObjective):
        raise ValueError(
            f"{loaded.folder} trained a {objective.name!r} objective "
            f"({type(objective).__name__}); dew predict scores classifier runs "
            "(ClassifierObjective)."
        )
    return objective


def input_rows(loaded: LoadedRun) -> tuple[tuple[int, ...], np.dtype]:
    """The shape (without the row axis) and dtype of the rows the run's classifier reads:
    from its `data.json`, else from one batch of its data."""
    key = classifier_of(loaded).inputs
    fields = dict(loaded.fields)
    if key not in fields:  # a run trained before runs recorded their data
        value = np.asarray(example_batch(loaded)[1][key])
        fields[key] = (tuple(value.shape[1:]), value.dtype.name)
    shape, dtype = fields[key]
    return tuple(shape), np.dtype(dtype)


def _checked(rows: Any, source: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`rows` (a row axis, then `shape`) cast to `dtype`; other shapes, and a kind of number
    the model does not read (integers for float rows), are one `ValueError` naming `source`."""
    rows = np.asarray(rows)
    expected = f"rows of shape {shape} ({dtype.name})"
    if rows.ndim == len(shape) and tuple(rows.shape) == shape:
        rows = rows[None]  # one row on its own
    if rows.ndim != len(shape) + 1 or tuple(rows.shape[1:]) != shape:
        given = rows.shape[1:] if rows.ndim == len(shape) + 1 else rows.shape
        raise ValueError(
            f"{source}: a row has shape {tuple(given)}, but the run's model reads {expected}."
        )
    same_kind = (rows.dtype.kind == "f") == (dtype.kind == "f") and rows.dtype.kind in "fiub"
    if not same_kind:
        raise ValueError(
            f"{source}: the rows are {rows.dtype.name}, but the run's model reads {expected}."
        )
    return rows.astype(dtype)


def read_rows(
    path: str | os.PathLike[str], key: str, shape: tuple[int, ...], dtype: np.dtype
) -> tuple[list[str], np.ndarray]:
    """The rows at `path` and a name for each: a `.npy` array (names: row numbers), a `.npz`
    archive's array under `key` (the batch key the classifier reads), an image file, or a
    folder of image files at any depth (names: their paths under the folder), decoded as
    `dew.data.image_folder` decodes (Pillow, resized to the rows' height and width,
    `/ 255`).

    **Raises:** `FileNotFoundError` for a missing path; `ValueError` naming the file for a
    row of another shape or kind of number than `shape` and `dtype`, a `.npz` without
    `key`, a file of another kind, or a folder without images.
    """
    from dew.data._image_folder import IMAGE_EXTENSIONS

    found = pathlib.Path(path)
    shown = os.fspath(path)
    if not found.exists():
        raise FileNotFoundError(f"{_OWNER}: no file or folder at {shown!r}.")
    if found.is_dir():
        files = sorted(
            entry
            for entry in found.rglob("*")
            if entry.is_file()
            and entry.name.lower().endswith(IMAGE_EXTENSIONS)
            and not any(part.startswith(".") for part in entry.relative_to(found).parts)
        )
        if not files:
            raise ValueError(
                f"{_OWNER}: the folder {shown!r} holds no image (files ending "
                f"{', '.join(IMAGE_EXTENSIONS)})."
            )
        names = [entry.relative_to(found).as_posix() for entry in files]
        return names, _images(files, shape, dtype, shown)
    suffix = found.suffix.lower()
    if suffix == ".npy":
        rows = _checked(np.load(found, allow_pickle=False), shown, shape, dtype)
    elif suffix == ".npz":
        with np.load(found, allow_pickle=False) as archive:
            if key not in archive.files:
                raise ValueError(
                    f"{_OWNER}: {shown!r} has no array {key!r} (the batch key the run's "
                    f"classifier reads); it holds {', '.join(archive.files) or 'none'}."
                )
            rows = _checked(archive[key], f"{shown}[{key!r}]", shape, dtype)
    elif suffix in IMAGE_EXTENSIONS:
        return [found.name], _images([found], shape, dtype, shown)
    else:
        raise ValueError(
            f"{_OWNER}: --input {shown!r} is neither a .npy or .npz file, an image file "
            f"({', '.join(IMAGE_EXTENSIONS)}) nor a folder of images."
        )
    return [str(row) for row in range(len(rows))], rows


def _images(
    files: list[pathlib.Path], shape: tuple[int, ...], dtype: np.dtype, source: str
) -> np.ndarray:
    """Image files as rows of `shape` (height, width, channels), floats in [0, 1]."""
    from dew.data._image_cache import decode_image

    if len(shape) != 3 or shape[-1] not in (1, 3, 4) or dtype.kind != "f":
        raise ValueError(
            f"{_OWNER}: {source!r} holds images, but the run's model reads rows of shape "
            f"{shape} ({dtype.name}), not images (height, width, channels in 1, 3 or 4)."
        )
    decoded = [decode_image(_OWNER, file, shape[-1], shape[:2]) for file in files]
    return (np.stack(decoded).astype(np.float32) / np.float32(255)).astype(dtype)


@eqx.filter_jit
def _ranked(model: Any, rows: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Every class of each row of a batch, most probable first, and its softmax probability
    (cut to the top k on the host, so one compiled function serves every `--top-k`)."""
    logits = jnp.asarray(jax.vmap(model)(rows), jnp.float32)
    probabilities = jax.nn.softmax(logits, axis=-1)
    values, classes = jax.lax.top_k(probabilities, probabilities.shape[-1])
    return classes, values


def predict_classes(
    loaded: LoadedRun, rows: np.ndarray, *, top_k: int = 1, batch_size: int = 64
) -> Predictions:
    """The `top_k` classes of each of `rows` under the loaded classifier, and their softmax
    probabilities, scored `batch_size` rows at a time in batches of one shape (the last one
    padded with zeros, its padding dropped), so the model compiles once.

    **Raises:** `ValueError` for a run that is not a classifier, or a `top_k` outside
    `[1, classes]` or `batch_size` below 1.
    """
    objective = classifier_of(loaded)
    top_k = check_integer("--top-k", top_k, minimum=1)
    if top_k > objective.classes:
        raise ValueError(f"--top-k {top_k} is more than the run's {objective.classes} classes.")
    batch_size = check_integer("--batch-size", batch_size, minimum=1)
    classes, probabilities = [], []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        count = len(batch)
        if count < batch_size:
            padding = np.zeros((batch_size - count, *batch.shape[1:]), batch.dtype)
            batch = np.concatenate([batch, padding])
        found, values = jax.device_get(_ranked(loaded.model, batch))
        classes.append(np.asarray(found[:count, :top_k], np.int64))
        probabilities.append(np.asarray(values[:count, :top_k], np.float32))
    if not classes:
        empty = np.zeros((0, top_k))
        return Predictions(empty.astype(np.int64), empty.astype(np.float32))
    return Predictions(np.concatenate(classes), np.concatenate(probabilities))


def prediction_rows(
    names: list[str], predictions: Predictions, classes: tuple[str, ...] | None
) -> list[Mapping[str, Any]]:
    """One record per row: its name, its classes (by name where the run recorded them,
    else their indices), their indices and their probabilities."""
    records = []
    for name, found, values in zip(names, *predictions, strict=True):
        labels = [int(index) for index in found]
        shown = [classes[index] for index in labels] if classes else labels
        records.append(
            {
                "row": name,
                "classes": shown,
                "labels": labels,
                "probabilities": [float(value) for value in values],
            }
        )
    return records
