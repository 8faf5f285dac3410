"""Dotted-path overrides: the paths a run configuration declares and `override`, which sets them."""

import difflib
from collections.abc import Mapping
from typing import Any

from dew import _registry as registry
from dew.config._config import RunConfig, UndeclaredPathError
from dew.config._data import DatasetRegistry, datasets
from dew.config._fields import _thaw

__all__ = ["declared_paths", "override"]

_BUILDERS = {
    "model": (registry.models, ("key",)),
    "data": (datasets, registry.DATASET_SUPPLIED),
    "optim": (registry.optimizers, ("learning_rate", "weight_decay")),
    "objective": (registry.objectives, ("model",)),
}


def _builder_keywords(tree: Mapping[str, Any], section: str) -> tuple[tuple[str, ...], bool]:
    """The keyword arguments the section's registered builder takes beyond those dew
    supplies, and whether it takes any keyword; nothing when it is not registered."""
    table, supplied = _BUILDERS[section]
    values = tree.get(section)
    name = values.get("optimizer" if section == "optim" else "name") if values else None
    if not isinstance(name, str) or name not in table:
        return (), False
    entry = table.builder(name) if isinstance(table, DatasetRegistry) else table[name]
    names, extra = registry.keyword_parameters(entry)
    return tuple(key for key in names if key not in supplied), extra


def _paths(tree: Mapping[str, Any]) -> list[str]:
    paths: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        paths.append(prefix)
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)

    for section, values in tree.items():
        walk(section, values)
        if section in _BUILDERS:
            kwargs = values.get("kwargs", {})
            for key in _builder_keywords(tree, section)[0]:
                if key not in kwargs:
                    paths.append(f"{section}.kwargs.{key}")
    return paths


def declared_paths(config: "RunConfig") -> tuple[str, ...]:
    """The dotted paths `override` accepts for `config`: every section and field, every
    key inside a `kwargs` mapping, and each keyword argument the registered model,
    dataset or optimizer takes that `kwargs` does not set yet.

    ```python
    >>> from dew.config import DataConfig, ModelConfig
    >>> config = RunConfig(ModelConfig("causal_transformer"), DataConfig("token_windows"))
    >>> [path for path in declared_paths(config) if path.startswith("model.")][:4]
    ['model.name', 'model.kwargs', 'model.kwargs.vocab_size', 'model.kwargs.emb_features']

    ```
    """
    return tuple(_paths(config.to_dict()))


def _declares(tree: Mapping[str, Any], segments: list[str]) -> bool:
    node: Any = tree
    for segment in segments[:-1]:
        if not isinstance(node, Mapping) or segment not in node:
            return False
        node = node[segment]
    if isinstance(node, Mapping) and segments[-1] in node:
        return True
    if len(segments) == 3 and segments[1] == "kwargs" and segments[0] in _BUILDERS:
        names, extra = _builder_keywords(tree, segments[0])
        return segments[2] in names or (extra and segments[2].isidentifier())
    return False


def override(config: RunConfig, point: Mapping[str, Any]) -> RunConfig:
    """`config` with each dotted path of `point` set to its value, through `to_dict` and
    `from_dict`, so every value is validated as if it were loaded.

    Declared paths (`declared_paths`) are the config's fields and sections, the keys
    already inside a `kwargs` mapping (at any depth), and a new top-level `kwargs` key
    only where the registered builder takes that keyword argument. Any other path
    raises `UndeclaredPathError` (a `KeyError`) naming the nearest declared paths, so
    a typo never trains the unchanged config. Paths apply in order.

    ```python
    >>> from dew.config import DataConfig, ModelConfig
    >>> config = RunConfig(
    ...     model=ModelConfig("causal_transformer", {"vocab_size": 16, "emb_features": 16,
    ...                       "num_layers": 1, "num_heads": 2, "mlp_features": 32,
    ...                       "max_seq_len": 16}),
    ...     data=DataConfig("token_windows", {"seq_len": 8}),
    ... )
    >>> tuned = override(config, {"optim.learning_rate": 0.01, "model.kwargs.emb_features": 32})
    >>> tuned.optim.learning_rate, tuned.model.kwargs["emb_features"]
    (0.01, 32)
    >>> override(config, {"optim.learning_rat": 0.01})
    Traceback (most recent call last):
    ...
    dew.config._config.UndeclaredPathError: override path 'optim.learning_rat' is not declared by
    RunConfig; nearest declared paths: 'optim.learning_rate'.

    ```
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"override needs a RunConfig, got {type(config).__name__}.")
    if not isinstance(point, Mapping):
        raise TypeError(
            f"override needs a mapping of dotted paths to values, got {type(point).__name__}."
        )
    tree = config.to_dict()
    for path, value in point.items():
        if not isinstance(path, str):
            raise TypeError(
                f"override paths are dotted strings such as 'optim.learning_rate', got {path!r}."
            )
        segments = path.split(".")
        if not _declares(tree, segments):
            raise UndeclaredPathError(_undeclared(tree, path))
        node = tree
        for segment in segments[:-1]:
            node = node[segment]
        node[segments[-1]] = _thaw(value)
    try:
        return RunConfig.from_dict(tree)
    except (TypeError, ValueError) as error:
        error.add_note(f"(while applying the override {dict(point)!r})")
        raise


def _nearest(path: str, declared: list[str]) -> list[str]:
    """Up to three declared paths about as close to `path` as the closest one, so a
    shared prefix such as `model.kwargs.` does not bring in unrelated keys."""
    close = difflib.get_close_matches(path, declared, n=5, cutoff=0.75)
    if not close:
        return []
    ratios = [difflib.SequenceMatcher(None, path, near).ratio() for near in close]
    return [near for near, ratio in zip(close, ratios, strict=True) if ratio >= ratios[0] - 0.05][
        :3
    ]


def _undeclared(tree: Mapping[str, Any], path: str) -> str:
    declared = _paths(tree)
    message = f"override path {path!r} is not declared by RunConfig; "
    nearest = _nearest(path, declared)
    segments = path.split(".")
    if nearest:
        message += "nearest declared paths: " + ", ".join(repr(near) for near in nearest) + "."
    else:
        if segments[0] in tree:
            declared = [near for near in declared if near.split(".")[0] == segments[0]]
        message += "declared paths: " + ", ".join(repr(near) for near in declared) + "."
    if len(segments) == 3 and segments[1] == "kwargs" and segments[0] in _BUILDERS:
        section = segments[0]
        name = tree[section].get("optimizer" if section == "optim" else "name")
        table = _BUILDERS[section][0]
        if name not in table:
            message += (
                f" ({section} {name!r} is not registered in dew.registry, so only its existing "
                "kwargs are declared.)"
            )
    return message
