"""A classifier of dew's shape kinds (square, disc, bar), trained deterministically on drawn
shapes and cached: what `dew.metrics.shape_scores` reads a generated sample's kind with.

No weights are downloaded. The classifier is trained from a fixed recipe (`RECIPE`: the
drawn rows, the network's widths, the optimizer, the steps and every seed) on shapes drawn
as the `shapes` dataset draws them, but from a pool of its own (`data_seed`), and scored on a
held-out pool (`held_out_seed`) that neither it nor a `shapes` run trains on. The trained
weights are kept in one `.npz` file under the cache folder (`$DEW_CACHE_DIR`, else
`~/.cache/dew/metrics`), named by the SHA-256 of the recipe, so the first call trains it
(about 10 seconds of CPU) and every later one reads it (milliseconds). The file is written to
a temporary name and renamed, so a write that dies leaves nothing that is read; one that does
not read back whole (or was written by another recipe) is trained again and replaced.
"""

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import sys
import tempfile
import zipfile
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from dew._cache_dir import default_cache_dir
from dew._integers import check_integer
from dew._shape_drawing import MIN_IMAGE_SIZE, SHAPE_KINDS, draw_shapes, sample_shapes

__all__ = ["RECIPE", "ShapeClassifier", "ShapeClassifierRecipe", "shape_classifier"]

_FORMAT = "dew shape classifier 1"


@dataclasses.dataclass(frozen=True)
class ShapeClassifierRecipe:
    """How the shape classifier is trained: every number that decides its weights.

    - `widths`: the channels of its 3x3 convolutions (ReLU; the first keeps the image's
      size, each later one halves it), whose last feature map is pooled by mean and by max
      into the linear head's input.
    - `train_rows`, `data_seed`: the drawn shapes it learns from; `held_out_rows`,
      `held_out_seed`: those it is scored on. (`shapes` draws its pool with seed 0 and
      `moving_shapes` with seed 1, so both differ from a run's data.)
    - `steps`, `batch_size`, `learning_rate`: Adam on the cross entropy, the rate decayed
      by a cosine to zero; `batch_seed` draws each step's rows, `init_seed` the weights.
    - `noise`: each training image gets Gaussian noise of a standard deviation drawn
      uniformly from `[0, noise]` (clipped back to `[0, 1]`), so a sample's faint haze
      does not decide its kind.
    """

    widths: tuple[int, ...] = (12, 24, 24)
    train_rows: int = 4096
    data_seed: int = 2
    held_out_rows: int = 2048
    held_out_seed: int = 3
    steps: int = 300
    batch_size: int = 128
    learning_rate: float = 3e-3
    noise: float = 0.2
    batch_seed: int = 4
    init_seed: int = 5

    def digest(self, image_size: int) -> str:
        """The SHA-256 of this recipe at `image_size`: the cached weights' name."""
        described = {"format": _FORMAT, "image_size": image_size, **dataclasses.asdict(self)}
        return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


RECIPE = ShapeClassifierRecipe()
"""The recipe `shape_classifier` trains with."""


class ShapeClassifier(eqx.Module):
    """A small convolutional classifier of the shape kinds (`SHAPE_KINDS`: square 0, disc 1,
    bar 2): images `(rows, image_size, image_size, 3)` in `[0, 1]` to logits `(rows, 3)`.

    `held_out_accuracy` is its accuracy on the recipe's held-out drawn shapes (`None` for
    an untrained one), and `recipe_sha256` the digest of the recipe it was trained with.
    """

    convs: tuple[eqx.nn.Conv2d, ...]
    head: eqx.nn.Linear
    image_size: int = eqx.field(static=True)
    held_out_accuracy: float | None = eqx.field(static=True, default=None)
    recipe_sha256: str | None = eqx.field(static=True, default=None)

    @classmethod
    def fresh(
        cls, image_size: int, widths: tuple[int, ...] = RECIPE.widths, *, key: PRNGKeyArray
    ) -> "ShapeClassifier":
        """An untrained classifier of `image_size` images with convolutions of `widths`."""
        keys = jax.random.split(key, len(widths) + 1)
        channels = (3, *widths)
        convs = tuple(
            eqx.nn.Conv2d(cin, cout, 3, stride=1 if i == 0 else 2, padding=1, key=keys[i])
            for i, (cin, cout) in enumerate(itertools.pairwise(channels))
        )
        head = eqx.nn.Linear(2 * widths[-1], len(SHAPE_KINDS), key=keys[-1])
        return cls(convs, head, image_size)

    def __call__(
        self, images: Float[Array | np.ndarray, "rows height width 3"]
    ) -> Float[Array, "rows kinds"]:
        """The kinds' logits of each image (a JAX or NumPy array)."""
        return jax.vmap(self._logits)(jnp.asarray(images, jnp.float32))

    def _logits(self, image: Float[Array, "height width 3"]) -> Float[Array, " kinds"]:
        features = jnp.transpose(image, (2, 0, 1))
        for conv in self.convs:
            features = jax.nn.relu(conv(features))
        pooled = jnp.concatenate([features.mean((1, 2)), features.max((1, 2))])
        return self.head(pooled)


def drawn_shapes(
    rows: int, image_size: int, seed: int, frames: int = 1
) -> tuple[Float[np.ndarray, "rows ..."], Int[np.ndarray, " rows"]]:
    """`rows` shapes drawn as `shapes` (or, with `frames`, `moving_shapes`) draws them from
    a pool of seed `seed`: images `(rows, size, size, 3)` (clips `(rows, frames, size,
    size, 3)`) and their kinds."""
    pool = sample_shapes(rows, image_size, frames, seed)
    drawn = draw_shapes(pool, np.arange(rows), image_size, frames)
    return (drawn[:, 0] if frames == 1 else drawn), pool.labels


def train_shape_classifier(
    image_size: int = 16, recipe: ShapeClassifierRecipe = RECIPE
) -> ShapeClassifier:
    """Train a `ShapeClassifier` on `image_size` shapes with `recipe`, and score it on the
    recipe's held-out shapes (its `held_out_accuracy`). Deterministic: the same recipe gives
    the same weights on one machine (and the same accuracy to rounding elsewhere)."""
    images, labels = drawn_shapes(recipe.train_rows, image_size, recipe.data_seed)
    images, labels = jnp.asarray(images), jnp.asarray(labels)
    model = ShapeClassifier.fresh(image_size, recipe.widths, key=jax.random.key(recipe.init_seed))
    params, static = eqx.partition(model, eqx.is_array)
    optimizer = optax.adam(optax.cosine_decay_schedule(recipe.learning_rate, recipe.steps))

    @jax.jit
    def step(params: Any, state: Any, rows: Array, key: PRNGKeyArray) -> tuple[Any, Any]:
        batch = images[rows]
        spread, noise = jax.random.split(key)
        scale = recipe.noise * jax.random.uniform(spread, (rows.shape[0], 1, 1, 1))
        batch = jnp.clip(batch + scale * jax.random.normal(noise, batch.shape), 0.0, 1.0)

        def loss(params: Any) -> Array:
            logits = eqx.combine(params, static)(batch)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels[rows]).mean()

        grads = jax.grad(loss)(params)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes int32 counts and floats
            updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = optimizer.init(params)
    draws = np.random.default_rng(recipe.batch_seed)
    keys = jax.random.split(jax.random.key(recipe.batch_seed), recipe.steps)
    for index in range(recipe.steps):  # a jitted step a call: convolutions run slower in a scan
        rows = draws.integers(0, recipe.train_rows, recipe.batch_size)
        params, state = step(params, state, jnp.asarray(rows), keys[index])
    trained = eqx.combine(params, static)
    accuracy = held_out_accuracy(trained, recipe)
    return dataclasses.replace(
        trained, held_out_accuracy=accuracy, recipe_sha256=recipe.digest(image_size)
    )


def held_out_accuracy(
    classifier: ShapeClassifier, recipe: ShapeClassifierRecipe = RECIPE, *, frames: int = 1
) -> float:
    """The share of the recipe's held-out shapes (of `frames` frames: every frame of a
    `moving_shapes`-drawn clip counts once) that `classifier` names the kind of."""
    images, labels = drawn_shapes(
        recipe.held_out_rows, classifier.image_size, recipe.held_out_seed, frames
    )
    if frames > 1:
        labels = np.repeat(labels, frames)
        images = images.reshape(-1, *images.shape[2:])
    predicted = np.asarray(jnp.argmax(eqx.filter_jit(classifier)(images), axis=-1))
    return float(np.mean(predicted == labels))


def shape_classifier(
    image_size: int = 16, *, cache_dir: str | os.PathLike[str] | None = None
) -> ShapeClassifier:
    """The `ShapeClassifier` of `image_size` shapes trained with `RECIPE`: read from the
    cache folder where it was trained before, else trained (about 10 seconds of CPU at
    16x16) and written there; the training says so in one line on stderr when it is a
    terminal.

    **Arguments:**

    - `image_size`: the images' height and width, at least 12 (as the shapes datasets').
    - `cache_dir`: where the weights are kept; default `$DEW_CACHE_DIR`, else
      `$XDG_CACHE_HOME/dew/metrics`, else `~/.cache/dew/metrics`.

    **Raises:** `ValueError` for an `image_size` below 12; `OSError` naming the folder, before
    any training, when the weights are to be trained and it cannot be written.
    """
    check_integer("shape_classifier: image_size", image_size, minimum=MIN_IMAGE_SIZE)
    folder = default_cache_dir("metrics") if cache_dir is None else pathlib.Path(cache_dir)
    digest = RECIPE.digest(image_size)
    path = folder / f"shape-classifier-{digest[:16]}.npz"
    template = ShapeClassifier.fresh(image_size, RECIPE.widths, key=jax.random.key(0))
    cached = _read(path, template, digest)
    if cached is not None:
        return cached
    _writable(folder)  # before the training, not after it
    if sys.stderr.isatty():  # a first run's pause, said once (a terminal only, as progress bars)
        print(
            f"training the shapes classifier that class_accuracy reads ({image_size}x"
            f"{image_size}, once: about 10 s); it is kept at {path}",
            file=sys.stderr,
        )
    trained = train_shape_classifier(image_size, RECIPE)
    _write(path, trained)
    return trained


def _unwritable(folder: pathlib.Path, why: object) -> OSError:
    return OSError(
        f"shape_classifier: cannot write its weights under {os.fspath(folder)!r} ({why}); "
        "set $DEW_CACHE_DIR (or pass cache_dir=) to a writable folder."
    )


def _writable(folder: pathlib.Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(folder, error.strerror or error) from None
    if not os.access(folder, os.W_OK):
        raise _unwritable(folder, "Permission denied")


def _read(path: pathlib.Path, template: ShapeClassifier, digest: str) -> ShapeClassifier | None:
    """The classifier at `path`, or `None` where there is none whole of this recipe."""
    leaves, treedef = jax.tree.flatten(template)
    try:
        # np.load leaves the file open when it fails on a damaged archive: ours closes it.
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as saved:
            if str(saved["recipe_sha256"]) != digest:
                return None
            arrays = [saved[f"leaf_{index}"] for index in range(len(leaves))]
            accuracy = float(saved["held_out_accuracy"])
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    if any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(arrays, leaves, strict=True)):
        return None
    loaded = jax.tree.unflatten(treedef, [jnp.asarray(array) for array in arrays])
    return dataclasses.replace(loaded, held_out_accuracy=accuracy, recipe_sha256=digest)


def _write(path: pathlib.Path, classifier: ShapeClassifier) -> None:
    try:
        descriptor, scratch = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
        )
    except OSError as error:
        raise _unwritable(path.parent, error.strerror or error) from None
    try:
        leaves: dict[str, Any] = {
            f"leaf_{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(classifier))
        }
        with os.fdopen(descriptor, "wb") as file:
            np.savez(
                file,
                recipe_sha256=np.str_(classifier.recipe_sha256),
                held_out_accuracy=np.float64(classifier.held_out_accuracy),
                **leaves,
            )
        os.replace(scratch, path)
    except BaseException:
        pathlib.Path(scratch).unlink(missing_ok=True)
        raise
