"""open_clip's CLIP (a ViT image tower and a causal text transformer) as an Equinox module,
loading open_clip's state dicts without torch."""

import dataclasses
import os
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int

from dew._checks import check_ids
from dew.io import load_torch_state_dict
from dew.nn.clip._preprocess import preprocess

__all__ = ["CLIP", "CLIPConfig", "MODELS"]

_LN_EPS = 1e-5
# Not weights of the towers: the contrastive temperature (unused by a score), a causal mask
# scripted models keep, and the hyperparameters OpenAI's TorchScript files hold (open_clip's
# build_model_from_openai_state_dict drops the same three).
_IGNORED = frozenset(
    {"logit_scale", "logit_bias", "attn_mask", "input_resolution", "context_length", "vocab_size"}
)


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    """The shape of a CLIP model, as open_clip's model configs give it (the defaults are
    `ViT-B-32`). `quick_gelu` picks `x * sigmoid(1.702 x)` over exact GELU: OpenAI's own
    weights (and open_clip's `-quickgelu` configs) were trained with it, most LAION/DataComp
    weights without. Weights do not tell the two apart: choosing wrong silently changes the
    features."""

    embed_dim: int = 512
    image_size: int = 224
    patch_size: int = 32
    vision_width: int = 768
    vision_layers: int = 12
    vision_heads: int = 12
    context_length: int = 77
    vocab_size: int = 49408
    text_width: int = 512
    text_layers: int = 12
    text_heads: int = 8
    quick_gelu: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "quick_gelu":
                if not isinstance(value, bool):
                    raise TypeError(f"CLIPConfig.quick_gelu must be a bool, got {value!r}.")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CLIPConfig.{field.name} must be an int >= 1, got {value!r}.")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"CLIPConfig.image_size {self.image_size} must be a multiple of patch_size "
                f"{self.patch_size}."
            )
        for tower in ("vision", "text"):
            width, heads = getattr(self, f"{tower}_width"), getattr(self, f"{tower}_heads")
            if width % heads:
                raise ValueError(
                    f"CLIPConfig.{tower}_width {width} must be a multiple of {tower}_heads {heads}."
                )


# open_clip's model_configs (vision heads = width // 64, its head width).
MODELS: dict[str, CLIPConfig] = {
    "ViT-B-32": CLIPConfig(),
    "ViT-B-16": CLIPConfig(patch_size=16),
    "ViT-L-14": CLIPConfig(
        embed_dim=768, patch_size=14, vision_width=1024, vision_layers=24, vision_heads=16,
        text_width=768, text_heads=12,
    ),
}  # fmt: skip


def _parameter_shapes(config: CLIPConfig) -> dict[str, tuple[int, ...]]:
    """Every array open_clip's `CLIP.state_dict()` holds for `config`, with its shape."""
    c = config
    grid = c.image_size // c.patch_size
    shapes = {
        "positional_embedding": (c.context_length, c.text_width),
        "text_projection": (c.text_width, c.embed_dim),
        "visual.class_embedding": (c.vision_width,),
        "visual.positional_embedding": (grid * grid + 1, c.vision_width),
        "visual.proj": (c.vision_width, c.embed_dim),
        "visual.conv1.weight": (c.vision_width, 3, c.patch_size, c.patch_size),
        "visual.ln_pre.weight": (c.vision_width,),
        "visual.ln_pre.bias": (c.vision_width,),
        "visual.ln_post.weight": (c.vision_width,),
        "visual.ln_post.bias": (c.vision_width,),
        "token_embedding.weight": (c.vocab_size, c.text_width),
        "ln_final.weight": (c.text_width,),
        "ln_final.bias": (c.text_width,),
    }
    towers = (
        ("visual.transformer", c.vision_width, c.vision_layers),
        ("transformer", c.text_width, c.text_layers),
    )
    for prefix, width, layers in towers:
        for i in range(layers):
            block = f"{prefix}.resblocks.{i}"
            for name, shape in {
                "ln_1.weight": (width,),
                "ln_1.bias": (width,),
                "attn.in_proj_weight": (3 * width, width),
                "attn.in_proj_bias": (3 * width,),
                "attn.out_proj.weight": (width, width),
                "attn.out_proj.bias": (width,),
                "ln_2.weight": (width,),
                "ln_2.bias": (width,),
                "mlp.c_fc.weight": (4 * width, width),
                "mlp.c_fc.bias": (4 * width,),
                "mlp.c_proj.weight": (width, 4 * width),
                "mlp.c_proj.bias": (width,),
            }.items():
                shapes[f"{block}.{name}"] = shape
    return shapes


def _checked_state(state: Mapping[str, np.ndarray], config: CLIPConfig, model: str) -> dict:
    """`state` as float32 arrays, after checking it holds exactly `config`'s arrays."""
    expected = _parameter_shapes(config)
    present = {key for key in state if key not in _IGNORED}
    missing, unexpected = sorted(expected.keys() - present), sorted(present - expected.keys())
    if missing or unexpected:
        raise ValueError(
            f"The state dict is not open_clip's {model}: missing {len(missing)} arrays "
            f"{missing[:4]}, unexpected {len(unexpected)} {unexpected[:4]} (is it another model "
            "or a checkpoint with other key names?)."
        )
    for key, shape in expected.items():
        if tuple(np.shape(state[key])) != shape:
            raise ValueError(
                f"The state dict's {key!r} has shape {tuple(np.shape(state[key]))}; {model} "
                f"needs {shape}."
            )
    return {key: jnp.asarray(np.asarray(state[key], np.float32)) for key in expected}


class _LayerNorm(eqx.Module):
    weight: Float[Array, " width"]
    bias: Float[Array, " width"]

    def __call__(self, x: Float[Array, "... width"]) -> Float[Array, "... width"]:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * lax.rsqrt(variance + _LN_EPS) * _last(self.weight, x) + _last(
            self.bias, x
        )


def _last(vector: Array, like: Array) -> Array:
    """`vector` shaped to broadcast along the last axis of `like` (rank promotion is explicit)."""
    return vector.reshape((1,) * (like.ndim - 1) + vector.shape)


def _layer_norm(p: Mapping[str, Array], name: str) -> _LayerNorm:
    return _LayerNorm(p[f"{name}.weight"], p[f"{name}.bias"])


class _Block(eqx.Module):
    """open_clip's ResidualAttentionBlock: pre-norm attention, pre-norm MLP."""

    ln_1: _LayerNorm
    qkv_weight: Float[Array, "three_width width"]
    qkv_bias: Float[Array, " three_width"]
    out_weight: Float[Array, "width width"]
    out_bias: Float[Array, " width"]
    ln_2: _LayerNorm
    fc_weight: Float[Array, "hidden width"]
    fc_bias: Float[Array, " hidden"]
    proj_weight: Float[Array, "width hidden"]
    proj_bias: Float[Array, " width"]
    heads: int = eqx.field(static=True)
    quick_gelu: bool = eqx.field(static=True)

    def __init__(self, p: Mapping[str, Array], name: str, heads: int, quick_gelu: bool):
        self.ln_1, self.ln_2 = _layer_norm(p, f"{name}.ln_1"), _layer_norm(p, f"{name}.ln_2")
        self.qkv_weight = p[f"{name}.attn.in_proj_weight"]
        self.qkv_bias = p[f"{name}.attn.in_proj_bias"]
        self.out_weight = p[f"{name}.attn.out_proj.weight"]
        self.out_bias = p[f"{name}.attn.out_proj.bias"]
        self.fc_weight, self.fc_bias = p[f"{name}.mlp.c_fc.weight"], p[f"{name}.mlp.c_fc.bias"]
        self.proj_weight = p[f"{name}.mlp.c_proj.weight"]
        self.proj_bias = p[f"{name}.mlp.c_proj.bias"]
        self.heads, self.quick_gelu = heads, quick_gelu

    def __call__(self, x: Float[Array, "rows tokens width"], causal: bool) -> Array:
        rows, tokens, width = x.shape
        per_head = width // self.heads
        qkv = self.ln_1(x) @ self.qkv_weight.T + _last(self.qkv_bias, x)
        q, k, v = (
            part.reshape(rows, tokens, self.heads, per_head).transpose(0, 2, 1, 3)
            for part in jnp.split(qkv, 3, axis=-1)
        )
        scores = (q / np.float32(np.sqrt(per_head))) @ k.transpose(0, 1, 3, 2)
        if causal:
            allowed = jnp.tril(jnp.ones((1, 1, tokens, tokens), bool))
            scores = jnp.where(allowed, scores, -jnp.inf)
        attended = jax.nn.softmax(scores, axis=-1) @ v
        attended = attended.transpose(0, 2, 1, 3).reshape(rows, tokens, width)
        x = x + attended @ self.out_weight.T + _last(self.out_bias, x)
        h = self.ln_2(x) @ self.fc_weight.T + _last(self.fc_bias, x)
        h = h * jax.nn.sigmoid(1.702 * h) if self.quick_gelu else jax.nn.gelu(h, approximate=False)
        return x + h @ self.proj_weight.T + _last(self.proj_bias, x)


class CLIP(eqx.Module):
    """open_clip's CLIP: `encode_image` and `encode_text` give the towers' projected
    features (not normalised), as open_clip's `encode_image` / `encode_text` do.

    Build one from a state dict with open_clip's key names (`CLIP(state_dict, config)`), or
    read a checkpoint with `CLIP.load`. Every array is float32 (half-precision checkpoints
    are widened on load).
    """

    config: CLIPConfig = eqx.field(static=True)
    patch_weight: Float[Array, "width 3 patch patch"]
    class_embedding: Float[Array, " width"]
    vision_positions: Float[Array, "tokens width"]
    ln_pre: _LayerNorm
    vision_blocks: tuple[_Block, ...]
    ln_post: _LayerNorm
    vision_projection: Float[Array, "width embed"]
    token_embedding: Float[Array, "vocab text_width"]
    text_positions: Float[Array, "context text_width"]
    text_blocks: tuple[_Block, ...]
    ln_final: _LayerNorm
    text_projection: Float[Array, "text_width embed"]

    def __init__(
        self,
        state_dict: Mapping[str, np.ndarray],
        config: CLIPConfig = MODELS["ViT-B-32"],
        *,
        model: str = "CLIP",
    ):
        p = _checked_state(state_dict, config, model)
        self.config = config
        self.patch_weight = p["visual.conv1.weight"]
        self.class_embedding = p["visual.class_embedding"]
        self.vision_positions = p["visual.positional_embedding"]
        self.ln_pre, self.ln_post = (
            _layer_norm(p, "visual.ln_pre"),
            _layer_norm(p, "visual.ln_post"),
        )
        self.vision_blocks = tuple(
            _Block(p, f"visual.transformer.resblocks.{i}", config.vision_heads, config.quick_gelu)
            for i in range(config.vision_layers)
        )
        self.vision_projection = p["visual.proj"]
        self.token_embedding = p["token_embedding.weight"]
        self.text_positions = p["positional_embedding"]
        self.text_blocks = tuple(
            _Block(p, f"transformer.resblocks.{i}", config.text_heads, config.quick_gelu)
            for i in range(config.text_layers)
        )
        self.ln_final = _layer_norm(p, "ln_final")
        self.text_projection = p["text_projection"]

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        model: str | CLIPConfig = "ViT-B-32",
        quick_gelu: bool = False,
    ) -> "CLIP":
        """Read a CLIP checkpoint without torch (`dew.io.load_torch_state_dict`):
        `open_clip_model.safetensors`, `open_clip_pytorch_model.bin` (a `torch.save` zip), a
        legacy `.pth`, a training checkpoint holding them under `"state_dict"` (a `module.`
        prefix is removed), or OpenAI's TorchScript `.pt` (half precision, QuickGELU: pass
        `quick_gelu=True`), whose parameters are read and whose code never runs.

        **Arguments:**

        - `path`: the checkpoint file.
        - `model`: a name of `MODELS` (`"ViT-B-32"`, `"ViT-B-16"`, `"ViT-L-14"`) or a
          `CLIPConfig`.
        - `quick_gelu`: QuickGELU activations (OpenAI's weights, open_clip's `-quickgelu`
          names); overrides the config's.

        **Raises:** `FileNotFoundError` without a file; `ValueError` naming the file when it
        is in none of these formats or damaged, or naming the arrays that are not the
        model's.
        """
        if isinstance(model, str):
            if model not in MODELS:
                raise ValueError(f"Unknown CLIP model {model!r}; known: {sorted(MODELS)}.")
            name, config = model, MODELS[model]
        elif isinstance(model, CLIPConfig):
            name, config = "CLIP", model
        else:
            raise TypeError(f"model must be a name or a CLIPConfig, got {model!r}.")
        if not isinstance(quick_gelu, bool):
            raise TypeError(f"quick_gelu must be a bool, got {quick_gelu!r}.")
        state = load_torch_state_dict(path)
        return cls(state, dataclasses.replace(config, quick_gelu=quick_gelu), model=name)

    def encode_image(self, images: Float[Array, "rows height width channels"]) -> Array:
        """Image features `(rows, embed_dim)` of `images` in `[0, 1]` (channels last, 1 or 3
        channels, any size), after open_clip's preprocessing (see `preprocess`)."""
        x = preprocess(images, self.config.image_size)
        patch = self.config.patch_size
        x = lax.conv_general_dilated(
            x,
            self.patch_weight,
            (patch, patch),
            "VALID",
            dimension_numbers=("NHWC", "OIHW", "NHWC"),
        )
        rows, width = x.shape[0], x.shape[-1]
        x = x.reshape(rows, -1, width)
        first = jnp.broadcast_to(self.class_embedding, (rows, 1, width))
        x = self.ln_pre(jnp.concatenate([first, x], axis=1) + self.vision_positions[None])
        for block in self.vision_blocks:
            x = block(x, causal=False)
        return self.ln_post(x[:, 0]) @ self.vision_projection

    def encode_text(self, token_ids: Int[Array, "rows tokens"]) -> Array:
        """Text features `(rows, embed_dim)` of token rows (`dew.nn.clip.tokenize`), each
        pooled at its `<end_of_text>`, the row's largest ID."""
        if np.ndim(token_ids) != 2 or not 1 <= np.shape(token_ids)[1] <= self.config.context_length:
            raise ValueError(
                f"CLIP reads token rows (rows, tokens) with at most {self.config.context_length} "
                f"tokens, got shape {tuple(np.shape(token_ids))}."
            )
        token_ids = check_ids(
            token_ids,
            self.config.vocab_size,
            subject="CLIP.encode_text's token_ids",
            noun="token ID",
            size_name="vocab_size",
            axes=("row", "position"),
        )
        x = self.token_embedding[token_ids] + self.text_positions[None, : token_ids.shape[1]]
        for block in self.text_blocks:
            x = block(x, causal=True)
        x = self.ln_final(x)
        pooled = x[jnp.arange(x.shape[0]), jnp.argmax(token_ids, axis=-1)]
        return pooled @ self.text_projection
