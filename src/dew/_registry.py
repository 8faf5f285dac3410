"""Registries of the pieces a run configuration names: the `Registry` class, the argument
checks, and the model, objective and optimizer registries with dew's built-ins. The dataset
registry lives with `DataConfig` (`dew.config._data`); `dew.registry` gathers them all.

A built-in entry is held as the `"module:attribute"` that defines it and imported when its
name is first looked up, so naming, listing and checking names (a configuration's schema,
`dew config show`) imports no model, objective or optimizer, and no JAX (decision 0047)."""

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import optax

    from dew.objectives.base import Objective

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


class _Builtin:
    """A built-in registry entry not imported yet: the `"module:attribute"` that defines it
    (a plain value, so a copy of a registry's entries holds it as it is)."""

    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        self.target = target

    def resolve(self) -> Any:
        """The entry itself: its module imported, its attribute read."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __repr__(self) -> str:
        return f"_Builtin({self.target!r})"


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
        self._entries: dict[str, T | _Builtin] = {}

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

    def _register_builtin(self, name: str, target: str) -> None:
        """Register the built-in `target` (`"module:attribute"`) under `name`, imported and
        checked when `name` is first looked up (`_entry`); listing names imports nothing."""
        _check_name(self.kind, name)
        if name in self._entries:
            raise ValueError(f"a {self.kind} is already registered as {name!r}.")
        self._entries[name] = _Builtin(target)

    def unregister(self, name: str) -> None:
        """Remove the entry registered as `name`."""
        self._known(name)
        del self._entries[name]

    def _known(self, name: str) -> None:
        """Raise unless `name` is a registered name (without importing a built-in's entry)."""
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} names are strings, got {name!r}.")
        if name not in self._entries:
            known = ", ".join(repr(known) for known in self.names()) or "none"
            raise NotRegisteredError(
                f"no {self.kind} is registered as {name!r}; registered: {known}.",
                name,
                self.names(),
            )

    def _entry(self, name: str) -> T:
        self._known(name)
        entry = self._entries[name]
        if isinstance(entry, _Builtin):
            resolved = entry.resolve()
            if self._check is not None:
                self._check(name, resolved)
            self._entries[name] = resolved
            return resolved
        return entry

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
objectives: "Registry[Callable[..., Objective]]" = Registry("objective")
optimizers: "Registry[Callable[..., optax.GradientTransformation]]" = Registry(
    "optimizer", lambda name, entry: _takes("optimizer", name, entry, ("learning_rate",))
)


def _register_builtins(registry: Registry[Any], targets: Mapping[str, str]) -> None:
    for name, target in targets.items():
        registry._register_builtin(name, target)


_register_builtins(
    models,
    {
        "causal_transformer": "dew.nn.backbones.causal_transformer:CausalTransformer",
        "bidirectional_transformer": (
            "dew.nn.backbones.bidirectional_transformer:BidirectionalTransformer"
        ),
        "dit": "dew.nn.backbones.dit:DiT",
        "vit": "dew.nn.backbones.vit:ViT",
    },
)
_register_builtins(
    optimizers,
    {name: f"optax:{name}" for name in ("adam", "adamw", "sgd", "lion", "adafactor", "rmsprop")},
)
_register_builtins(
    objectives,
    {
        "lm": "dew.objectives.lm:LMObjective",
        "masked_diffusion": "dew.objectives.masked_diffusion:MaskedDiffusionObjective",
        # entries that adapt a configuration's keyword arguments to the objective's class
        **{
            name: f"dew._builtin_objectives:{name}"
            for name in ("dpo", "grpo", "diffusion", "jepa", "classifier")
        },
    },
)
