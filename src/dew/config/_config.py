"""Run configurations as frozen, validated, plain-data dataclasses."""

import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import optax
from jaxtyping import PRNGKeyArray

from dew import _registry as registry
from dew.config import _recipe
from dew.config._data import DataConfig, DatasetRegistry, datasets
from dew.config._fields import (
    _EMPTY,
    _WHERE,
    SCHEDULES,
    SEED_LIMIT,
    _building,
    _integer,
    _kwargs,
    _real,
    _registry_name,
    _run_name,
    _Section,
    _set,
    _string,
    _thaw,
    _where,
)
from dew.data import Dataset

__all__ = [
    "SCHEDULES",
    "DataConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "OptimConfig",
    "RunConfig",
    "TrainerConfig",
    "UndeclaredPathError",
    "declared_paths",
    "override",
]


class UndeclaredPathError(KeyError):
    """An override path that the config does not declare (a `KeyError` whose message
    names the nearest declared paths)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """A model by registered name (`dew.registry.models`) and its keyword arguments.

    `kwargs` is stored read-only (nested lists as tuples, mappings as read-only
    mappings) and passed as it is to the builder; `key` is supplied by `build`.

    ```python
    >>> import jax
    >>> config = ModelConfig("causal_transformer", {"vocab_size": 4, "emb_features": 16,
    ...                      "num_layers": 1, "num_heads": 2, "mlp_features": 32,
    ...                      "max_seq_len": 16})
    >>> type(config.build(key=jax.random.key(0))).__name__
    'CausalTransformer'

    ```
    """

    name: str
    kwargs: Mapping[str, Any] = _EMPTY

    def __post_init__(self) -> None:
        where = _where(self)
        _set(self, "name", _registry_name(f"{where}.name", self.name))
        reserved = {"key": "ModelConfig.build supplies the initialisation key"}
        _set(self, "kwargs", _kwargs(f"{where}.kwargs", self.kwargs, reserved))

    def build(self, *, key: PRNGKeyArray) -> Any:
        """The model: `dew.registry.models[name](**kwargs, key=key)`."""
        builder = registry.models[self.name]
        registry.check_arguments("model", self.name, builder, self.kwargs, supplied=("key",))
        return builder(**self.kwargs, key=key)


@dataclasses.dataclass(frozen=True)
class OptimConfig(_Section):
    """An optimizer by registered name (`dew.registry.optimizers`), its learning-rate
    schedule, weight decay and gradient clipping.

    - `schedule`: `"constant"`; `"cosine"` and `"linear"` decay to 0 at the run's last
      step; `"warmup_cosine"` is optax's name for `"cosine"` with warmup, and behaves as
      `"cosine"`.
    - `warmup_steps`: with any schedule, the learning rate first rises linearly from 0
      over these steps; the schedule then runs over the remaining steps.
    - `weight_decay`: passed as the optimizer's own `weight_decay` argument when it has
      one (`adamw`, `lion`: decoupled decay); for the others (`adam`, `sgd`,
      `adafactor`, `rmsprop`, ...) a value `> 0` chains `optax.add_decayed_weights`
      before the optimizer (L2 regularisation through the gradient).
    - `clipping`: when set, `optax.clip_by_global_norm(clipping)` comes first.
    - `kwargs`: further keyword arguments of the optimizer (`b1`, `momentum`, ...).

    ```python
    >>> schedule = OptimConfig(learning_rate=0.1, schedule="linear").learning_rate_schedule(10)
    >>> [round(float(schedule(step)), 3) for step in (0, 5, 10)]
    [0.1, 0.05, 0.0]

    ```
    """

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    schedule: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    clipping: float | None = None
    kwargs: Mapping[str, Any] = _EMPTY

    def __post_init__(self) -> None:
        where = _where(self)
        _set(self, "optimizer", _registry_name(f"{where}.optimizer", self.optimizer))
        rate = _real(f"{where}.learning_rate", self.learning_rate, positive=True)
        _set(self, "learning_rate", rate)
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            allowed = ", ".join(repr(name) for name in SCHEDULES)
            raise ValueError(f"{where}.schedule {self.schedule!r} is not one of {allowed}.")
        _set(self, "schedule", str.__str__(self.schedule))
        _set(self, "warmup_steps", _integer(f"{where}.warmup_steps", self.warmup_steps, least=0))
        decay = _real(f"{where}.weight_decay", self.weight_decay, positive=False)
        _set(self, "weight_decay", decay)
        clipping = _real(f"{where}.clipping", self.clipping, positive=True, optional=True)
        _set(self, "clipping", clipping)
        reserved = {
            "learning_rate": f"set {where}.learning_rate",
            "weight_decay": f"set {where}.weight_decay",
        }
        _set(self, "kwargs", _kwargs(f"{where}.kwargs", self.kwargs, reserved))

    def learning_rate_schedule(self, steps: int) -> optax.Schedule:
        """The learning rate at each step of a run of `steps` steps."""
        steps = _integer("OptimConfig.learning_rate_schedule steps", steps, least=1)
        if self.warmup_steps > steps:
            raise ValueError(
                f"OptimConfig.warmup_steps ({self.warmup_steps}) must not exceed the run's "
                f"steps ({steps})."
            )
        remaining = max(steps - self.warmup_steps, 1)
        rate = self.learning_rate
        if self.schedule == "constant":
            main = optax.constant_schedule(rate)
        elif self.schedule == "linear":
            main = optax.linear_schedule(rate, 0.0, remaining)
        else:
            main = optax.cosine_decay_schedule(rate, remaining)
        if not self.warmup_steps:
            return main
        warmup = optax.linear_schedule(0.0, rate, self.warmup_steps)
        return optax.join_schedules([warmup, main], [self.warmup_steps])

    def build(self, steps: int) -> optax.GradientTransformation:
        """The optimizer for a run of `steps` steps: clipping, then decay where the
        optimizer has none of its own, then the optimizer on the schedule."""
        factory = registry.optimizers[self.optimizer]
        names, _ = registry.keyword_parameters(factory)
        decoupled = "weight_decay" in names
        supplied = ("learning_rate", "weight_decay") if decoupled else ("learning_rate",)
        registry.check_arguments(
            "optimizer", self.optimizer, factory, self.kwargs, supplied=supplied
        )
        schedule = self.learning_rate_schedule(steps)
        learning_rate = (
            self.learning_rate
            if self.schedule == "constant" and not self.warmup_steps
            else schedule
        )
        extra = {"weight_decay": self.weight_decay} if decoupled else {}
        optimizer = factory(learning_rate=learning_rate, **self.kwargs, **extra)
        if not isinstance(optimizer, optax.GradientTransformation):
            raise TypeError(
                f"optimizer {self.optimizer!r} returned {type(optimizer).__name__}; an "
                "optimizer must return an optax.GradientTransformation."
            )
        parts = []
        if self.clipping is not None:
            parts.append(optax.clip_by_global_norm(self.clipping))
        if not decoupled and self.weight_decay > 0:
            parts.append(optax.add_decayed_weights(self.weight_decay))
        return optax.chain(*parts, optimizer) if parts else optimizer


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig(_Section):
    """An objective by registered name (`dew.registry.objectives`) and its keyword
    arguments; `build(model)` gives `dew.registry.objectives[name](model, **kwargs)`.

    An objective that takes `seq_len` and is not given one takes the dataset's
    `data.kwargs.seq_len` (see `RunConfig.train`).

    ```python
    >>> ObjectiveConfig().to_dict()
    {'name': 'lm', 'kwargs': {}}

    ```
    """

    name: str = "lm"
    kwargs: Mapping[str, Any] = _EMPTY

    def __post_init__(self) -> None:
        where = _where(self)
        _set(self, "name", _registry_name(f"{where}.name", self.name))
        reserved = {"model": "the model comes from the model section"}
        _set(self, "kwargs", _kwargs(f"{where}.kwargs", self.kwargs, reserved))

    def build(self, model: Any, **defaults: Any) -> Any:
        """The objective on `model`; `defaults` fill keyword arguments `kwargs` lacks
        and the objective takes."""
        builder = registry.objectives[self.name]
        names, extra = registry.keyword_parameters(builder)
        kwargs = {
            key: value
            for key, value in defaults.items()
            if key not in self.kwargs and (key in names or extra)
        }
        kwargs.update(self.kwargs)
        registry.check_arguments("objective", self.name, builder, kwargs, supplied=("model",))
        return builder(model, **kwargs)


@dataclasses.dataclass(frozen=True)
class TrainerConfig(_Section):
    """How a run trains: its name, where it checkpoints, and its cadences.

    - `name`: `None` or a run name of `/`-separated segments (`"lm-rate/trial-0"`), each
      non-empty and not blank, `.` or `..`.
    - `checkpoint_dir`: the directory runs are kept under.
    - `steps`, `batch_size`, `log_every`: integers `>= 1`; `eval_every` and
      `checkpoint_every`: `None` (never) or integers `>= 1`.
    - `seed`: an integer in `[0, 2**32)`, since JAX keys keep 32 bits of an integer seed.
    """

    name: str | None = None
    checkpoint_dir: str = "runs"
    steps: int = 1000
    batch_size: int = 32
    log_every: int = 10
    eval_every: int | None = None
    checkpoint_every: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        where = _where(self)
        _set(self, "name", _run_name(f"{where}.name", self.name))
        _set(self, "checkpoint_dir", _string(f"{where}.checkpoint_dir", self.checkpoint_dir))
        for field in ("steps", "batch_size", "log_every"):
            _set(self, field, _integer(f"{where}.{field}", getattr(self, field), least=1))
        for field in ("eval_every", "checkpoint_every"):
            value = _integer(f"{where}.{field}", getattr(self, field), least=1, optional=True)
            _set(self, field, value)
        seed = _integer(f"{where}.seed", self.seed, least=0)
        if seed >= SEED_LIMIT:
            raise ValueError(
                f"{where}.seed must be an integer in [0, 2**32), got {seed}: JAX keys keep 32 "
                "bits of an integer seed, so larger seeds would repeat smaller ones."
            )
        _set(self, "seed", seed)


_SECTIONS: dict[str, type[_Section]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "trainer": TrainerConfig,
    "objective": ObjectiveConfig,
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run is built from, as plain data: the model, the data, the optimizer
    and the trainer's settings.

    `to_dict` gives `{"model": {...}, "data": {...}, "optim": {...}, "trainer": {...}}`
    and `from_dict` reads it back equal; `to_toml`/`dump_toml` write a TOML file that
    `load`/`from_toml` read back equal. TOML has no null, so a missing key means the
    field's default and `None` fields are left out; a `None` inside `kwargs` cannot be
    written to TOML and raises (leave the key out instead).

    ```python
    >>> from dew.registry import datasets
    >>> config = RunConfig(
    ...     model=ModelConfig("causal_transformer", {"vocab_size": 16, "emb_features": 16,
    ...                       "num_layers": 1, "num_heads": 2, "mlp_features": 32,
    ...                       "max_seq_len": 16}),
    ...     data=datasets["token_windows"](seq_len=8),
    ...     trainer=TrainerConfig(name="lm-rate", steps=10, batch_size=8),
    ... )
    >>> RunConfig.from_dict(config.to_dict()) == config
    True
    >>> RunConfig.from_toml(config.to_toml()) == config
    True
    >>> print(config.to_toml().split("[data]")[1].split("[optim]")[0].strip())
    name = "token_windows"
    <BLANKLINE>
    [data.kwargs]
    seq_len = 8

    ```
    """

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig = OptimConfig()
    trainer: TrainerConfig = TrainerConfig()
    objective: ObjectiveConfig = ObjectiveConfig()

    def __post_init__(self) -> None:
        where = _WHERE.get() or "RunConfig"
        for section, cls in _SECTIONS.items():
            value = getattr(self, section)
            if not isinstance(value, cls):
                raise TypeError(
                    f"{where}.{section} must be a {cls.__name__}, got {type(value).__name__}; "
                    "use RunConfig.from_dict for plain data."
                )
        if self.optim.warmup_steps > self.trainer.steps:
            raise ValueError(
                f"optim.warmup_steps ({self.optim.warmup_steps}) must not exceed trainer.steps "
                f"({self.trainer.steps})."
            )

    def train(
        self,
        objective: Any = None,
        data: Dataset | None = None,
        *,
        name: str | None = None,
        metrics: Sequence[Any] = (),
        tracker: Any = None,
        preview: bool = False,
        progress: bool = True,
    ) -> Any:
        """Train this configuration as the run `name` (default `trainer.name`) and return
        the final `TrainState`: the recipe.

        - Writes `<trainer.checkpoint_dir>/<name>/run.json` (a `RunRecord`: the resolved
          configuration and the package versions) when the run first starts, and never
          overwrites it; a folder whose run.json records another configuration raises.
        - Checkpoints go to `<checkpoint_dir>/<name>/checkpoints` every
          `trainer.checkpoint_every` steps and at the end; starting the run again
          resumes from them. A `LocalTracker` writes its journals in the same folder.
          When `checkpoint_dir` is a URI, the local folder is `runs/<name>` and the
          recipe prints it.
        - `objective`: `None` builds `self.objective` on the configured model; a
          registered name does the same with that name; an `Objective` is used with
          its `model` replaced by the configured one (so a sweep over `model.kwargs`
          trains what it records); a callable `model -> Objective` is called.
        - `data`: `None` builds `self.data` with `trainer.batch_size` and `trainer.seed`.
        - `metrics` are scored every `trainer.eval_every` steps; `tracker` (borrowed)
          receives everything the local tracker does, and previews when
          `preview=True`: the recipe never turns previews on for local reporting alone.
        - The model is initialised from `trainer.seed`; the run key derives from it.
        """
        return _recipe.train_run(
            self,
            objective,
            data,
            name=name,
            metrics=metrics,
            tracker=tracker,
            preview=preview,
            progress=progress,
        )

    @classmethod
    def from_run_record(cls, path: str | os.PathLike) -> "RunConfig":
        """The configuration a run folder's `run.json` records (`path`: the folder or
        the file)."""
        return cls.from_dict(_recipe.run_record_sections(path))

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain data, one mapping per section."""
        return {section: getattr(self, section).to_dict() for section in _SECTIONS}

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> "RunConfig":
        """The config `to_dict` returned. Missing sections and keys take their defaults
        (`model` and `data` are required); errors name the field's dotted path."""
        if not isinstance(mapping, Mapping):
            raise TypeError(
                f"RunConfig.from_dict needs a mapping, got {mapping!r} of type "
                f"{type(mapping).__name__}."
            )
        allowed = ", ".join(repr(section) for section in _SECTIONS)
        for key in mapping:
            if key not in _SECTIONS:
                raise ValueError(f"RunConfig has unknown key {key!r}; allowed keys are {allowed}.")
        for section in ("model", "data"):
            if section not in mapping:
                raise ValueError(
                    f"RunConfig is missing the required key {section!r}; allowed keys are "
                    f"{allowed}."
                )
        sections = {}
        for section, value in mapping.items():
            with _building(section):
                sections[section] = _SECTIONS[section].from_dict(value)
        return cls(**sections)

    def to_toml(self) -> str:
        """The config as a TOML document that `from_toml` reads back equal."""
        lines: list[str] = []
        for section, values in self.to_dict().items():
            lines.append(f"[{section}]")
            tables = {}
            for key, value in values.items():
                if isinstance(value, dict):
                    tables[key] = value
                elif value is not None:
                    lines.append(f"{_toml_key(key)} = {_toml_value(value, f'{section}.{key}')}")
            for key, table in tables.items():
                if table:
                    lines.extend(["", f"[{section}.{_toml_key(key)}]"])
                    for name, value in table.items():
                        where = f"{section}.{key}.{name}"
                        lines.append(f"{_toml_key(name)} = {_toml_value(value, where)}")
            lines.append("")
        return "\n".join(lines)

    def dump_toml(self, path: str | os.PathLike) -> None:
        """Write `to_toml()` to `path` (UTF-8)."""
        text = self.to_toml()
        with open(path, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)

    @classmethod
    def from_toml(cls, text: str) -> "RunConfig":
        """The config a TOML document describes (tables `[model]`, `[model.kwargs]`,
        `[data]`, `[data.kwargs]`, `[optim]`, `[optim.kwargs]`, `[trainer]`)."""
        return cls.from_dict(tomllib.loads(text))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunConfig":
        """The config in the TOML file at `path`."""
        with open(path, "rb") as file:
            try:
                values = tomllib.load(file)
            except tomllib.TOMLDecodeError as error:
                raise ValueError(f"{os.fspath(path)} is not valid TOML: {error}.") from None
        try:
            return cls.from_dict(values)
        except (TypeError, ValueError) as error:
            error.add_note(f"(in the run config {os.fspath(path)})")
            raise


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_ESCAPES["\r"] = "\\r"


def _toml_string(value: str) -> str:
    out = []
    for character in value:
        if character in _ESCAPES:
            out.append(_ESCAPES[character])
        elif ord(character) < 0x20 or ord(character) == 0x7F:
            out.append(f"\\u{ord(character):04X}")
        else:
            out.append(character)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_value(value: Any, where: str) -> str:
    if value is None:
        raise ValueError(
            f"{where} is None, which TOML cannot hold; leave the key out of the kwargs to use "
            "the builder's default, or keep the config as JSON (to_dict)."
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        items = (_toml_value(item, f"{where}[{index}]") for index, item in enumerate(value))
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = (
            f"{_toml_key(key)} = {_toml_value(item, f'{where}.{key}')}"
            for key, item in value.items()
        )
        return "{ " + ", ".join(items) + " }"
    raise TypeError(f"{where} is {value!r} of type {type(value).__name__}, which TOML cannot hold.")


# Overrides.

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
