"""Run configurations: what a run is built from, as validated plain data.

A `RunConfig` holds a `ModelConfig` and a `DataConfig` (each a name registered in
`dew.registry` plus its keyword arguments), an `OptimConfig` and a `TrainerConfig`.
Every config is a frozen dataclass that checks its fields when constructed, naming a bad
field by its dotted path (`trainer.steps must be an integer >= 1, got 0.`), and turns
into plain data and back exactly: `RunConfig.from_dict(config.to_dict()) == config`,
and likewise through a TOML file (`dump_toml` / `load`).

- Names (`model.name`, `data.name`, `optim.optimizer`) are looked up in `dew.registry`
  by `build`, not when the config is constructed, so a config can name an entry that a
  plugin registers later; `build` checks the kwargs against the entry's signature.
- A value of the wrong type raises `TypeError`, a value out of range `ValueError`, an
  unknown key in `from_dict` `ValueError`, each naming the field and what is allowed.
- Numbers are finite: NaN and infinities are refused, so a config always equals itself.
  Integers are accepted for float fields and stored as floats; `bool` is not an integer.
  Integers must fit in 64 bits (TOML's range).
- `kwargs` mappings are stored read-only and compared by value: nested lists become
  tuples and nested mappings read-only mappings (the builders receive them so). Their
  top-level keys are Python identifiers and nested keys hold no `.`, so every value has
  one dotted path.
- `builtin(name)` is one of dew's built-in run configurations by name
  (`BUILTIN_CONFIGS`: `tiny_lm`, `tiny_diffusion`, `tiny_video_diffusion`,
  `tiny_jepa`, `tiny_classifier`), as
  `dew train --config NAME` trains it.
- `load_run(folder)` loads a trained run: its configuration, objective and model with the
  checkpoint's parameters, tokenizer and class names (`LoadedRun`; also `dew.load_run`).
- `override(config, point)` sets dotted paths (`"optim.learning_rate"`,
  `"model.kwargs.emb_features"`) through `to_dict` and `from_dict`; a path the config
  does not declare raises `UndeclaredPathError` naming the nearest declared paths.

```python
>>> from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig, override
>>> from dew.registry import datasets
>>> config = RunConfig(
...     model=ModelConfig("causal_transformer", {"vocab_size": 4, "emb_features": 16,
...                       "num_layers": 1, "num_heads": 2, "mlp_features": 32,
...                       "max_seq_len": 16}),
...     data=datasets["token_windows"](seq_len=8, vocab_size=4),
...     optim=OptimConfig(optimizer="adam"),
...     trainer=TrainerConfig(name="lm-rate", checkpoint_dir="runs/sweep", steps=10,
...                           batch_size=8),
... )
>>> override(config, {"optim.learning_rate": 0.003}).optim.learning_rate
0.003
>>> override(config, {"trainer.steps": 0})
Traceback (most recent call last):
...
ValueError: trainer.steps must be an integer >= 1, got 0.
(while applying the override {'trainer.steps': 0})

```
"""

from typing import TYPE_CHECKING

from dew._lazy import lazy_names

if TYPE_CHECKING:  # the names as type checkers, IDEs and the reference site see them
    from dew.config._builtin import BUILTIN_CONFIGS as BUILTIN_CONFIGS
    from dew.config._builtin import builtin as builtin
    from dew.config._config import RunConfig as RunConfig
    from dew.config._config import UndeclaredPathError as UndeclaredPathError
    from dew.config._data import DataConfig as DataConfig
    from dew.config._evaluation import default_metrics as default_metrics
    from dew.config._evaluation import evaluate_run as evaluate_run
    from dew.config._evaluation import objective_shapes as objective_shapes
    from dew.config._fields import SCHEDULES as SCHEDULES
    from dew.config._load import LoadedRun as LoadedRun
    from dew.config._load import load_run as load_run
    from dew.config._overrides import declared_paths as declared_paths
    from dew.config._overrides import override as override
    from dew.config._sections import ModelConfig as ModelConfig
    from dew.config._sections import ObjectiveConfig as ObjectiveConfig
    from dew.config._sections import OptimConfig as OptimConfig
    from dew.config._sections import TrainerConfig as TrainerConfig

__all__ = [
    "BUILTIN_CONFIGS",
    "SCHEDULES",
    "DataConfig",
    "LoadedRun",
    "ModelConfig",
    "ObjectiveConfig",
    "OptimConfig",
    "RunConfig",
    "TrainerConfig",
    "UndeclaredPathError",
    "builtin",
    "declared_paths",
    "default_metrics",
    "evaluate_run",
    "load_run",
    "objective_shapes",
    "override",
]

# Each public name and the module it comes from, imported when the name is first used.
_HOMES = {
    "BUILTIN_CONFIGS": "dew.config._builtin",
    "builtin": "dew.config._builtin",
    "RunConfig": "dew.config._config",
    "UndeclaredPathError": "dew.config._config",
    "DataConfig": "dew.config._data",
    "default_metrics": "dew.config._evaluation",
    "evaluate_run": "dew.config._evaluation",
    "objective_shapes": "dew.config._evaluation",
    "SCHEDULES": "dew.config._fields",
    "LoadedRun": "dew.config._load",
    "load_run": "dew.config._load",
    "declared_paths": "dew.config._overrides",
    "override": "dew.config._overrides",
    "ModelConfig": "dew.config._sections",
    "ObjectiveConfig": "dew.config._sections",
    "OptimConfig": "dew.config._sections",
    "TrainerConfig": "dew.config._sections",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
