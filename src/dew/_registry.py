"""Registries of the pieces a run configuration names: the `Registry` class, the argument
checks, and the model, objective and optimizer registries with dew's built-ins. The dataset
registry lives with `DataConfig` (`dew.config._data`); `dew.registry` gathers them all."""

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import jax
import optax

from dew.nn.backbones.bidirectional_transformer import BidirectionalTransformer
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.nn.backbones.dit import DiT
from dew.nn.backbones.vit import ViT
from dew.objectives.base import Objective
from dew.objectives.classifier import INPUTS, ClassifierObjective, PooledClassifier
from dew.objectives.diffusion import DiffusionObjective, Sampling
from dew.objectives.dpo import DPOObjective
from dew.objectives.grpo import GRPOObjective
from dew.objectives.jepa import BlockMasks, JEPAObjective
from dew.objectives.lm import LMObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective

__all__ = [
    "DATASET_SUPPLIED",
    "NotRegisteredError",
    "Registry",
    "check_arguments",
    "keyword_parameters",
    "models",
    "objectives",
    "optimizers",
]

T = TypeVar("T")


class NotRegisteredError(KeyError):
    """A name that no entry of a registry carries (a `KeyError` with a readable message):
    `requested` is the name, `registered` the names the registry holds."""

    __module__ = "dew.registry"  # where users import it from, and what tracebacks name

    def __init__(
        self, message: str, requested: str | None = None, registered: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.registered = registered

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def keyword_parameters(entry: Callable[..., Any]) -> tuple[tuple[str, ...], bool]:
    """The names `entry` accepts as keyword arguments, and whether it also takes any
    other keyword (a `**kwargs` parameter). An entry whose signature cannot be read
    accepts anything.

    ```python
    >>> keyword_parameters(lambda learning_rate, *, momentum=0.9, **rest: None)
    (('learning_rate', 'momentum'), True)

    ```
    """
    try:
        signature = inspect.signature(entry)
    except (TypeError, ValueError):
        return (), True
    names = tuple(
        parameter.name
        for parameter in signature.parameters.values()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    )
    extra = any(
        parameter.kind is parameter.VAR_KEYWORD for parameter in signature.parameters.values()
    )
    return names, extra


def check_arguments(
    kind: str,
    name: str,
    entry: Callable[..., Any],
    kwargs: Mapping[str, Any],
    *,
    supplied: tuple[str, ...] = (),
) -> None:
    """Raise a `TypeError` naming `kind` `name` and its parameters unless `kwargs`,
    together with the keyword arguments dew supplies itself (`supplied`), bind to
    `entry`'s signature.

    ```python
    >>> check_arguments("model", "mlp", lambda width, *, key: None, {"widht": 3},
    ...                 supplied=("key",))
    Traceback (most recent call last):
    ...
    TypeError: model 'mlp' does not take 'widht'; its parameters are 'width' ...

    ```
    """
    try:
        signature = inspect.signature(entry)
    except (TypeError, ValueError):
        return
    names, extra = keyword_parameters(entry)
    own = [parameter for parameter in names if parameter not in supplied]
    listed = ", ".join(repr(parameter) for parameter in own) or "none"
    if extra:
        listed += " and any other keyword"
    tail = f" (dew supplies {' and '.join(supplied)})" if supplied else ""
    for key in kwargs:
        if key in supplied:
            raise TypeError(
                f"{kind} {name!r} does not take {key!r} from its config: dew supplies it. "
                f"Its parameters are {listed}."
            )
        if key not in names and not extra:
            raise TypeError(
                f"{kind} {name!r} does not take {key!r}; its parameters are {listed}{tail}."
            )
    placeholders = dict.fromkeys(supplied)
    try:
        signature.bind(**placeholders, **kwargs)
    except TypeError as error:
        missing = [
            parameter.name
            for parameter in signature.parameters.values()
            if parameter.default is parameter.empty
            and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            and parameter.name not in kwargs
            and parameter.name not in supplied
        ]
        if missing:
            needed = ", ".join(repr(parameter) for parameter in missing)
            raise TypeError(
                f"{kind} {name!r} needs {needed}; its parameters are {listed}{tail}."
            ) from None
        raise TypeError(
            f"{kind} {name!r} cannot be called with {dict(kwargs)!r}: {error}. Its parameters "
            f"are {listed}{tail}."
        ) from None


class Registry(Generic[T]):
    """Named entries of one kind (models, objectives, optimizers, ...).

    - `register(name, entry)` adds an entry and returns it; `register(name)` returns a
      decorator that does the same. Registering a name twice raises unless
      `replace=True`.
    - `registry[name]` is the entry; an unknown name raises `NotRegisteredError` (a
      `KeyError`) listing the registered names.
    - `name in registry`, `names()` (sorted), `len(registry)`, iteration over names.
    - `unregister(name)` removes an entry (for tests and plugins that clean up).

    ```python
    >>> activations = Registry("activation")
    >>> @activations.register("double")
    ... def double(x):
    ...     return 2 * x
    >>> activations["double"](3), activations.names()
    (6, ('double',))
    >>> activations["triple"]
    Traceback (most recent call last):
    ...
    dew.registry.NotRegisteredError: no activation is registered as 'triple'; registered: 'double'.

    ```
    """

    def __init__(self, kind: str, check: Callable[[str, Any], None] | None = None):
        self.kind = kind
        self._check = check
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None, *, replace: bool = False) -> Any:
        """Register `entry` under `name` and return it; without `entry`, return a
        decorator that registers what it decorates."""
        _check_name(self.kind, name)
        if entry is None:

            def decorator(entry: T) -> T:
                return self.register(name, entry, replace=replace)

            return decorator
        if not callable(entry):
            raise TypeError(
                f"a {self.kind} entry must be callable, got {entry!r} of type "
                f"{type(entry).__name__} for {name!r}."
            )
        if name in self._entries and not replace:
            raise ValueError(
                f"a {self.kind} is already registered as {name!r}; pass replace=True to "
                "replace it, or choose another name."
            )
        if self._check is not None:
            self._check(name, entry)
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove the entry registered as `name`."""
        self._entry(name)
        del self._entries[name]

    def _entry(self, name: str) -> T:
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} names are strings, got {name!r}.")
        if name not in self._entries:
            known = ", ".join(repr(known) for known in self.names()) or "none"
            raise NotRegisteredError(
                f"no {self.kind} is registered as {name!r}; registered: {known}.",
                name,
                self.names(),
            )
        return self._entries[name]

    def __getitem__(self, name: str) -> Any:
        return self._entry(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}, names={list(self.names())!r})"


DATASET_SUPPLIED = ("batch_size", "seed")


def _check_name(kind: str, name: object) -> None:
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(
            f"a {kind} name must be a non-empty string without surrounding whitespace, "
            f"got {name!r}."
        )


def _takes(kind: str, name: str, entry: Any, keywords: tuple[str, ...]) -> None:
    names, extra = keyword_parameters(entry)
    missing = [keyword for keyword in keywords if keyword not in names and not extra]
    if missing:
        needed = ", ".join(repr(keyword) for keyword in missing)
        raise TypeError(
            f"{kind} {name!r} must take the keyword argument(s) {needed}, which dew supplies; "
            f"it takes {', '.join(repr(parameter) for parameter in names) or 'none'}."
        )


models: Registry[Callable[..., Any]] = Registry(
    "model", lambda name, entry: _takes("model", name, entry, ("key",))
)
objectives: Registry[Callable[..., Objective]] = Registry("objective")
optimizers: Registry[Callable[..., optax.GradientTransformation]] = Registry(
    "optimizer", lambda name, entry: _takes("optimizer", name, entry, ("learning_rate",))
)
models.register("causal_transformer", CausalTransformer)
models.register("bidirectional_transformer", BidirectionalTransformer)
models.register("dit", DiT)
models.register("vit", ViT)

optimizers.register("adam", optax.adam)
optimizers.register("adamw", optax.adamw)
optimizers.register("sgd", optax.sgd)
optimizers.register("lion", optax.lion)
optimizers.register("adafactor", optax.adafactor)
optimizers.register("rmsprop", optax.rmsprop)


def _dpo(model: CausalTransformer, *, beta: float, reference: Any = None, **kwargs: Any) -> Any:
    """`DPOObjective(model, reference, beta, ...)`; the reference defaults to `model`
    itself (the frozen starting policy)."""
    return DPOObjective(model, model if reference is None else reference, beta, **kwargs)


def _diffusion(
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
        model,
        sampling=Sampling() if sampling is None else sampling,
        label_dropout=label_dropout,
        ema_decay=ema_decay,
        shape_scores=shape_scores,
        prediction=prediction,
    )


def _grpo(
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
        model,
        model if reference is None else reference,
        reward_fn,
        group_size,
        max_new_tokens,
        **kwargs,
    )


def _jepa(
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
        shape = {"width": model.width, "depth": 1, "heads": model.heads}
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


def _classifier(
    model: Any, *, key: Any, classes: int, inputs: str = INPUTS, name: str = "classifier"
) -> Any:
    """`ClassifierObjective(model, classes, inputs=...)`, with the class's default batch key
    (`"inputs"`; `shapes` yields `"images"`: `tiny_classifier` names it); a `ViT` model (one
    token per patch) gets a mean-pooled linear head to `classes` logits
    (`PooledClassifier`)."""
    if isinstance(model, ViT):
        model = PooledClassifier(model, model.width, classes, key=key)
    return ClassifierObjective(model, classes, inputs=inputs, name=name)


objectives.register("lm", LMObjective)
objectives.register("masked_diffusion", MaskedDiffusionObjective)
objectives.register("dpo", _dpo)
objectives.register("grpo", _grpo)
objectives.register("diffusion", _diffusion)
objectives.register("jepa", _jepa)
objectives.register("classifier", _classifier)
