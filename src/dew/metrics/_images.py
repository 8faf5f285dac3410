"""Paired image and video metrics: MSE, MAE, PSNR and SSIM.

Image metrics read `Images` and weight each image once; video metrics read `Clips`
and weight each frame once. Both compare generated rows with reference rows and
need one reference per generated row.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from dew.artifacts import Artifact, Clips, Images
from dew.metrics._base import MeanState, Metric

__all__ = [
    "MAE",
    "MSE",
    "PSNR",
    "SSIM",
    "VideoPSNR",
    "VideoSSIM",
    "gaussian_window",
    "per_image_mae",
    "per_image_mse",
    "per_image_psnr",
    "per_image_ssim",
]

SSIM_SIGMA = 1.5
SSIM_TRUNCATE = 3.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03


def gaussian_window(sigma: float = SSIM_SIGMA, truncate: float = SSIM_TRUNCATE) -> np.ndarray:
    """The normalised 1-D Gaussian window SSIM uses (SciPy's `gaussian_filter` taps)."""
    radius = int(truncate * sigma + 0.5)
    offsets = np.arange(-radius, radius + 1, dtype=np.float64)
    window = np.exp(-0.5 * (offsets / sigma) ** 2)
    return window / window.sum()


def _float(images: Array) -> Array:
    images = jnp.asarray(images)
    if jnp.issubdtype(images.dtype, jnp.floating):
        return images
    return images.astype(jnp.float32)


def per_image_mse(
    generated: Float[Array, "rows height width channels"],
    reference: Float[Array, "rows height width channels"],
) -> Float[Array, " rows"]:
    """Mean squared error of each image over its pixels and channels."""
    difference = _float(generated) - _float(reference)
    return jnp.mean(jnp.square(difference), axis=(1, 2, 3))


def per_image_mae(
    generated: Float[Array, "rows height width channels"],
    reference: Float[Array, "rows height width channels"],
) -> Float[Array, " rows"]:
    """Mean absolute error of each image over its pixels and channels."""
    return jnp.mean(jnp.abs(_float(generated) - _float(reference)), axis=(1, 2, 3))


def per_image_psnr(
    generated: Float[Array, "rows height width channels"],
    reference: Float[Array, "rows height width channels"],
    data_range: float,
) -> Float[Array, " rows"]:
    """Peak signal-to-noise ratio of each image in dB; +inf for a perfect image."""
    mse = per_image_mse(generated, reference)
    return 10.0 * jnp.log10(jnp.asarray(data_range, mse.dtype) ** 2 / mse)


def _band(size: int, window: np.ndarray) -> np.ndarray:
    """The `(size - taps + 1, size)` matrix whose rows slide `window` along an axis."""
    taps = window.shape[0]
    band = np.zeros((size - taps + 1, size), np.float64)
    for row in range(size - taps + 1):
        band[row, row : row + taps] = window
    return band


def _filter_valid(images: Array, window: np.ndarray) -> Array:
    """Separable correlation with `window` along height and width, 'valid' region only.

    Each pass is a matmul with a banded matrix: XLA runs one dense contraction
    several times faster than eleven shifted slices summed.
    """
    height, width = images.shape[1], images.shape[2]
    along_height = jnp.asarray(_band(height, window), images.dtype)
    along_width = jnp.asarray(_band(width, window), images.dtype)
    rows = jnp.einsum("ih,nhwc->niwc", along_height, images)
    return jnp.einsum("jw,niwc->nijc", along_width, rows)


def per_image_ssim(
    generated: Float[Array, "rows height width channels"],
    reference: Float[Array, "rows height width channels"],
    data_range: float,
) -> Float[Array, " rows"]:
    """Mean structural similarity of each image, with the Gaussian window of Wang et al.

    sigma 1.5 (11 taps), K1 0.01, K2 0.03, population covariances, averaged over
    the pixels whose window lies inside the image and then over channels: the
    definition of scikit-image's `structural_similarity(gaussian_weights=True,
    use_sample_covariance=False, data_range=..., channel_axis=-1)`.
    """
    x, y = _float(generated), _float(reference)
    dtype = jnp.result_type(x, y)
    x, y = x.astype(dtype), y.astype(dtype)
    window = gaussian_window()
    taps = window.shape[0]
    if x.shape[1] < taps or x.shape[2] < taps:
        raise ValueError(
            f"SSIM needs images of at least {taps}x{taps} pixels for its Gaussian window, "
            f"got {x.shape[1]}x{x.shape[2]}."
        )
    mu_x, mu_y = _filter_valid(x, window), _filter_valid(y, window)
    var_x = _filter_valid(x * x, window) - mu_x * mu_x
    var_y = _filter_valid(y * y, window) - mu_y * mu_y
    cov_xy = _filter_valid(x * y, window) - mu_x * mu_y
    c1 = (SSIM_K1 * data_range) ** 2
    c2 = (SSIM_K2 * data_range) ** 2
    numerator = (2 * mu_x * mu_y + c1) * (2 * cov_xy + c2)
    denominator = (mu_x * mu_x + mu_y * mu_y + c1) * (var_x + var_y + c2)
    return jnp.mean(numerator / denominator, axis=(1, 2, 3))


def _check_data_range(data_range: float) -> None:
    if not (isinstance(data_range, int | float) and math.isfinite(data_range) and data_range > 0):
        raise ValueError(f"data_range must be a finite number > 0, got {data_range!r}.")


def _paired(name: str, generated: Array, reference: Array | None, kind: str) -> Array:
    if reference is None:
        raise ValueError(f"metric {name!r} compares with references, but {kind}.reference is None.")
    if reference.shape[0] != generated.shape[0]:
        raise ValueError(
            f"metric {name!r} needs as many reference rows as generated rows, got "
            f"{generated.shape[0]} generated and {reference.shape[0]} reference rows."
        )
    if reference.shape != generated.shape:
        raise ValueError(
            f"metric {name!r} needs references shaped like the generated rows, got "
            f"generated {tuple(generated.shape)} and reference {tuple(reference.shape)}."
        )
    return reference


class _ImageMean(Metric[Images]):
    """A per-image value averaged over images, each weighted once."""

    artifact_type: ClassVar[type[Artifact]] = Images
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    def init(self) -> MeanState:
        return MeanState.zero()

    def statistics(self, artifact: Images) -> MeanState:
        reference = _paired(self.name, artifact.generated, artifact.reference, "Images")
        return MeanState.of(self.per_image(artifact.generated, reference))

    def merge(self, accumulated: MeanState, contribution: MeanState) -> MeanState:
        return accumulated.merge(contribution)

    def finalize(self, accumulated: MeanState) -> Float[Array, ""]:
        return accumulated.mean()

    @abc.abstractmethod
    def per_image(self, generated: Array, reference: Array) -> Array:
        """Each image's value."""


class _FrameMean(Metric[Clips]):
    """A per-frame value averaged over every frame of every clip, each weighted once."""

    artifact_type: ClassVar[type[Artifact]] = Clips
    split_invariant: ClassVar[bool] = True  # law-tested: dew.testing

    def init(self) -> MeanState:
        return MeanState.zero()

    def statistics(self, artifact: Clips) -> MeanState:
        reference = _paired(self.name, artifact.generated, artifact.reference, "Clips")
        frames = artifact.generated.shape[2:]
        generated = artifact.generated.reshape(-1, *frames)
        return MeanState.of(self.per_frame(generated, reference.reshape(-1, *frames)))

    def merge(self, accumulated: MeanState, contribution: MeanState) -> MeanState:
        return accumulated.merge(contribution)

    def finalize(self, accumulated: MeanState) -> Float[Array, ""]:
        return accumulated.mean()

    @abc.abstractmethod
    def per_frame(self, generated: Array, reference: Array) -> Array:
        """Each frame's value."""


class MSE(_ImageMean):
    """Mean squared error between generated and reference images, per image."""

    name: str = eqx.field(static=True, default="mse")
    direction: ClassVar[str | None] = "minimize"

    def per_image(self, generated: Array, reference: Array) -> Array:
        return per_image_mse(generated, reference)


class MAE(_ImageMean):
    """Mean absolute error between generated and reference images, per image."""

    name: str = eqx.field(static=True, default="mae")
    direction: ClassVar[str | None] = "minimize"

    def per_image(self, generated: Array, reference: Array) -> Array:
        return per_image_mae(generated, reference)


class PSNR(_ImageMean):
    """Mean over images of each image's PSNR in dB; a perfect image is +inf and
    keeps the mean at +inf through merge and finalize.

    ```python
    >>> import jax.numpy as jnp
    >>> from dew.artifacts import Images
    >>> images = Images(jnp.full((1, 4, 4, 1), 0.5), reference=jnp.full((1, 4, 4, 1), 0.6))
    >>> metric = PSNR(data_range=1.0)
    >>> round(float(metric.finalize(metric(images))), 3)
    20.0

    ```
    """

    data_range: float = eqx.field(static=True, default=1.0)
    name: str = eqx.field(static=True, default="psnr")
    direction: ClassVar[str | None] = "maximize"

    def __check_init__(self) -> None:
        _check_data_range(self.data_range)

    def per_image(self, generated: Array, reference: Array) -> Array:
        return per_image_psnr(generated, reference, self.data_range)


class SSIM(_ImageMean):
    """Mean over images of each image's SSIM (Gaussian window, sigma 1.5, K1 0.01, K2 0.03)."""

    scan_chunk: ClassVar[int | None] = 4

    data_range: float = eqx.field(static=True, default=1.0)
    name: str = eqx.field(static=True, default="ssim")
    direction: ClassVar[str | None] = "maximize"

    def __check_init__(self) -> None:
        _check_data_range(self.data_range)

    def per_image(self, generated: Array, reference: Array) -> Array:
        return per_image_ssim(generated, reference, self.data_range)


class VideoPSNR(_FrameMean):
    """Mean over every frame of every clip of the frame's PSNR in dB."""

    data_range: float = eqx.field(static=True, default=1.0)
    name: str = eqx.field(static=True, default="psnr")
    direction: ClassVar[str | None] = "maximize"

    def __check_init__(self) -> None:
        _check_data_range(self.data_range)

    def per_frame(self, generated: Array, reference: Array) -> Array:
        return per_image_psnr(generated, reference, self.data_range)


class VideoSSIM(_FrameMean):
    """Mean over every frame of every clip of the frame's SSIM."""

    scan_chunk: ClassVar[int | None] = 4

    data_range: float = eqx.field(static=True, default=1.0)
    name: str = eqx.field(static=True, default="ssim")
    direction: ClassVar[str | None] = "maximize"

    def __check_init__(self) -> None:
        _check_data_range(self.data_range)

    def per_frame(self, generated: Array, reference: Array) -> Array:
        return per_image_ssim(generated, reference, self.data_range)
