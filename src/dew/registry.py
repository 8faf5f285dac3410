"""Registries that name the pieces a run configuration is built from.

A `Registry` maps names to entries. dew ships four, filled with its built-ins, and
you register your own by name (as a call or as a decorator):

- `models`: `name -> builder(**kwargs, key) -> model`, e.g. `"causal_transformer"`.
- `objectives`: `name -> (model, **kwargs) -> Objective`, e.g. `"lm"`.
- `optimizers`: `name -> (learning_rate, **kwargs) -> optax.GradientTransformation`.
- `datasets`: `name -> builder(*, batch_size, seed, **kwargs) -> dew.data.Dataset`.
  Indexing `datasets[name](**kwargs)` returns a `dew.config.DataConfig` naming the
  dataset (after checking that `kwargs` bind to its builder), so a run config names its
  data instead of holding it; `datasets.builder(name)` is the builder itself.

Names you register in Python reach the `dew` command (and a run's later commands) through a
module it imports: `dew train --import my_data` or `trainer.imports = ["my_data"]` (recorded in
the run's `run.json`; `import_modules` imports them), or an installed distribution's
`dew.plugins` entry point (`PLUGIN_GROUP`; `load_plugins` imports every one).

The built-in datasets are synthetic or read a local file, so they never download:
`"token_windows"` (language modelling and masked diffusion), `"preference_pairs"` (DPO),
`"prompts"` (GRPO), the synthetic vision data `"shapes"` (images of squares, discs
and bars, labelled by kind) and `"moving_shapes"` (clips of one such shape moving), and your
own data: `"text"` (`dew.data.text`: your text files or JSON Lines, tokenized once into a
cache), `"arrays"` (the arrays of an `.npz` or `.npy` file, `dew.data.arrays`), `"tokens"`
(windows of a token file, `dew.data.tokens`), `"image_folder"` (`dew.data.image_folder`: a
folder of class folders of images, decoded once into a cache) and `"huggingface"`
(`dew.data.huggingface`: a dataset saved with `save_to_disk`, or local JSON, Parquet or CSV
files, read through `datasets`). Every one is step-indexed: its training batch is a function
of the step (docs/data.md).

```python
>>> import optax
>>> from dew.registry import datasets, models, optimizers
>>> "adamw" in optimizers and "causal_transformer" in models
True
>>> @optimizers.register("sgd_momentum")
... def sgd_momentum(learning_rate, momentum=0.9):
...     return optax.sgd(learning_rate, momentum=momentum)
>>> optimizers["sgd_momentum"] is sgd_momentum
True
>>> datasets["token_windows"](seq_len=8)
DataConfig(name='token_windows', kwargs={'seq_len': 8})
>>> optimizers.unregister("sgd_momentum")

```
"""

from typing import TYPE_CHECKING

from dew._lazy import lazy_names

if TYPE_CHECKING:  # the names as type checkers, IDEs and the reference site see them
    from dew._datasets import arrays_file as arrays_file
    from dew._datasets import preference_pairs as preference_pairs
    from dew._datasets import prompts as prompts
    from dew._datasets import token_file as token_file
    from dew._datasets import token_windows as token_windows
    from dew._plugins import PLUGIN_GROUP as PLUGIN_GROUP
    from dew._plugins import RegistrationImportError as RegistrationImportError
    from dew._plugins import import_modules as import_modules
    from dew._plugins import load_plugins as load_plugins
    from dew._registry import DATASET_SUPPLIED as DATASET_SUPPLIED
    from dew._registry import NotRegisteredError as NotRegisteredError
    from dew._registry import Registry as Registry
    from dew._registry import check_arguments as check_arguments
    from dew._registry import keyword_parameters as keyword_parameters
    from dew._registry import models as models
    from dew._registry import objectives as objectives
    from dew._registry import optimizers as optimizers
    from dew._shapes import SHAPE_KINDS as SHAPE_KINDS
    from dew._shapes import moving_shapes as moving_shapes
    from dew._shapes import shapes as shapes
    from dew.config._data import DatasetRegistry as DatasetRegistry
    from dew.config._data import datasets as datasets

__all__ = [
    "DATASET_SUPPLIED",
    "arrays_file",
    "PLUGIN_GROUP",
    "RegistrationImportError",
    "import_modules",
    "load_plugins",
    "SHAPE_KINDS",
    "DatasetRegistry",
    "NotRegisteredError",
    "Registry",
    "check_arguments",
    "datasets",
    "keyword_parameters",
    "models",
    "moving_shapes",
    "objectives",
    "optimizers",
    "preference_pairs",
    "prompts",
    "shapes",
    "token_file",
    "token_windows",
]

# Each public name and the module it comes from, imported when the name is first used: a
# plugin that registers its pieces imports the registries, not dew's built-in datasets (JAX).
_HOMES = {
    "arrays_file": "dew._datasets",
    "preference_pairs": "dew._datasets",
    "prompts": "dew._datasets",
    "token_file": "dew._datasets",
    "token_windows": "dew._datasets",
    "PLUGIN_GROUP": "dew._plugins",
    "RegistrationImportError": "dew._plugins",
    "import_modules": "dew._plugins",
    "load_plugins": "dew._plugins",
    "DATASET_SUPPLIED": "dew._registry",
    "NotRegisteredError": "dew._registry",
    "Registry": "dew._registry",
    "check_arguments": "dew._registry",
    "keyword_parameters": "dew._registry",
    "models": "dew._registry",
    "objectives": "dew._registry",
    "optimizers": "dew._registry",
    "SHAPE_KINDS": "dew._shapes",
    "moving_shapes": "dew._shapes",
    "shapes": "dew._shapes",
    "DatasetRegistry": "dew.config._data",
    "datasets": "dew.config._data",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
