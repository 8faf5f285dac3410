"""CLIP score: how well generated images match their prompts, by an open_clip CLIP model.

Each (image, prompt) pair scores 100 x the cosine of the image's and the prompt's CLIP
features. The statistics are the float64 sum of the pair scores and the pair count, so the
value is the mean over every pair of the pass however it is batched; `finalize` clamps that
mean at zero, as torchmetrics' `CLIPScore` does (the clamp is on the mean, not on each pair).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from dew.artifacts import Artifact, Images
from dew.io import sha256_of
from dew.metrics._base import Metric
from dew.nn.clip import CLIP, CLIPConfig, tokenize

__all__ = ["CLIPScore", "CLIPScoreState", "clip_score"]

_encode_image = eqx.filter_jit(CLIP.encode_image)
_encode_text = eqx.filter_jit(CLIP.encode_text)


class CLIPScoreState(NamedTuple):
    """The statistics of a CLIP score: the float64 sum of 100 x cosine over the pairs, and
    how many pairs."""

    total: float
    # A field named as the statistic is; it hides tuple.count, which nothing calls.
    count: int  # pyright: ignore[reportIncompatibleMethodOverride]


def _cosines(image: Array, text: Array) -> np.ndarray:
    images, texts = np.asarray(image, np.float64), np.asarray(text, np.float64)
    norms = np.linalg.norm(images, axis=-1) * np.linalg.norm(texts, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sum(images * texts, axis=-1) / norms


class CLIPScore(Metric[Images]):
    """Mean over (generated image, prompt) pairs of 100 x the cosine of their CLIP features,
    clamped at zero (name `clip_score`). Reads `Images.generated` (values in `[0, 1]`, any
    size: open_clip's preprocessing runs inside) and `Images.prompts`, one per generated row;
    references are not used. A host metric: the model runs on the device once per batch and
    the sums are float64 on the host. `weights_sha256`: the SHA-256 of the checkpoint the
    model was read from (`clip_score(path)` sets it), or `None`."""

    model: CLIP
    name: str = eqx.field(static=True, default="clip_score")
    direction: ClassVar[str | None] = "maximize"
    weights_sha256: str | None = eqx.field(static=True, default=None)
    artifact_type: ClassVar[type[Artifact]] = Images
    host: ClassVar[bool] = True

    def feature_definition(self) -> dict[str, Any]:
        """What the score reads images and prompts through (`dew.metrics.DescribesFeatures`):
        the CLIP architecture (its `CLIPConfig`), open_clip's preprocessing and the
        checkpoint's SHA-256."""
        config = self.model.config
        return {
            "network": "open_clip CLIP, 100 x cosine of the projected image and prompt "
            f"features; {dataclasses.asdict(config)}",
            "preprocessing": f"images: short side resized to {config.image_size} (bicubic, "
            "antialiased), centre crop, CLIP mean and std; prompts: CLIP's BPE tokens, "
            f"{config.context_length} a prompt",
            "weights_sha256": self.weights_sha256,
        }

    def init(self) -> CLIPScoreState:
        return CLIPScoreState(0.0, 0)

    def statistics(self, artifact: Images) -> CLIPScoreState:
        rows = artifact.generated.shape[0]
        if artifact.prompts is None:
            raise ValueError(
                f"metric {self.name!r} scores each generated image against its prompt, but "
                f"these Images carry no prompts (Images(generated, prompts=...), one per row)."
            )
        if len(artifact.prompts) != rows:
            raise ValueError(
                f"metric {self.name!r} needs one prompt per generated row, got "
                f"{len(artifact.prompts)} prompt(s) for {rows} generated rows."
            )
        if rows == 0:
            return self.init()
        self._check_range(np.asarray(artifact.generated))
        tokens = tokenize(artifact.prompts, context_length=self.model.config.context_length)
        image = _encode_image(self.model, artifact.generated)
        text = _encode_text(self.model, jnp.asarray(tokens))
        return CLIPScoreState(float(np.sum(100.0 * _cosines(image, text))), rows)

    def _check_range(self, images: np.ndarray) -> None:
        # NaN passes: a diverged sampler's images score NaN, which is data.
        bad = np.argwhere((images < 0) | (images > 1))
        if bad.size:
            index = tuple(int(i) for i in bad[0])
            raise ValueError(
                f"metric {self.name!r} reads Images.generated in [0, 1], got "
                f"{float(images[index])!r} at row {index[0]}, pixel {index[1:3]}, channel "
                f"{index[3]}; scale 8-bit images with / 255."
            )

    def merge(self, accumulated: CLIPScoreState, contribution: CLIPScoreState) -> CLIPScoreState:
        return CLIPScoreState(
            accumulated.total + contribution.total, accumulated.count + contribution.count
        )

    def finalize(self, accumulated: CLIPScoreState) -> np.float64:
        if accumulated.count == 0:
            return np.float64(np.nan)
        return np.maximum(np.float64(accumulated.total) / accumulated.count, 0.0)


def clip_score(
    weights: str | os.PathLike[str] | CLIP,
    *,
    model: str | CLIPConfig = "ViT-B-32",
    quick_gelu: bool = False,
    name: str = "clip_score",
) -> CLIPScore:
    """CLIP score over `Images` with prompts (name `clip_score`): the mean of 100 x
    cos(image features, prompt features), clamped at zero, as torchmetrics' `CLIPScore`.

    **Arguments:**

    - `weights`: an open_clip checkpoint (`open_clip_model.safetensors`,
      `open_clip_pytorch_model.bin`), read without torch by `dew.nn.clip.CLIP.load`, or a
      loaded `dew.nn.clip.CLIP`. Nothing is downloaded.
    - `model`: the open_clip architecture of the checkpoint: a name of `dew.nn.clip.MODELS`
      or a `dew.nn.clip.CLIPConfig`.
    - `quick_gelu`: `True` for weights trained with QuickGELU (OpenAI's, open_clip's
      `-quickgelu` names); the file does not say, and the wrong choice silently changes
      the score.
    - `name`: the metric's name.
    """
    if isinstance(weights, CLIP):
        return CLIPScore(model=weights, name=name)
    loaded = CLIP.load(weights, model=model, quick_gelu=quick_gelu)
    return CLIPScore(model=loaded, name=name, weights_sha256=sha256_of(weights))
