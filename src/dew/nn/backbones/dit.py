"""A diffusion transformer (DiT) over images or clips, predicting a flow-matching velocity."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from dew._precision import compute_dtype
from dew.nn._compiled_init import initialise
from dew.nn.backbones._layers import column_parallel, dense, layer_norm, row_parallel
from dew.nn.backbones._remat import apply_blocks, remat_policy
from dew.nn.backbones._vision import (
    SelfAttention,
    check_vision_configuration,
    in_compute_dtype,
    patchify,
    unpatchify,
)

__all__ = ["DiT"]


def _zeroed(linear: eqx.nn.Linear) -> eqx.nn.Linear:
    return eqx.tree_at(
        lambda layer: (layer.weight, layer.bias),
        linear,
        # Every layer DiT zeroes has a bias (eqx.nn.Linear's default).
        (jnp.zeros_like(linear.weight), jnp.zeros_like(linear.bias)),  # pyright: ignore[reportArgumentType]
    )


def _time_embedding(t: Float[Array, ""], features: int) -> Float[Array, " features"]:
    """Sinusoidal features of a diffusion time `t` in [0, 1] (scaled by 1000, so the
    fastest sinusoid turns about 160 times across the interval)."""
    half = features // 2
    frequencies = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    angles = 1000.0 * t.astype(jnp.float32) * frequencies
    embedding = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)])
    return jnp.pad(embedding, (0, features - 2 * half))


class _AdaLNBlock(eqx.Module):
    """A pre-norm transformer block whose norms are shifted, scaled and whose residual
    branches are gated by a linear map of the conditioning vector (adaLN-zero: the map
    starts at zero, so a fresh block is the identity)."""

    attention: SelfAttention
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    modulation: eqx.nn.Linear
    norm: eqx.nn.LayerNorm

    def __init__(self, width: int, heads: int, *, key: PRNGKeyArray):
        keys = jax.random.split(key, 4)
        self.attention = SelfAttention(width, heads, key=keys[0])
        self.up = eqx.nn.Linear(width, 4 * width, key=keys[1])
        self.down = eqx.nn.Linear(4 * width, width, key=keys[2])
        self.modulation = _zeroed(eqx.nn.Linear(width, 6 * width, key=keys[3]))
        self.norm = eqx.nn.LayerNorm(width, use_weight=False, use_bias=False)

    def tensor_sharding(self) -> dict[str, jax.sharding.PartitionSpec]:
        """The MLP's split over a mesh's `"model"` axis (`Trainer(strategy="fsdp+tensor")`)
        by its hidden axis; the attention declares its own."""
        return {**column_parallel("up"), **row_parallel("down")}

    def __call__(
        self, x: Float[Array, "seq width"], condition: Float[Array, " width"]
    ) -> Float[Array, "seq width"]:
        modulation = self.modulation(jax.nn.silu(condition))
        shift1, scale1, gate1, shift2, scale2, gate2 = (
            part[None] for part in jnp.split(modulation, 6)
        )
        h = layer_norm(self.norm, x) * (1 + scale1) + shift1
        x = x + gate1 * self.attention(h)
        h = layer_norm(self.norm, x) * (1 + scale2) + shift2
        return x + gate2 * dense(self.down, jax.nn.gelu(dense(self.up, h)))


def _parts(
    patch_features: int,
    patches: int,
    width: int,
    depth: int,
    frames: int | None,
    num_classes: int | None,
    *,
    key: PRNGKeyArray,
) -> dict[str, Any]:
    """A DiT's embeddings, time MLP, final modulation and head, and the key of each block."""
    keys = jax.random.split(key, depth + 7)
    return {
        "patch_embedding": eqx.nn.Linear(patch_features, width, key=keys[0]),
        "space_embedding": 0.02 * jax.random.normal(keys[1], (patches, width), jnp.float32),
        "time_position_embedding": (
            None
            if frames is None
            else 0.02 * jax.random.normal(keys[2], (frames, width), jnp.float32)
        ),
        "time_mlp": eqx.nn.MLP(width, width, width, depth=1, activation=jax.nn.silu, key=keys[3]),
        "label_embedding": (
            None if num_classes is None else eqx.nn.Embedding(num_classes + 1, width, key=keys[4])
        ),
        "final_modulation": _zeroed(eqx.nn.Linear(width, 2 * width, key=keys[5])),
        "head": _zeroed(eqx.nn.Linear(width, patch_features, key=keys[6])),
        "block_keys": tuple(keys[7 + i] for i in range(depth)),
    }


class DiT(eqx.Module):
    """A diffusion transformer with adaLN-zero conditioning on the diffusion time and,
    optionally, a class label; it returns a velocity shaped like its input.

    **Arguments:**

    - `image_size`: the height and width of the (square) images.
    - `patch_size`: the side of each square patch token; must divide `image_size`.
    - `channels`: colour channels of the input (3 for RGB).
    - `width`, `depth`, `heads`: the transformer's token features, number of blocks and
      attention heads (`heads` must divide `width`); each block's MLP is `4 * width` wide.
    - `frames`: `None` for images `(image_size, image_size, channels)`; an integer for
      clips `(frames, image_size, image_size, channels)`, read as `frames x patches`
      tokens that all attend to each other, with a learned space position embedding per
      patch plus a learned time position embedding per frame. Images take the same code
      path as one-frame clips without the time embedding.
    - `num_classes`: `None` for an unconditional model; an integer for class labels
      `0 .. num_classes - 1` plus the null label `num_classes` (`null_label`) that
      classifier-free guidance trains and samples with. Its embedding has
      `num_classes + 1` rows. A concrete label outside `0 .. num_classes` raises; under
      `jax.vmap` or `jit` the labels are traced and the caller checks them (as the
      diffusion objective checks its batches).
    - `dtype`: `"float32"` or `"bfloat16"`, the computation dtype. Parameters stay
      float32; the output is returned in float32.
    - `remat`: `False` (default), `True` or a name of `dew.nn.backbones.REMAT_POLICIES`:
      each block under `jax.checkpoint` with that policy, as `CausalTransformer`'s.
    - `key`: the initialisation key (required).

    The conditioning vector is an MLP of sinusoidal features of `t` plus the label's
    embedding; every block's modulation and the final projection start at zero, so a
    fresh model returns exactly zero. With `width=64, depth=2, patch_size=4` on
    16 x 16 x 3 images it holds 173,296 parameters (including embeddings).

    The module maps one example; `jax.vmap` it over a batch (as the other backbones).

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> model = DiT(16, 4, 3, width=32, depth=1, heads=2, num_classes=5,
    ...             key=jax.random.key(0))
    >>> images = jnp.zeros((8, 16, 16, 3))
    >>> t = jnp.linspace(0.0, 1.0, 8)
    >>> labels = jnp.full((8,), model.null_label)
    >>> velocity = eqx.filter_jit(jax.vmap(model))(images, t, labels)
    >>> velocity.shape, float(jnp.abs(velocity).max())
    ((8, 16, 16, 3), 0.0)

    ```
    """

    patch_embedding: eqx.nn.Linear
    space_embedding: Float[Array, "patches width"]
    time_position_embedding: Float[Array, "frames width"] | None
    time_mlp: eqx.nn.MLP
    label_embedding: eqx.nn.Embedding | None
    blocks: tuple[_AdaLNBlock, ...]
    final_norm: eqx.nn.LayerNorm
    final_modulation: eqx.nn.Linear
    head: eqx.nn.Linear
    image_size: int = eqx.field(static=True)
    patch_size: int = eqx.field(static=True)
    channels: int = eqx.field(static=True)
    frames: int | None = eqx.field(static=True)
    num_classes: int | None = eqx.field(static=True)
    dtype: str = eqx.field(static=True)
    remat: str | None = eqx.field(static=True)

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        channels: int,
        width: int,
        depth: int,
        heads: int,
        *,
        frames: int | None = None,
        num_classes: int | None = None,
        dtype: str = "float32",
        remat: bool | str = False,
        key: PRNGKeyArray,
    ):
        check_vision_configuration(
            "DiT",
            image_size=image_size,
            patch_size=patch_size,
            channels=channels,
            width=width,
            depth=depth,
            heads=heads,
            dtype=dtype,
            frames=frames,
            num_classes=num_classes,
        )
        # Two compiled programs whatever the depth (decision 0048): the parts around the
        # blocks and the blocks' keys, then one block, reused for every block.
        patch_features = patch_size * patch_size * channels
        patches = (image_size // patch_size) ** 2
        parts = initialise(
            _parts, patch_features, patches, width, depth, frames, num_classes, key=key
        )
        self.patch_embedding = parts["patch_embedding"]
        self.space_embedding = parts["space_embedding"]
        self.time_position_embedding = parts["time_position_embedding"]
        self.time_mlp = parts["time_mlp"]
        self.label_embedding = parts["label_embedding"]
        self.blocks = tuple(
            initialise(_AdaLNBlock, width, heads, key=k) for k in parts["block_keys"]
        )
        self.final_norm = eqx.nn.LayerNorm(width, use_weight=False, use_bias=False)
        self.final_modulation = parts["final_modulation"]
        self.head = parts["head"]
        self.image_size = image_size
        self.patch_size = patch_size
        self.channels = channels
        self.frames = frames
        self.num_classes = num_classes
        self.dtype = dtype
        self.remat = remat_policy("DiT", remat)

    @property
    def null_label(self) -> int:
        """The null class label, `num_classes`: the unconditional input of classifier-free
        guidance (the last row of the label embedding)."""
        if self.num_classes is None:
            raise ValueError("This DiT has no class labels (num_classes=None).")
        return self.num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example: `(H, W, C)`, or `(frames, H, W, C)` for clips."""
        image = (self.image_size, self.image_size, self.channels)
        return image if self.frames is None else (self.frames, *image)

    def __call__(
        self,
        x: Float[Array, "*frames height width channels"],
        t: Float[ArrayLike, ""],
        label: Int[ArrayLike, ""] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*frames height width channels"]:
        """The velocity at `x` (one image or clip) and diffusion time `t` in [0, 1],
        conditioned on `label` where the model has classes (`None` means the null label).
        The model has no stochastic layers: `key` is accepted and unused."""
        del key
        if x.shape != self.input_shape:
            raise ValueError(f"DiT expects one example of shape {self.input_shape}, got {x.shape}.")
        t = jnp.asarray(t)
        if t.shape != () or not jnp.issubdtype(t.dtype, jnp.floating):
            raise ValueError(f"DiT's time t must be a float scalar, got {t.dtype} {t.shape}.")
        label = self._checked_label(label)
        model = in_compute_dtype(self, self.dtype)
        compute = compute_dtype(self.dtype)
        clip = x if self.frames is not None else x[None]
        tokens = dense(model.patch_embedding, patchify(clip.astype(compute), self.patch_size))
        position = model.space_embedding[None]
        if model.time_position_embedding is not None:
            position = position + model.time_position_embedding[:, None]
        frames = clip.shape[0]
        h = (tokens.reshape(frames, -1, tokens.shape[-1]) + position).reshape(tokens.shape)
        condition = model.time_mlp(_time_embedding(t, h.shape[-1]).astype(h.dtype))
        if model.label_embedding is not None:
            condition = condition + model.label_embedding(label)
        h = apply_blocks(model.blocks, h, self.remat, lambda block, h: block(h, condition))
        shift, scale = (
            part[None] for part in jnp.split(model.final_modulation(jax.nn.silu(condition)), 2)
        )
        h = layer_norm(model.final_norm, h) * (1 + scale) + shift
        out = unpatchify(dense(model.head, h), clip.shape, self.patch_size)
        return out.reshape(x.shape).astype(jnp.float32)

    def _checked_label(self, label: Int[ArrayLike, ""] | None) -> Int[Array, ""]:
        if self.num_classes is None:
            if label is not None:
                raise ValueError("DiT got a label, but it has no classes (num_classes=None).")
            return jnp.zeros((), jnp.int32)
        if label is None:
            return jnp.asarray(self.num_classes, jnp.int32)
        label = jnp.asarray(label)
        if label.shape != () or not jnp.issubdtype(label.dtype, jnp.integer):
            raise ValueError(
                f"DiT's label must be an integer scalar, got {label.dtype} {label.shape}."
            )
        if not isinstance(label, jax.core.Tracer):
            value = int(np.asarray(label))
            if not 0 <= value <= self.num_classes:
                raise ValueError(
                    f"DiT got label {value}; valid labels are 0 to {self.num_classes - 1} and the "
                    f"null label {self.num_classes} (num_classes={self.num_classes})."
                )
        return label
