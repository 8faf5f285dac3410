"""A vision transformer encoder returning one feature token per patch (JEPA's encoders)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from dew._precision import compute_dtype
from dew.nn._compiled_init import initialise
from dew.nn.backbones._layers import column_parallel, dense, layer_norm, row_parallel
from dew.nn.backbones._remat import apply_blocks, remat_policy
from dew.nn.backbones._vision import (
    SelfAttention,
    check_vision_configuration,
    in_compute_dtype,
    patchify,
)

__all__ = ["ViT"]


class _Block(eqx.Module):
    norm_attention: eqx.nn.LayerNorm
    attention: SelfAttention
    norm_mlp: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, width: int, heads: int, *, key: PRNGKeyArray):
        keys = jax.random.split(key, 3)
        self.norm_attention = eqx.nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads, key=keys[0])
        self.norm_mlp = eqx.nn.LayerNorm(width)
        self.up = eqx.nn.Linear(width, 4 * width, key=keys[1])
        self.down = eqx.nn.Linear(4 * width, width, key=keys[2])

    def tensor_sharding(self) -> dict[str, jax.sharding.PartitionSpec]:
        """The MLP's split over a mesh's `"model"` axis (`Trainer(strategy="fsdp+tensor")`)
        by its hidden axis; the attention declares its own."""
        return {**column_parallel("up"), **row_parallel("down")}

    def __call__(
        self, x: Float[Array, "seq width"], mask: Bool[Array, "seq seq"]
    ) -> Float[Array, "seq width"]:
        x = x + self.attention(layer_norm(self.norm_attention, x), mask)
        h = layer_norm(self.norm_mlp, x)
        return x + dense(self.down, jax.nn.gelu(dense(self.up, h)))


def _parts(
    features: int, patches: int, width: int, depth: int, *, key: PRNGKeyArray
) -> tuple[Any, ...]:
    """A ViT's patch and position embeddings, its final norm, and the key of each block."""
    keys = jax.random.split(key, depth + 2)
    patch_embedding = eqx.nn.Linear(features, width, key=keys[0])
    position_embedding = 0.02 * jax.random.normal(keys[1], (patches, width), jnp.float32)
    block_keys = tuple(keys[2 + i] for i in range(depth))
    return patch_embedding, position_embedding, eqx.nn.LayerNorm(width), block_keys


class ViT(eqx.Module):
    """A pre-norm vision transformer: patch embedding plus a learned position embedding,
    `depth` blocks and a final norm, returning one `width`-feature token per patch.

    **Arguments:**

    - `image_size`, `patch_size`, `channels`: square images `(image_size, image_size,
      channels)` cut into `patches = (image_size // patch_size) ** 2` tokens, row by row
      (`patch_size` must divide `image_size`).
    - `width`, `depth`, `heads`: token features, blocks and attention heads (`heads`
      must divide `width`); each block's MLP is `4 * width` wide.
    - `dtype`: `"float32"` or `"bfloat16"`, the computation dtype. Parameters stay
      float32; features are returned in float32.
    - `remat`: `False` (default), `True` or a name of `dew.nn.backbones.REMAT_POLICIES`:
      each block under `jax.checkpoint` with that policy, as `CausalTransformer`'s.
    - `key`: the initialisation key (required).

    `model(image, mask)` takes an optional boolean `(patches,)` mask of the visible
    tokens (JEPA's context): a masked-out token neither attends nor is attended (it
    attends only to itself), its pixels never enter a visible token's output (not even
    through the gradient), and its output row is zero.

    A JEPA predictor works on tokens, not pixels: it can be a second (narrower) `ViT`
    on the same grid that places its own tokens (context features mapped to its width,
    a learned mask token at the target slots) with its `position_embedding`
    (`(patches, width)`, row-major over `grid`) and runs them through `encode_tokens`;
    its patch embedding then stays unused.

    The module maps one image; `jax.vmap` it over a batch (as the other backbones).

    ```python
    >>> import jax, jax.numpy as jnp
    >>> model = ViT(16, 4, 3, width=32, depth=1, heads=2, key=jax.random.key(0))
    >>> model.grid, model.patches
    ((4, 4), 16)
    >>> context = jnp.arange(model.patches) % 3 != 0
    >>> features = model(jnp.zeros((16, 16, 3)), context)
    >>> features.shape, bool((features[~context] == 0).all())
    ((16, 32), True)

    ```
    """

    patch_embedding: eqx.nn.Linear
    position_embedding: Float[Array, "patches width"]
    blocks: tuple[_Block, ...]
    final_norm: eqx.nn.LayerNorm
    image_size: int = eqx.field(static=True)
    patch_size: int = eqx.field(static=True)
    channels: int = eqx.field(static=True)
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
        dtype: str = "float32",
        remat: bool | str = False,
        key: PRNGKeyArray,
    ):
        check_vision_configuration(
            "ViT",
            image_size=image_size,
            patch_size=patch_size,
            channels=channels,
            width=width,
            depth=depth,
            heads=heads,
            dtype=dtype,
        )
        # Two compiled programs whatever the depth (decision 0048): the embeddings and the
        # blocks' keys, then one block, reused for every block.
        patches = (image_size // patch_size) ** 2
        features = patch_size * patch_size * channels
        parts = initialise(_parts, features, patches, width, depth, key=key)
        self.patch_embedding, self.position_embedding, self.final_norm, block_keys = parts
        self.blocks = tuple(initialise(_Block, width, heads, key=k) for k in block_keys)
        self.image_size = image_size
        self.patch_size = patch_size
        self.channels = channels
        self.dtype = dtype
        self.remat = remat_policy("ViT", remat)

    @property
    def grid(self) -> tuple[int, int]:
        """Patch rows and columns; tokens run row by row over this grid."""
        side = self.image_size // self.patch_size
        return side, side

    @property
    def patches(self) -> int:
        """The number of tokens (patches) per image."""
        rows, columns = self.grid
        return rows * columns

    @property
    def width(self) -> int:
        """The features of each token."""
        return self.position_embedding.shape[1]

    @property
    def heads(self) -> int:
        """The attention heads of each block."""
        return self.blocks[0].attention.heads

    def __call__(
        self,
        image: Float[Array, "height width channels"],
        mask: Bool[Array, " patches"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "patches features"]:
        """One feature token per patch of `image`, with only the tokens `mask` keeps
        visible (all without one); masked rows are zero. The model has no stochastic
        layers: `key` is accepted and unused."""
        del key
        shape = (self.image_size, self.image_size, self.channels)
        if image.shape != shape:
            raise ValueError(f"ViT expects one image of shape {shape}, got {image.shape}.")
        mask = self._checked_mask(mask)
        compute = compute_dtype(self.dtype)
        tokens = patchify(image.astype(compute)[None], self.patch_size)
        if mask is not None:
            # Masked pixels are dropped before the embedding, so not even a NaN leaks.
            tokens = jnp.where(mask[:, None], tokens, jnp.zeros((), compute))
        embedded = dense(in_compute_dtype(self.patch_embedding, self.dtype), tokens)
        return self.encode_tokens(embedded + self.position_embedding.astype(compute), mask)

    def encode_tokens(
        self,
        tokens: Float[Array, "patches width"],
        mask: Bool[Array, " patches"] | None = None,
    ) -> Float[Array, "patches width"]:
        """Run the blocks and the final norm on tokens that already carry their position
        embedding (what `__call__` does after the patch embedding); same `mask` rules."""
        if tokens.shape != (self.patches, self.width):
            raise ValueError(
                f"ViT.encode_tokens expects tokens of shape {(self.patches, self.width)}, "
                f"got {tokens.shape}."
            )
        mask = self._checked_mask(mask)
        model = in_compute_dtype(self, self.dtype)
        h = tokens.astype(compute_dtype(self.dtype))
        if mask is None:
            attend = jnp.ones((self.patches, self.patches), bool)
        else:
            attend = (mask[None, :] & mask[:, None]) | jnp.eye(self.patches, dtype=bool)
        h = apply_blocks(model.blocks, h, self.remat, lambda block, h: block(h, attend))
        h = layer_norm(model.final_norm, h)
        if mask is not None:
            h = jnp.where(mask[:, None], h, jnp.zeros((), h.dtype))
        return h.astype(jnp.float32)

    def _checked_mask(self, mask: Bool[Array, " patches"] | None) -> Bool[Array, " patches"] | None:
        if mask is None:
            return None
        if mask.shape != (self.patches,) or mask.dtype != jnp.bool_:
            raise ValueError(
                f"ViT's token mask must be boolean of shape ({self.patches},), got "
                f"{mask.dtype} {mask.shape}."
            )
        return mask
