"""The sections of a run configuration besides the data: the model, the optimizer, the
objective and the trainer's settings."""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dew import _registry as registry
from dew._nonfinite import ON_NONFINITE
from dew._plugins import check_module_names, check_targets
from dew._precisions import check_precision
from dew._reductions import TRAIN_REDUCTIONS
from dew.checkpoints._location import checkpoint_location
from dew.config._fields import (
    _EMPTY,
    SCHEDULES,
    SEED_LIMIT,
    _integer,
    _kwargs,
    _real,
    _registry_name,
    _run_name,
    _Section,
    _set,
    _string,
    _where,
)

if TYPE_CHECKING:
    import optax
    from jaxtyping import PRNGKeyArray

__all__ = ["ModelConfig", "ObjectiveConfig", "OptimConfig", "TrainerConfig"]


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

    def build(self, *, key: "PRNGKeyArray") -> Any:
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

    def learning_rate_schedule(self, steps: int) -> "optax.Schedule":
        """The learning rate at each step of a run of `steps` steps."""
        import optax  # here, not at the top: a configuration is read without JAX

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

    def build(self, steps: int) -> "optax.GradientTransformation":
        """The optimizer for a run of `steps` steps: clipping, then decay where the
        optimizer has none of its own, then the optimizer on the schedule."""
        import optax

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
        reserved = {
            "model": "the model comes from the model section",
            "key": "an objective's key comes from trainer.seed",
        }
        _set(self, "kwargs", _kwargs(f"{where}.kwargs", self.kwargs, reserved))

    def build(self, model: Any, **defaults: Any) -> Any:
        """The objective on `model`; `defaults` fill keyword arguments `kwargs` lacks
        and the objective names (a builder's `**kwargs` takes only what the config says)."""
        builder = registry.objectives[self.name]
        names, _ = registry.keyword_parameters(builder)
        kwargs = {
            key: value for key, value in defaults.items() if key not in self.kwargs and key in names
        }
        kwargs.update(self.kwargs)
        registry.check_arguments("objective", self.name, builder, kwargs, supplied=("model",))
        return builder(model, **kwargs)


CONFIG_STRATEGIES = ("data", "fsdp")
"""The sharding presets a configuration's `trainer.strategy` names (`Trainer(strategy=)`'s
without a mesh of its own)."""


@dataclasses.dataclass(frozen=True)
class TrainerConfig(_Section):
    """How a run trains: its name, where it checkpoints, and its cadences.

    - `name`: `None` or a run name of `/`-separated segments (`"lm-rate/trial-0"`), each
      non-empty and not blank, `.` or `..`.
    - `checkpoint_dir`: the directory runs are kept under: a local folder, a
      `file:///absolute/path` URI naming one, or a `gs://bucket/folder` URI (the
      checkpoints go there; the run's journals and run.json to `runs/<name>` locally).
    - `steps`, `batch_size`, `log_every`: integers `>= 1`; `eval_every` and
      `checkpoint_every`: `None` (never) or integers `>= 1`. `batch_size` is the rows of
      each process's batch: a run of N processes (`jax.distributed`) trains on global
      batches of N x `batch_size` rows.
    - `seed`: an integer in `[0, 2**32)`, since JAX keys keep 32 bits of an integer seed.
    - `preview`: a bool; `True` has every evaluation event preview what the model
      generates into the run's trackers, the local one included (a labelled grid of
      images, `grid.png`, animated for clips, `grid.gif`; token rows as `tokens.json` and
      `text.md`; representation histograms; under the run folder's `previews/`).
    - `train_reduction`: `"mean"` (each training metric a log step reports is its mean
      over the steps since the last log step) or `"last"` (the log step's own value);
      `Trainer.fit`'s argument of that name.
    - `accumulate`: an integer `>= 1` that divides `batch_size`: each step's batch is
      split into that many micro-batches whose gradients are summed before one optimizer
      update (`Trainer.fit`'s argument of that name: the update is the whole batch's, the
      memory one micro-batch's). No part of a run's identity: a run that ran out of memory
      resumes with a larger value.
    - `log_optimizer`: a bool; `True` adds the training metrics `learning_rate` (from
      the optim section's schedule), `grad_norm` and `update_norm`.
    - `log_throughput`: a bool, `True` by default (`Trainer.fit`'s `log_throughput`, whose
      own default is `False`): each log step after the fit's first adds the training
      metrics `examples_per_second`, `tokens_per_second` (an objective that counts its
      tokens) and `mfu` (a device whose peak is known), and the end-of-run summary shows
      them. Wall-clock measurements, so no part of a run's identity: a rerun that turns
      them off resumes.
    - `on_nonfinite`: `"raise"` (a run whose training loss or params turn NaN or
      infinite stops there, before saving that state) or `"continue"` (it trains on);
      `Trainer.fit`'s argument of that name, `dew train --on-nonfinite`. Like `steps`, no
      part of a run's identity: a diverged run resumes with another value.
    - `strategy`: `"data"` (the default: params and optimizer state replicated, each
      step's global batch split by rows) or `"fsdp"` (each param and its optimizer state
      also split over every device along its largest axis the device count divides;
      docs/training.md, "Sharding presets"); `Trainer(strategy=...)` on the data mesh, so
      a no-op on one device. `"fsdp+tensor"` needs a mesh with a `"model"` axis, which a
      configuration does not give: build the `Trainer` in Python. No part of a run's
      identity: a checkpoint restores under either.
    - `precision`: `"float32"` (the default), `"mixed_bfloat16"` or `"bfloat16"`: the
      precision policy (`Trainer(precision=...)`, `dew train --precision`; docs/training.md,
      "Precision"): params and optimizer state float32 under each, the step and the fit's
      evaluations computed in bfloat16 under the other two. Part of a run's identity:
      another policy gives other updates.
    - `imports`: modules (dotted names) imported before the run is built, each of which
      registers models, datasets, objectives or optimizers in `dew.registry` as it is
      imported (`dew train --import MODULE` adds to it). The run's `run.json` records them,
      so `dew eval`, an extension and a sweep's rerun find the registrations untold. Where
      the names come from is no part of a run's identity (the names are).
    - `early_stopping`: empty (no early stopping) or the table `[trainer.early_stopping]`:
      `metric` (a bare metric name, required), `split` (`"validation"`, the default, or
      `"train"`), `mode` (`"min"` or `"max"`; left out, the `EarlyStopper`'s default),
      `patience` (an integer >= 0, default 0) and `min_delta` (a real number >= 0): the
      `dew.supervised.EarlyStopper` the fit consults (`Trainer.fit(early_stopper=...)`).
    - `callbacks`: `"module:Name"` strings, each naming a `dew.training.Callback` subclass
      (made with no arguments) or instance in an importable module; the module is imported
      as `imports` are when the run is built, and the callbacks run after the fit's own
      policies, in this order (`Trainer.fit(callbacks=...)`).
    """

    name: str | None = None
    checkpoint_dir: str = "runs"
    steps: int = 1000
    batch_size: int = 32
    log_every: int = 10
    eval_every: int | None = None
    checkpoint_every: int | None = None
    seed: int = 0
    preview: bool = False
    train_reduction: str = "mean"
    accumulate: int = 1
    log_optimizer: bool = False
    log_throughput: bool = True
    on_nonfinite: str = "raise"
    strategy: str = "data"
    precision: str = "float32"
    imports: Sequence[str] = ()
    early_stopping: Mapping[str, Any] = _EMPTY
    callbacks: Sequence[str] = ()

    def __post_init__(self) -> None:
        where = _where(self)
        _set(self, "name", _run_name(f"{where}.name", self.name))
        _set(self, "imports", check_module_names(f"{where}.imports", self.imports))
        stopping = _early_stopping(f"{where}.early_stopping", self.early_stopping)
        _set(self, "early_stopping", stopping)
        _set(self, "callbacks", check_targets(f"{where}.callbacks", self.callbacks))
        directory = _string(f"{where}.checkpoint_dir", self.checkpoint_dir)
        checkpoint_location(directory, f"{where}.checkpoint_dir")  # a URI orbax writes to
        _set(self, "checkpoint_dir", directory)
        for field in ("steps", "batch_size", "log_every"):
            _set(self, field, _integer(f"{where}.{field}", getattr(self, field), least=1))
        accumulate = _integer(f"{where}.accumulate", self.accumulate, least=1)
        if self.batch_size % accumulate:
            raise ValueError(
                f"{where}.accumulate must divide {where}.batch_size ({self.batch_size}) into "
                f"equal micro-batches, got {accumulate}."
            )
        _set(self, "accumulate", accumulate)
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
        for field in ("preview", "log_optimizer", "log_throughput"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(
                    f"{where}.{field} must be true or false, got {getattr(self, field)!r}."
                )
        if (
            not isinstance(self.train_reduction, str)
            or self.train_reduction not in TRAIN_REDUCTIONS
        ):
            allowed = " or ".join(repr(value) for value in TRAIN_REDUCTIONS)
            raise ValueError(
                f"{where}.train_reduction must be {allowed}, got {self.train_reduction!r}."
            )
        _set(self, "train_reduction", str.__str__(self.train_reduction))
        if not isinstance(self.on_nonfinite, str) or self.on_nonfinite not in ON_NONFINITE:
            allowed = " or ".join(repr(value) for value in ON_NONFINITE)
            raise ValueError(f"{where}.on_nonfinite must be {allowed}, got {self.on_nonfinite!r}.")
        _set(self, "on_nonfinite", str.__str__(self.on_nonfinite))
        if not isinstance(self.strategy, str) or self.strategy not in CONFIG_STRATEGIES:
            allowed = " or ".join(repr(value) for value in CONFIG_STRATEGIES)
            tensor = " (fsdp+tensor needs a mesh: build the Trainer in Python)"
            raise ValueError(
                f"{where}.strategy must be {allowed}, got {self.strategy!r}"
                f"{tensor if self.strategy == 'fsdp+tensor' else ''}."
            )
        _set(self, "strategy", str.__str__(self.strategy))
        _set(self, "precision", check_precision(self.precision, f"{where}.precision"))


EARLY_STOPPING_KEYS = ("metric", "split", "mode", "patience", "min_delta")
SPLITS = ("validation", "train")
MODES = ("minimize", "maximize", "min", "max")


def _early_stopping(where: str, value: Any) -> Any:
    """A `[trainer.early_stopping]` table, checked key by key (no JAX: the stopper is made
    when the run trains): empty, or a `metric` with the optional `split`, `mode`,
    `patience` and `min_delta`."""
    table = _kwargs(where, value, {})
    if not table:
        return table
    unknown = [key for key in table if key not in EARLY_STOPPING_KEYS]
    if unknown:
        allowed = ", ".join(repr(key) for key in EARLY_STOPPING_KEYS)
        raise ValueError(f"{where} has unknown key {unknown[0]!r}; allowed keys are {allowed}.")
    if "metric" not in table:
        raise ValueError(
            f'{where} needs a metric (its bare name, e.g. metric = "loss"); it has '
            f"{', '.join(repr(key) for key in table)}."
        )
    checked = dict(table)
    checked["metric"] = _string(f"{where}.metric", table["metric"])
    for key, allowed in (("split", SPLITS), ("mode", MODES)):
        if key in table and table[key] not in allowed:
            listed = " or ".join(repr(name) for name in allowed)
            raise ValueError(f"{where}.{key} must be {listed}, got {table[key]!r}.")
    if "patience" in table:
        checked["patience"] = _integer(f"{where}.patience", table["patience"], least=0)
    if "min_delta" in table:
        checked["min_delta"] = _real(f"{where}.min_delta", table["min_delta"], positive=False)
    return _kwargs(where, checked, {})
