"""open_clip's image preprocessing: bicubic resize of the short side, centre crop, CLIP
mean and standard deviation, on float images in `[0, 1]`, channels last.

open_clip's transform is `Resize(224, bicubic, antialias=True)`, `CenterCrop(224)`,
`ToTensor`, `Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)`. On a float tensor its
resize is torchvision's antialiased bicubic (Keys' cubic, a = -0.5, the kernel widened by the
scale when downsampling), which `jax.image.resize(..., "bicubic", antialias=True)` computes
too: the two agree to 1e-5 (measured on noise and smooth images, 64x64 to 512x384). On a PIL
image, open_clip resizes the 8-bit image with PIL's bicubic, which rounds to 8 bits and clips
the cubic's overshoot to [0, 255]: from float images that differs by up to 1/255 on smooth
images and up to 0.17 on pixel noise, so dew's features match open_clip's on tensors, not
on PIL images.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

__all__ = ["CLIP_MEAN", "CLIP_STD", "preprocess"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _resized_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """torchvision's `Resize(size)`: the short side to `size`, the long side scaled and
    truncated to an int."""
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


def preprocess(
    images: Float[Array, "rows height width channels"], size: int = 224
) -> Float[Array, "rows size size 3"]:
    """open_clip's validation preprocessing of `images` in `[0, 1]` (1 or 3 channels, any
    height and width): the short side resized to `size` (antialiased bicubic), the centre
    `size` x `size` crop (torchvision's rounding), then `(x - CLIP_MEAN) / CLIP_STD`.
    A single channel is repeated to RGB, as PIL's `convert("RGB")` does."""
    if np.ndim(images) != 4 or np.shape(images)[-1] not in (1, 3):
        raise ValueError(
            "CLIP reads images (rows, height, width, channels) with 1 or 3 channels, got "
            f"shape {tuple(np.shape(images))}."
        )
    images = jnp.asarray(images, jnp.float32)
    rows, height, width, channels = images.shape
    if channels == 1:
        images = jnp.broadcast_to(images, (rows, height, width, 3))
    new_height, new_width = _resized_shape(height, width, size)
    if (new_height, new_width) != (height, width):
        images = jax.image.resize(
            images, (rows, new_height, new_width, 3), "bicubic", antialias=True
        )
    top = round((new_height - size) / 2.0)
    left = round((new_width - size) / 2.0)
    images = images[:, top : top + size, left : left + size]
    mean = jnp.asarray(CLIP_MEAN, jnp.float32)[None, None, None]
    std = jnp.asarray(CLIP_STD, jnp.float32)[None, None, None]
    return (images - mean) / std
