"""`dew.load_run`: a run folder's trained model in one call, and what it needs to be used (its
configuration, objective, tokenizer and class names)."""

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from dew._data_record import read_data_record
from dew._integers import check_integer
from dew._plugins import import_modules
from dew._run_folder import RunFolder, run_folder
from dew.checkpoints import Checkpointer
from dew.checkpoints._location import is_remote
from dew.config._config import RunConfig
from dew.config._recipe import build_objective
from dew.data import Partition
from dew.data.tokenizers import Tokenizer
from dew.objectives.base import Objective, combine

__all__ = ["WEIGHTS", "LoadedRun", "checkpoint_directory", "example_batch", "load_run"]

WEIGHTS = ("auto", "live", "ema")
"""What `load_run(weights=...)` takes: `"auto"` (the vision page's rule: the EMA weights where
the objective declares an `ema_decay`, else the live ones), `"live"` or `"ema"`."""


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """A trained run, loaded by `load_run`: what calling its model needs.

    - `folder`: the run folder (it holds `run.json`).
    - `config`: the `RunConfig` the run trained.
    - `objective`: the run's objective, its model holding the trained parameters (so
      `objective.init_params()` returns them).
    - `model`: the model with the trained parameters combined in (the objective's model:
      a `ClassifierObjective`'s or `LMObjective`'s `model`, a DPO or GRPO `policy`, JEPA's
      `networks`); call it on one example, as the objective does.
    - `params`: the trained parameters alone (`dew.objectives.base.trainable(model)`), as
      an objective's `evaluate` and `sample` take them.
    - `step`: the checkpoint's step.
    - `weights`: which weights were restored: `"live"` or `"ema"`.
    - `tokenizer`: the tokenizer the run's data was made with (rebuilt from the run folder's
      copy), or `None` where the data had none.
    - `classes`: the class names, label `i` naming `classes[i]`, or `None` where the data
      named none.
    - `fields`: each field of a training batch, its shape without the row axis and its
      dtype (`{"images": ((16, 16, 3), "float32")}`): the rows the model reads. Empty for a
      run trained before runs recorded their data.
    """

    folder: pathlib.Path
    config: RunConfig
    objective: Objective
    model: PyTree
    params: PyTree
    step: int
    weights: Literal["live", "ema"]
    tokenizer: Tokenizer | None
    classes: tuple[str, ...] | None
    fields: Mapping[str, tuple[tuple[int, ...], str]]


def load_run(
    folder: str | os.PathLike[str],
    *,
    step: int | None = None,
    weights: str = "auto",
) -> LoadedRun:
    """Load the run in `folder` (a run folder `dew train` or `RunConfig.train` wrote): its
    configuration, its objective and model with the checkpoint's trained parameters, and
    the tokenizer and class names its data recorded (`data.json`).

    **Arguments:**

    - `folder`: the run folder (or its `run.json`), laid out as the Sweeps guide's section
      on the recipe lists (one internal module, `dew._run_folder`, names and reads its
      files).
    - `step`: the checkpoint step to load; by default the newest intact one (a damaged
      newer step is passed over with a `DamagedCheckpointWarning`, as a resume does).
    - `weights`: `"auto"` (default) loads the weights the run generates and scores with: the
      EMA weights where its objective declares an `ema_decay` (`DiffusionObjective`,
      `JEPAObjective` with one), else the live weights (the table in the vision guide's
      "Which weights generate and score"); `"live"` or `"ema"` choose.

    Only the parameters are read from the checkpoint (with `"ema"`, only the EMA
    parameters): no optimizer is built, and no optimizer state read. The modules the run's
    `trainer.imports` names are imported first.

    **Returns:** a `LoadedRun`.

    **Raises:** `FileNotFoundError` for a folder without `run.json` or checkpoints, and for a
    `step` with no checkpoint (naming the steps there are); `ValueError` for `weights="ema"`
    of a run that keeps no EMA weights, a checkpoint written by another model (naming the
    first parameter that differs), a folder whose every step is damaged, and a bad
    `weights` or `step`. Each names the folder.

    ```python
    >>> load_run("no/such/run")
    Traceback (most recent call last):
    ...
    FileNotFoundError: no run folder at no/such/run.

    ```
    """
    if weights not in WEIGHTS:
        raise ValueError(f"load_run: weights must be one of {WEIGHTS}, got {weights!r}.")
    step = check_integer("load_run: step", step, minimum=0, optional=True)
    run = RunFolder.of(folder)  # the folder, or its run.json
    folder, record = run.path, run.run_record
    config = RunConfig.from_run_record(record)
    import_modules(config.trainer.imports, named_by=f"trainer.imports of {record}")
    objective = _objective(config)
    keeps_ema = getattr(objective, "ema_decay", None) is not None  # the Trainer's rule
    if weights == "ema" and not keeps_ema:
        raise ValueError(
            f"{folder}: weights='ema', but the run keeps no EMA weights (its {objective.name!r} "
            "objective declares no ema_decay); load its live weights (weights='live' or 'auto')."
        )
    ema = weights == "ema" or (weights == "auto" and keeps_ema)
    chosen: Literal["live", "ema"] = "ema" if ema else "live"
    with Checkpointer(checkpoint_directory(config, folder)) as saved:
        found, params = saved.restore_params(objective.init_params(), step, ema=ema)
    objective, model = _trained(objective, params)
    data = read_data_record(folder)
    return LoadedRun(
        folder=folder,
        config=config,
        objective=objective,
        model=model,
        params=params,
        step=found,
        weights=chosen,
        tokenizer=None if data is None else data.tokenizer,
        classes=None if data is None else data.classes,
        fields={} if data is None else dict(data.fields),
    )


def checkpoint_directory(config: RunConfig, folder: pathlib.Path) -> Any:
    """Where the run in `folder` keeps its checkpoints: its `checkpoints` folder, or the
    remote store its `trainer.checkpoint_dir` names (`gs://...`).

    **Raises:** `FileNotFoundError` naming `folder` when it has no checkpoints folder."""
    if is_remote(config.trainer.checkpoint_dir) and config.trainer.name is not None:
        return run_folder(config, config.trainer.name)[0]
    checkpoints = RunFolder(folder).checkpoints
    if not checkpoints.is_dir():
        raise FileNotFoundError(f"{folder} has no checkpoints folder: the run saved no checkpoint.")
    return checkpoints


def example_batch(loaded: LoadedRun) -> tuple[str, Mapping[str, Any]]:
    """One batch of the loaded run's data, as it trained, and the split it is from: its first
    validation batch (`"validation"`), or its first training batch (`"train"`) where it holds
    no validation data (a text run's token cache read from the run folder)."""
    config = loaded.config
    data = config.data.build(
        batch_size=config.trainer.batch_size,
        seed=config.trainer.seed,
        cache_dir=RunFolder(loaded.folder).data_cache,
    )
    split, batches = ("train", data.train) if data.val is None else ("validation", data.val)
    drawn = batches(Partition())
    try:
        batch = next(iter(drawn), None)
    finally:
        close = getattr(drawn, "close", None)
        if close is not None:
            close()
    if batch is None:
        raise ValueError(f"the data of the run at {loaded.folder} yields no {split} batch.")
    return split, batch


def _objective(config: RunConfig) -> Objective:
    """The run's objective, to hold the restored parameters. Where every array it holds is
    one of its trainable parameters (the restore replaces them all), it is built on shapes
    alone, its arrays zeros: initialising a model costs a compilation per kind of layer,
    seconds for nothing. Otherwise (a frozen reference model, an integer buffer: arrays the
    checkpoint does not hold) it is built as the run built it."""
    seed = jax.random.key(config.trainer.seed)
    shapes = eqx.filter_eval_shape(build_objective, config, None, seed)
    arrays = [leaf for leaf in jax.tree.leaves(shapes) if isinstance(leaf, jax.ShapeDtypeStruct)]
    if any(not jnp.issubdtype(leaf.dtype, jnp.inexact) for leaf in arrays):
        return build_objective(config, None, seed)
    zeros = jax.tree.map(
        lambda leaf: (
            jnp.asarray(np.zeros(leaf.shape, leaf.dtype))
            if isinstance(leaf, jax.ShapeDtypeStruct)
            else leaf
        ),
        shapes,
    )
    if len(jax.tree.leaves(zeros.init_params())) != len(arrays):
        return build_objective(config, None, seed)
    return zeros


def _trained(objective: Objective, params: PyTree) -> tuple[Objective, PyTree]:
    """The objective with `params` combined into the field they are the trainable arrays of
    (the one whose arrays `init_params()` returns), and that field's trained value."""
    initial = {id(leaf) for leaf in jax.tree.leaves(objective.init_params())}
    for name in (field.name for field in dataclasses.fields(objective)):
        value = getattr(objective, name, None)
        arrays = jax.tree.leaves(eqx.filter(value, eqx.is_inexact_array))
        if arrays and {id(leaf) for leaf in arrays} == initial:
            model = combine(params, value)
            return eqx.tree_at(lambda held, name=name: getattr(held, name), objective, model), model
    raise ValueError(
        f"the {type(objective).__name__} objective's parameters are not the trainable arrays "
        "of one of its fields, so load_run cannot tell which model they belong to."
    )
