"""The built-in objectives' registry entries that adapt a configuration's keyword arguments
to an objective's constructor (`dpo`, `grpo`, `diffusion`, `jepa`, `classifier`): `dew._registry`
names them as `dew._builtin_objectives:<name>` and imports this module (and JAX) only when one
is looked up (decision 0047)."""

from collections.abc import Callable, Mapping
from typing import Any

import jax

from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.nn.backbones.vit import ViT
from dew.objectives.classifier import INPUTS, ClassifierObjective, PooledClassifier
from dew.objectives.diffusion import DiffusionObjective, Sampling
from dew.objectives.dpo import DPOObjective
from dew.objectives.grpo import GRPOObjective
from dew.objectives.jepa import BlockMasks, JEPAObjective

__all__ = ["classifier", "diffusion", "dpo", "grpo", "jepa"]


def dpo(model: CausalTransformer, *, beta: float, reference: Any = None, **kwargs: Any) -> Any:
    """`DPOObjective(model, reference, beta, ...)`; the reference defaults to `model`
    itself (the frozen starting policy)."""
    return DPOObjective(
        policy=model, reference=model if reference is None else reference, beta=beta, **kwargs
    )


def diffusion(
    model: Any,
    *,
    sampling: Sampling | Mapping[str, Any] | None = None,
    label_dropout: float = 0.1,
    ema_decay: float | None = None,
    shape_scores: bool = False,
    prediction: str = "velocity",
) -> Any:
    """`DiffusionObjective(model, sampling=..., label_dropout=..., ema_decay=...,
    shape_scores=..., prediction=...)`; `sampling` may be the mapping of a `Sampling`'s
    fields (as a JSON configuration writes it)."""
    if isinstance(sampling, Mapping):
        sampling = Sampling(**sampling)
    return DiffusionObjective(
        model=model,
        sampling=Sampling() if sampling is None else sampling,
        label_dropout=label_dropout,
        ema_decay=ema_decay,
        shape_scores=shape_scores,
        prediction=prediction,
    )


def grpo(
    model: CausalTransformer,
    *,
    reward_fn: Callable[..., Any],
    group_size: int,
    max_new_tokens: int,
    reference: Any = None,
    **kwargs: Any,
) -> Any:
    """`GRPOObjective(model, reference, reward_fn, group_size, max_new_tokens, ...)`; the
    reference defaults to `model` itself (the frozen starting policy)."""
    return GRPOObjective(
        policy=model,
        reference=model if reference is None else reference,
        reward_fn=reward_fn,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        **kwargs,
    )


def jepa(
    model: ViT,
    *,
    key: Any,
    predictor: ViT | Mapping[str, Any] | None = None,
    ema_decay: float | None = 0.996,
    masks: BlockMasks | Mapping[str, Any] | None = None,
    probe_classes: int | None = None,
) -> Any:
    """`JEPAObjective(model, predictor, ...)` with `model` the encoder; `predictor` may be
    the mapping of the predictor ViT's `width`, `depth` and `heads` (default: the
    encoder's width and heads, depth 1), built on the encoder's grid from `key`, and
    `masks` the mapping of a `BlockMasks`' fields (as a JSON configuration writes them)."""
    if not isinstance(model, ViT):
        raise ValueError(f"objective 'jepa' needs a ViT encoder (model 'vit'), got {model!r}.")
    predictor_key, objective_key = jax.random.split(key)
    if predictor is None or isinstance(predictor, Mapping):
        shape: dict[str, Any] = {"width": model.width, "depth": 1, "heads": model.heads}
        unknown = sorted(set(predictor or {}) - set(shape))
        if unknown:
            raise ValueError(
                f"objective 'jepa' takes the predictor's width, depth and heads, got {unknown}."
            )
        shape.update(predictor or {})
        predictor = ViT(
            model.image_size, model.patch_size, model.channels, **shape, key=predictor_key
        )
    if isinstance(masks, Mapping):
        masks = BlockMasks(**masks)
    return JEPAObjective(
        model,
        predictor,
        ema_decay=ema_decay,
        masks=BlockMasks() if masks is None else masks,
        probe_classes=probe_classes,
        key=objective_key,
    )


def classifier(
    model: Any, *, key: Any, classes: int, inputs: str = INPUTS, name: str = "classifier"
) -> Any:
    """`ClassifierObjective(model, classes, inputs=...)`, with the class's default batch key
    (`"inputs"`; `shapes` yields `"images"`: `tiny_classifier` names it); a `ViT` model (one
    token per patch) gets a mean-pooled linear head to `classes` logits
    (`PooledClassifier`)."""
    if isinstance(model, ViT):
        model = PooledClassifier(model, model.width, classes, key=key)
    return ClassifierObjective(model, classes, inputs=inputs, name=name)
