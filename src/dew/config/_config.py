"""Run configurations as frozen, validated, plain-data dataclasses."""

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dew._run_folder import RunFolder
from dew.config import _run_record
from dew.config._data import DataConfig
from dew.config._fields import _WHERE, _building, _Section
from dew.config._sections import ModelConfig, ObjectiveConfig, OptimConfig, TrainerConfig
from dew.config._toml import dumps_toml, loads_toml, read_toml

if TYPE_CHECKING:
    from dew.data import Dataset

__all__ = ["RunConfig", "UndeclaredPathError"]


class UndeclaredPathError(KeyError):
    """An override path that the config does not declare (a `KeyError` whose message
    names the nearest declared paths)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_SECTIONS: dict[str, type[_Section]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "trainer": TrainerConfig,
    "objective": ObjectiveConfig,
}


# Each section's field defaults: `to_toml` leaves out a None only where None is the default.
_DEFAULTS: dict[str, dict[str, Any]] = {
    section: {field.name: field.default for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for section, cls in _SECTIONS.items()
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run is built from, as plain data: the model, the data, the optimizer
    and the trainer's settings.

    `to_dict` gives `{"model": {...}, "data": {...}, "optim": {...}, "trainer": {...}}`
    and `from_dict` reads it back equal; `to_toml`/`dump_toml` write a TOML file that
    `load`/`from_toml` read back equal (`dew config show` prints it). TOML has no null, so
    a missing key means the field's default and a `None` field whose default is `None` is
    left out; a `None` inside `kwargs` cannot be written to TOML and raises (leave the key
    out instead; decision 0021). `load` also reads a run folder or its `run.json`.

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
        data: "Dataset | None" = None,
        *,
        name: str | None = None,
        metrics: Sequence[Any] = (),
        tracker: Any = None,
        preview: bool | None = None,
        progress: bool = True,
        early_stopper: Any = None,
        callbacks: Sequence[Any] = (),
    ) -> Any:
        """Train this configuration as the run `name` (default `trainer.name`) and return
        the final `TrainState`: the recipe.

        - Checks everything it can before anything is written: the optimizer, the
          objective, the data, and the first training batch through the objective's
          checks (data whose batches lack what the objective reads raises `ValueError`).
        - Locks the run folder while it trains (`run.lock`, with this process's ID): a
          second run of the same folder raises at once, naming the holder's PID.
        - Writes `<trainer.checkpoint_dir>/<name>/run.json` (a `RunRecord`: the resolved
          configuration, local paths absolute, and the package versions) when the run
          first starts, and never overwrites it once the run has completed a step; a
          folder whose run.json records another configuration then raises. A run that
          never completed a step starts over with the new configuration (its old record
          kept as `run.json.previous`). Where the folder is (`trainer.checkpoint_dir`,
          `trainer.name`) is no part of a run's identity: a moved folder resumes.
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
          receives everything the local tracker does.
        - `preview` (`None`: `trainer.preview`): `True` previews what the model
          generates at every evaluation event into the local tracker's `previews/`
          folder and into `tracker`; the recipe never turns previews on by itself.
        - `early_stopper`: a `dew.supervised.EarlyStopper` the fit consults at each evaluation
          (`Trainer.fit`'s), e.g. a sweep's `dew.config.sweep.pruning_stopper`; `None`: the
          one `[trainer.early_stopping]` declares, if any (both at once raise `ValueError`).
        - `callbacks`: `dew.training.Callback` objects, run after those `trainer.callbacks`
          names (`Trainer.fit(callbacks=...)`).
        - The model is initialised from `trainer.seed`; the run key derives from it.
        """
        from dew.config import _recipe  # the training recipe imports JAX: reading does not

        return _recipe.train_run(
            self,
            objective,
            data,
            name=name,
            metrics=metrics,
            tracker=tracker,
            preview=preview,
            progress=progress,
            early_stopper=early_stopper,
            callbacks=callbacks,
        )

    @classmethod
    def from_run_record(cls, path: str | os.PathLike) -> "RunConfig":
        """The configuration a run folder's `run.json` records (`path`: the folder or
        the file): the resolved configuration the run trained, its `trainer.name` the
        run's name, and its `trainer.steps` the total of the run's latest fit (an extended
        run's larger one, from the journal's `FitStarted`), and its
        `trainer.checkpoint_dir` where the folder is now when the recorded one points
        elsewhere and the folder's path ends with the run's name (a moved run folder, or
        one read from another directory, trains on in place). A run.json written before the
        `optimizer` section became `optim` reads the same. `load` does this for a folder or
        a `.json` file.

        ```python
        >>> import pathlib, tempfile
        >>> from dew.config import builtin
        >>> from dew.telemetry.records import RunRecord
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> config = builtin("tiny_lm")
        >>> _ = (folder / "run.json").write_text(RunRecord(**config.to_dict()).to_json())
        >>> RunConfig.from_run_record(folder) == config == RunConfig.load(folder)
        True

        ```
        """
        path = _run_record.run_record_path(path)
        config = _read_from(_run_record.run_record_sections(path), f"the run record {path}")
        latest = RunFolder(path.parent).latest_fit()  # an extended run's, once run.json is read
        total = None if latest is None else latest.steps
        if total is None or total == config.trainer.steps:
            return config
        return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, steps=total))

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
        document: dict[str, dict[str, Any]] = {}
        for section, values in self.to_dict().items():
            kept = document[section] = {}
            for key, value in values.items():
                if isinstance(value, dict):
                    if value:  # an empty kwargs table is left out: it reads back as its default
                        kept[key] = value
                elif value is not None or _DEFAULTS[section].get(key, ...) is not None:
                    # None is left out where it is the default (TOML has no null): decision 0021
                    kept[key] = value
        return dumps_toml(document)

    def dump_toml(self, path: str | os.PathLike) -> None:
        """Write `to_toml()` to `path` (UTF-8)."""
        text = self.to_toml()
        with open(path, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)

    @classmethod
    def from_toml(cls, text: str) -> "RunConfig":
        """The config a TOML document describes (tables `[model]`, `[model.kwargs]`,
        `[data]`, `[data.kwargs]`, `[optim]`, `[optim.kwargs]`, `[trainer]`)."""
        return cls.from_dict(loads_toml(text, "the TOML text"))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunConfig":
        """The config at `path`: a TOML file (`dump_toml`, `dew config show`), or a run
        folder or its `run.json` (a file named `*.json`), read by `from_run_record`."""
        if os.path.isdir(path) or os.fspath(path).endswith(".json"):
            return cls.from_run_record(path)
        return _read_from(read_toml(path), f"the run config {os.fspath(path)}")


def _read_from(values: Any, where: str) -> RunConfig:
    """The config a file holds: a value of the wrong type or a bad value there is the file's
    problem, so either raises `ValueError` (with the note `(in <where>)`), never `TypeError`."""
    try:
        return RunConfig.from_dict(values)
    except (TypeError, ValueError) as error:
        problem = ValueError(str(error))
        problem.add_note(f"(in {where})")
        raise problem from error
