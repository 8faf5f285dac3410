"""Exporting a trained run for use without dew (`dew export`): its parameters as a
`.safetensors` file, or its model's forward function as StableHLO through `jax.export`.

- `export_run(run, "safetensors", out)` writes `out/model.safetensors`, the trained
  parameters under stable dotted names (`weight_names`), and `out/config.json`: the run's
  model and objective sections, the dew version, the checkpoint's step and which weights
  were used. Any `safetensors` reader loads it (`safetensors.numpy.load_file`).
- `export_run(run, "stablehlo", out)` writes `out/model.exported`, the model's forward
  function over a batch (`jax.vmap` of its `__call__`; weights included) serialized by
  `jax.export` with a symbolic batch dimension `b`, and `out/signature.json`: its inputs and
  outputs, their shapes (with `"b"` for the batch) and dtypes. `jax.export.deserialize`
  reads it back; `.call(*inputs)` runs it on any batch size.

The forward function, and the per-row shapes of its inputs, come from the run's objective
and one batch of its data (`forward`): a classifier's model on the batch's inputs, a
language model on `seq_len` token IDs, a diffusion model on images or clips with a time and
a class label, a JEPA run's (target) encoder on images. Each export measures its parity on
that batch, the largest absolute difference between what the export computes and what dew's
model computes, and records it, with what was written, in the run folder's `exports.json`.
"""

import datetime
import json
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

import dew
from dew._json import read_json, write_atomic
from dew._run_folder import EXPORTS, RunFolder
from dew._safetensors import read_safetensors, safetensors_bytes
from dew.config._load import LoadedRun, example_batch, load_run
from dew.data._optional import optional
from dew.objectives.base import combine
from dew.objectives.classifier import ClassifierObjective
from dew.objectives.diffusion import DiffusionObjective
from dew.objectives.jepa import JEPAObjective
from dew.objectives.lm import LMObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective
from dew.objectives.supervised import SupervisedObjective

__all__ = ["EXPORTS", "FORMATS", "Forward", "export_run", "forward", "weight_names"]

FORMATS = ("safetensors", "stablehlo")
"""The formats `export_run` and `dew export --format` write."""
_FORWARDS = (
    ClassifierObjective,
    SupervisedObjective,
    LMObjective,
    MaskedDiffusionObjective,
    DiffusionObjective,
    JEPAObjective,
)
"""The objectives `forward` exports a function of."""
_FILES = {
    "safetensors": ("model.safetensors", "config.json"),
    "stablehlo": ("model.exported", "signature.json"),
}


def weight_names(params: PyTree) -> dict[str, Any]:
    """The arrays of `params` (a model's trainable arrays, `LoadedRun.params`) by their
    dotted names, in the tree's order: the Equinox pytree path of each array, an attribute
    as its name, a tuple or list element as its index and a dict entry as its key, joined
    with `.` (`encoder.blocks.0.attention.qkv.weight`). The names depend only on the
    model's structure, so two runs of one configuration name their arrays alike.

    **Raises:** `ValueError` when two arrays would share a name (a dict key holding `.`).

    ```python
    >>> import equinox as eqx, jax
    >>> mlp = eqx.nn.MLP(2, 1, 4, depth=1, key=jax.random.key(0))
    >>> list(weight_names(eqx.filter(mlp, eqx.is_inexact_array)))
    ['layers.0.weight', 'layers.0.bias', 'layers.1.weight', 'layers.1.bias']

    ```
    """
    named: dict[str, Any] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = ".".join(_key_name(key) for key in path)
        if name in named:
            raise ValueError(f"two arrays of the model are both named {name!r}.")
        named[name] = leaf
    return named


def _key_name(key: Any) -> str:
    for attribute in ("name", "idx", "key"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


class Forward(NamedTuple):
    """A model's forward function over a batch, and an example batch of its inputs.

    - `function`: `function(model, *inputs)` maps the batched inputs (each with a leading
      row axis) to the batched outputs: `jax.vmap` of the model's `__call__`.
    - `inputs`: one batch of each input, from the run's data, in the order `function`
      takes them; `input_names` names them, `output_name` names the output.
    - `describes`: what `function` computes, in a few words.
    """

    function: Callable[..., Any]
    inputs: tuple[np.ndarray, ...]
    input_names: tuple[str, ...]
    output_name: str
    describes: str


def _mapped(model: Any, *inputs: Any) -> Any:
    return jax.vmap(model)(*inputs)


def _unconditional(model: Any, data: Any, times: Any) -> Any:
    return jax.vmap(lambda x, t: model(x, t))(data, times)


def _encoded(model: Any, images: Any) -> Any:
    return jax.vmap(model.encoder)(images)


def forward(loaded: LoadedRun, batch: Mapping[str, Any]) -> Forward:
    """The loaded model's forward function over a batch, with its inputs from `batch` (one
    batch of the run's data), for the objectives the built-in configurations train:

    - `ClassifierObjective`, `SupervisedObjective`: the model on `batch[inputs]` (logits,
      predictions);
    - `LMObjective`, `MaskedDiffusionObjective`: the model on the first `seq_len` token
      IDs of `batch["text"]` (logits);
    - `DiffusionObjective`: the model's velocity at `batch["images"]` (or `"clips"`), at
      times spread over [0, 1] and, for a class-conditional model, `batch["labels"]`;
    - `JEPAObjective`: the encoder's features of `batch["images"]` (with the EMA weights by
      default: the target encoder).

    **Raises:** `ValueError` for another objective, naming those it exports.
    """
    objective = loaded.objective
    name = f"vmap({type(loaded.model).__name__})"
    if isinstance(objective, ClassifierObjective | SupervisedObjective):
        key = objective.inputs if isinstance(objective, ClassifierObjective) else "inputs"
        output = "logits" if isinstance(objective, ClassifierObjective) else "predictions"
        return Forward(_mapped, (np.asarray(batch[key]),), (key,), output, name)
    if isinstance(objective, LMObjective | MaskedDiffusionObjective):
        tokens = np.asarray(batch["text"])[:, : objective.seq_len].astype(np.int32)
        return Forward(_mapped, (tokens,), ("tokens",), "logits", name)
    if isinstance(objective, DiffusionObjective):
        data = np.asarray(batch[objective.field], np.float32)
        times = np.linspace(0.0, 1.0, len(data), dtype=np.float32)
        if objective.conditional:
            inputs = (data, times, np.asarray(batch["labels"], np.int32))
            return Forward(_mapped, inputs, (objective.field, "t", "labels"), "velocity", name)
        return Forward(_unconditional, (data, times), (objective.field, "t"), "velocity", name)
    if isinstance(objective, JEPAObjective):
        images = (np.asarray(batch["images"], np.float32),)
        encoder = f"vmap({type(loaded.model.encoder).__name__})"
        return Forward(_encoded, images, ("images",), "features", encoder)
    exported = ", ".join(kind.__name__ for kind in _FORWARDS)
    raise ValueError(
        f"dew export writes the forward function of runs of {exported}; {loaded.folder} "
        f"trained a {type(objective).__name__} (export its parameters as safetensors)."
    )


def export_run(
    run: LoadedRun | str | os.PathLike[str],
    format: str,
    out: str | os.PathLike[str],
    *,
    step: int | None = None,
    weights: str = "auto",
    force: bool = False,
) -> dict[str, Any]:
    """Export the run `run` (a run folder, or a `LoadedRun`; `step` and `weights` as
    `dew.load_run` takes them) in `format` (`FORMATS`) to the folder `out` (created if
    absent), measure its parity on one batch of the run's data, and record the export in
    the run folder's `exports.json`.

    **Returns:** the record (`format`, `out`, `files`, `step`, `weights`, `parity`: the
    largest absolute difference between the export and dew's model on the batch, the split
    it is `on` and its `rows`, and the dew version and time). A safetensors export of an
    objective `forward` exports no function of (DPO, GRPO) measures its parity on the
    parameters themselves (`on: "parameters"`, `rows: 0`).

    **Raises:** `ValueError` for another format, an objective `forward` does not export, or
    an `out` that already holds the export's files (unless `force`), before anything is
    written; and as `load_run`.
    """
    if format not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}.")
    folder = pathlib.Path(out)
    names = _FILES[format]
    taken = [name for name in names if (folder / name).exists()]
    if taken and not force:
        raise ValueError(
            f"{folder} already holds {', '.join(taken)}: export to another folder, or replace "
            "them with --force (force=True)."
        )
    if format == "stablehlo":  # jax.export serializes with it
        optional("flatbuffers", "export", "dew export --format stablehlo")
    loaded = run if isinstance(run, LoadedRun) else load_run(run, step=step, weights=weights)
    function, split = None, "parameters"
    if format == "stablehlo" or isinstance(loaded.objective, _FORWARDS):
        split, batch = example_batch(loaded)
        function = forward(loaded, batch)
    folder.mkdir(parents=True, exist_ok=True)
    if format == "safetensors":
        difference = _safetensors(loaded, function, folder)
    else:
        assert function is not None  # forward() raised for an objective it does not export
        difference = _stablehlo(loaded, function, folder)
    rows = 0 if function is None else len(function.inputs[0])
    record = {
        "format": format,
        "out": os.fspath(folder.absolute()),
        "files": list(names),
        "step": loaded.step,
        "weights": loaded.weights,
        "parity": {"max_abs_difference": difference, "on": split, "rows": rows},
        "dew_version": dew.__version__,
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    _record(loaded.folder, record)
    return record


def _largest_difference(left: Any, right: Any) -> float:
    pairs = zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True)
    differences = [
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
        for a, b in pairs
    ]
    return max(differences, default=0.0)


def _safetensors(loaded: LoadedRun, function: Forward | None, folder: pathlib.Path) -> float:
    """Write the params and config.json; the parity of the model rebuilt from the file's
    arrays (of the arrays themselves where `forward` exports no function of the model)."""
    arrays = {name: np.asarray(leaf) for name, leaf in weight_names(loaded.params).items()}
    settings = loaded.config.to_dict()
    metadata = {"step": str(loaded.step), "weights": loaded.weights, "dew": dew.__version__}
    data = safetensors_bytes(arrays, metadata)
    write_atomic(folder / "model.safetensors", data)
    config = {
        "model": settings["model"],
        "objective": settings.get("objective"),
        "classes": None if loaded.classes is None else list(loaded.classes),
        "step": loaded.step,
        "weights": loaded.weights,
        "dew_version": dew.__version__,
        "names": "dotted Equinox pytree paths of the model's trainable arrays "
        "(dew.export.weight_names)",
    }
    write_atomic(folder / "config.json", json.dumps(config, indent=2) + "\n")
    read = read_safetensors(folder / "model.safetensors")
    paths = jax.tree_util.tree_flatten_with_path(loaded.params)
    rebuilt = jax.tree.unflatten(
        paths[1], [jnp.asarray(read[name]) for name in weight_names(loaded.params)]
    )
    if function is None:
        return _largest_difference(rebuilt, loaded.params)
    computed = eqx.filter_jit(function.function)
    return _largest_difference(
        computed(combine(rebuilt, loaded.model), *function.inputs),
        computed(loaded.model, *function.inputs),
    )


def _stablehlo(loaded: LoadedRun, function: Forward, folder: pathlib.Path) -> float:
    """Write the serialized forward function and its signature; the parity of the export."""
    batch = jax.export.symbolic_shape("b")
    specs = [
        jax.ShapeDtypeStruct((*batch, *value.shape[1:]), value.dtype) for value in function.inputs
    ]
    model = loaded.model
    exported = jax.export.export(jax.jit(lambda *inputs: function.function(model, *inputs)))(*specs)
    write_atomic(folder / "model.exported", bytes(exported.serialize()))
    signature = {
        "function": function.describes,
        "inputs": [
            _described(name, aval)
            for name, aval in zip(function.input_names, exported.in_avals, strict=True)
        ],
        "outputs": [_described(function.output_name, aval) for aval in exported.out_avals],
        "step": loaded.step,
        "weights": loaded.weights,
        "dew_version": dew.__version__,
    }
    write_atomic(folder / "signature.json", json.dumps(signature, indent=2) + "\n")
    return _largest_difference(
        exported.call(*function.inputs), eqx.filter_jit(function.function)(model, *function.inputs)
    )


def _described(name: str, aval: Any) -> dict[str, Any]:
    shape = [size if isinstance(size, int) else str(size) for size in aval.shape]
    return {"name": name, "shape": shape, "dtype": np.dtype(aval.dtype).name}


def _record(folder: pathlib.Path, record: dict[str, Any]) -> None:
    """Append `record` to the run folder's `exports.json`."""
    path = RunFolder(folder).exports
    records = read_json(path, "a run's record of its exports") if path.exists() else []
    if not isinstance(records, list):
        raise ValueError(f"{path} holds a {type(records).__name__}, not a list of exports.")
    write_atomic(path, json.dumps([*records, record], indent=2) + "\n")
