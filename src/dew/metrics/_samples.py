"""What generated samples of labelled data look like, without downloaded weights: whether a
classifier finds the class each sample was conditioned on, and the foreground statistics
(its area, its colour's spread, its number of pieces) set beside the real rows' own.

Each metric is a mean over images (a clip's frames each count as one image), pure JAX, so
it reduces inside the compiled pass like the other device metrics. The foreground of an
image is the pixels whose brightest channel exceeds `threshold` (by default 0.15: the
shapes datasets draw every channel of a shape from `[0.3, 1]` on a background of exact 0,
so the threshold sits halfway to their faintest shape; a sample's faint haze stays out).
"""

import abc
import math
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractVar
from jaxtyping import Array, Bool, Float, Int

from dew._checks import check_ids
from dew.artifacts import Artifact, Clips, Images
from dew.metrics._base import MeanState, Metric

__all__ = [
    "FOREGROUND_THRESHOLD",
    "ClassAccuracy",
    "ForegroundColourSpread",
    "ForegroundFraction",
    "ForegroundParts",
    "foreground_colour_spread",
    "foreground_parts",
]

FOREGROUND_THRESHOLD = 0.15
POPULATIONS = ("generated", "reference")


def _frames(values: Array, clips: bool) -> Array:
    """Images `(rows, H, W, C)`, or a clip batch's frames as images `(rows * frames, ...)`."""
    return values.reshape(-1, *values.shape[2:]) if clips else values


def foreground_mask(
    images: Float[Array, "rows height width channels"], threshold: float
) -> Bool[Array, "rows height width"]:
    """The pixels whose brightest channel exceeds `threshold`."""
    return jnp.max(images, axis=-1) > threshold


def foreground_colour_spread(
    images: Float[Array, "rows height width channels"], mask: Bool[Array, "rows height width"]
) -> Float[Array, " rows"]:
    """Each image's colour spread over its foreground: the root of the mean over channels of
    the (population) variance of the foreground pixels' values; 0 for one flat colour (and
    for an image with no foreground, which the metric leaves out)."""
    weights = mask[..., None].astype(images.dtype)
    count = jnp.maximum(jnp.sum(weights, axis=(1, 2)), 1.0)
    mean = jnp.sum(images * weights, axis=(1, 2)) / count
    deviation = (images - mean[:, None, None, :]) * weights
    variance = jnp.sum(deviation * deviation, axis=(1, 2)) / count
    return jnp.sqrt(jnp.mean(variance, axis=-1))


def foreground_parts(mask: Bool[Array, "rows height width"]) -> Int[Array, " rows"]:
    """Each image's number of foreground pieces: the 4-connected components of `mask`
    (pixels sharing an edge), 0 for an empty mask. Each foreground pixel starts labelled by
    its own index and takes its neighbours' largest label until none changes; a piece is
    counted at the one pixel that keeps its own label."""
    height, width = mask.shape[1:]
    own = jnp.arange(1, height * width + 1, dtype=jnp.int32).reshape(1, height, width)
    start = jnp.where(mask, own, 0)

    def spread(labels: Array) -> Array:
        padded = jnp.pad(labels, ((0, 0), (1, 1), (1, 1)))
        neighbours = jnp.stack(
            [
                padded[:, :-2, 1:-1],
                padded[:, 2:, 1:-1],
                padded[:, 1:-1, :-2],
                padded[:, 1:-1, 2:],
                labels,
            ]
        )
        return jnp.where(mask, jnp.max(neighbours, axis=0), 0)

    def unsettled(state: tuple[Array, Array]) -> Array:
        labels, previous = state
        return jnp.any(labels != previous)

    def step(state: tuple[Array, Array]) -> tuple[Array, Array]:
        labels, _ = state
        return spread(labels), labels

    settled, _ = jax.lax.while_loop(unsettled, step, (spread(start), start))
    return jnp.sum(mask & (settled == own), axis=(1, 2), dtype=jnp.int32)


class _SampleMean(Metric[Artifact]):
    """A per-image value of the generated (or reference) rows of `Images` (or, with
    `clips`, every frame of `Clips`), averaged over images: `MeanState` statistics."""

    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    clips: AbstractVar[bool]

    @property
    def artifact_type(self) -> type[Artifact]:  # pyright: ignore[reportIncompatibleVariableOverride]
        """`Clips` with `clips`, else `Images`."""
        return Clips if self.clips else Images

    def init(self) -> MeanState:
        return MeanState.zero()

    def merge(self, accumulated: MeanState, contribution: MeanState) -> MeanState:
        return accumulated.merge(contribution)

    def finalize(self, accumulated: MeanState) -> Float[Array, ""]:
        return accumulated.mean()

    def _rows(self, artifact: Any, population: str) -> Array:
        values = artifact.generated if population == "generated" else artifact.reference
        if values is None:
            kind = type(artifact).__name__
            raise ValueError(
                f"metric {self.name!r} reads the real rows, but {kind}.reference is None; "
                f"pass {kind}(generated, reference=real rows)."
            )
        return _frames(jnp.asarray(values, jnp.float32), self.clips)


class ClassAccuracy(_SampleMean):
    """The share of generated images a classifier assigns the class they were conditioned
    on (`Images.labels`, `Clips.labels`: every frame of a clip is classified, and counts,
    as one image conditioned on its clip's label), name `class_accuracy`.

    - `classifier`: a (jit-compatible) callable from images `(rows, H, W, C)` in `[0, 1]`
      to logits `(rows, classes)`: `dew.metrics.shape_classifier()` for the shapes data.
    - `clips`: read `Clips` (each frame an image) instead of `Images`.
    """

    classifier: Callable[[Array], Array]
    name: str = eqx.field(static=True, default="class_accuracy")
    direction: ClassVar[str | None] = "maximize"
    clips: bool = eqx.field(static=True, default=False)

    def statistics(self, artifact: Any) -> MeanState:
        labels = artifact.labels
        if labels is None:
            kind = type(artifact).__name__
            raise ValueError(
                f"metric {self.name!r} checks the class each generated row was conditioned "
                f"on, but these {kind} carry no labels ({kind}(..., labels=...)); an "
                "unconditional model's samples have no class to check."
            )
        images = self._rows(artifact, "generated")
        frames = images.shape[0] // max(artifact.generated.shape[0], 1)
        logits = self.classifier(images)
        labels = check_ids(
            labels,
            logits.shape[-1],
            subject=f"metric {self.name!r}: {type(artifact).__name__}.labels",
            noun="label",
            size_name="classes",
            axes=("row",),
        )
        labels = jnp.repeat(jnp.asarray(labels, jnp.int32), frames)
        return MeanState.of((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))

    def feature_definition(self) -> dict[str, Any]:
        """What the score reads samples through (`dew.metrics.DescribesFeatures`): the
        classifier, its held-out accuracy and the digest of its training recipe where it
        says them."""
        network = getattr(self.classifier, "__qualname__", type(self.classifier).__name__)
        return {
            "network": f"{network}, the argmax of its logits",
            "preprocessing": None,
            "weights_sha256": getattr(self.classifier, "recipe_sha256", None),
            "held_out_accuracy": getattr(self.classifier, "held_out_accuracy", None),
        }


class _Foreground(_SampleMean):
    population: AbstractVar[str]
    threshold: AbstractVar[float]

    def __check_init__(self) -> None:
        if self.population not in POPULATIONS:
            raise ValueError(
                f"metric {self.name!r}: population must be one of {POPULATIONS}, got "
                f"{self.population!r}."
            )
        threshold = self.threshold
        if isinstance(threshold, bool) or not (
            isinstance(threshold, int | float) and math.isfinite(threshold) and threshold >= 0
        ):
            raise ValueError(
                f"metric {self.name!r}: threshold must be a finite number >= 0, got {threshold!r}."
            )

    @property
    def direction(self) -> str | None:
        """`None` (best near the real rows' value) for the real rows' statistics and for the
        generated rows' foreground share and piece count; see `ForegroundColourSpread`."""
        return None

    def statistics(self, artifact: Any) -> MeanState:
        images = self._rows(artifact, self.population)
        return self.per_image(images, foreground_mask(images, self.threshold))

    @abc.abstractmethod
    def per_image(self, images: Array, mask: Array) -> MeanState:
        """The statistics of each image's value."""


class ForegroundFraction(_Foreground):
    """The mean share of an image's pixels in its foreground, name `foreground_fraction`
    (of the generated rows; `population="reference"`: of the real rows)."""

    population: str = eqx.field(static=True, default="generated")
    threshold: float = eqx.field(static=True, default=FOREGROUND_THRESHOLD)
    clips: bool = eqx.field(static=True, default=False)
    name: str = eqx.field(static=True, default="foreground_fraction")

    def per_image(self, images: Array, mask: Array) -> MeanState:
        return MeanState.of(jnp.mean(mask, axis=(1, 2), dtype=jnp.float32))


class ForegroundColourSpread(_Foreground):
    """The mean over images with a foreground of the colour spread within it
    (`foreground_colour_spread`: 0 for one flat colour), name `foreground_colour_spread`."""

    population: str = eqx.field(static=True, default="generated")
    threshold: float = eqx.field(static=True, default=FOREGROUND_THRESHOLD)
    clips: bool = eqx.field(static=True, default=False)
    name: str = eqx.field(static=True, default="foreground_colour_spread")

    @property
    def direction(self) -> str | None:
        """`"minimize"` for the generated rows (0: one flat colour, as the real shapes are),
        `None` for the real rows' own statistic."""
        return "minimize" if self.population == "generated" else None

    def per_image(self, images: Array, mask: Array) -> MeanState:
        present = jnp.any(mask, axis=(1, 2)).astype(jnp.float32)
        return MeanState.of(foreground_colour_spread(images, mask), present)


class ForegroundParts(_Foreground):
    """The mean number of foreground pieces an image holds (`foreground_parts`: 1 for one
    solid shape, 0 for none), name `foreground_parts`."""

    population: str = eqx.field(static=True, default="generated")
    threshold: float = eqx.field(static=True, default=FOREGROUND_THRESHOLD)
    clips: bool = eqx.field(static=True, default=False)
    name: str = eqx.field(static=True, default="foreground_parts")

    def per_image(self, images: Array, mask: Array) -> MeanState:
        return MeanState.of(foreground_parts(mask).astype(jnp.float32))
