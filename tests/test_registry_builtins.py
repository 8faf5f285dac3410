"""dew's built-in registry entries are held as the `"module:attribute"` that defines them and
imported when first looked up (decision 0047): listing, counting and checking names imports no
model, objective, optimizer or dataset module, and no JAX; a looked-up entry is the very object
its module defines."""

import json
import os
import subprocess
import sys

import pytest

from dew import _builtin_objectives, _datasets, _shapes
from dew._registry import Registry
from dew.data._huggingface import huggingface_entry
from dew.data._image_folder import image_folder_entry
from dew.data._text import text_entry
from dew.nn.backbones.bidirectional_transformer import BidirectionalTransformer
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.nn.backbones.dit import DiT
from dew.nn.backbones.vit import ViT
from dew.objectives.lm import LMObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective
from dew.registry import datasets, models, objectives, optimizers

JAX_FAMILY = ("jax", "jaxlib", "equinox", "optax", "orbax")


def test_a_built_in_entry_is_the_object_its_module_defines():
    import optax

    assert {name: models[name] for name in models} == {
        "bidirectional_transformer": BidirectionalTransformer,
        "causal_transformer": CausalTransformer,
        "dit": DiT,
        "vit": ViT,
    }
    assert {name: objectives[name] for name in objectives} == {
        "classifier": _builtin_objectives.classifier,
        "diffusion": _builtin_objectives.diffusion,
        "dpo": _builtin_objectives.dpo,
        "grpo": _builtin_objectives.grpo,
        "jepa": _builtin_objectives.jepa,
        "lm": LMObjective,
        "masked_diffusion": MaskedDiffusionObjective,
    }
    assert {name: optimizers[name] for name in optimizers} == {
        "adafactor": optax.adafactor,
        "adam": optax.adam,
        "adamw": optax.adamw,
        "lion": optax.lion,
        "rmsprop": optax.rmsprop,
        "sgd": optax.sgd,
    }
    assert {name: datasets.builder(name) for name in datasets} == {
        "arrays": _datasets.arrays_file,
        "huggingface": huggingface_entry,
        "image_folder": image_folder_entry,
        "moving_shapes": _shapes.moving_shapes,
        "preference_pairs": _datasets.preference_pairs,
        "prompts": _datasets.prompts,
        "shapes": _shapes.shapes,
        "text": text_entry,
        "token_windows": _datasets.token_windows,
        "tokens": _datasets.token_file,
    }


# In a fresh interpreter: what naming the built-ins imports, then what one look-up imports.
NAMING = """
import json, sys
from dew.registry import datasets, models, objectives, optimizers
from dew.config import override, builtin
def loaded():
    return sorted({{name.partition(".")[0] for name in sys.modules}} & set({banned!r}))
report = {{"names": [list(registry) for registry in (models, objectives, optimizers, datasets)]}}
report["sizes"] = [len(registry) for registry in (models, objectives, optimizers, datasets)]
report["in"] = ["vit" in models, "adamw" in optimizers, "jepa" in objectives, "x" in datasets]
try:
    models["vti"]
except KeyError as error:
    report["unknown"] = str(error)
report["config"] = override(builtin("tiny_jepa"), {{"optim.learning_rate": 0.5}}).to_dict()["optim"]
report["after naming"] = loaded()
models["vit"]
report["after a look-up"] = loaded()
print(json.dumps(report))
"""


@pytest.mark.slow  # the look-up imports JAX, about 5 s
def test_naming_the_built_ins_imports_none_of_them():
    result = subprocess.run(
        [sys.executable, "-c", NAMING.format(banned=JAX_FAMILY)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["names"] == [
        ["bidirectional_transformer", "causal_transformer", "dit", "vit"],
        ["classifier", "diffusion", "dpo", "grpo", "jepa", "lm", "masked_diffusion"],
        ["adafactor", "adam", "adamw", "lion", "rmsprop", "sgd"],
        [
            "arrays",
            "huggingface",
            "image_folder",
            "moving_shapes",
            "preference_pairs",
            "prompts",
            "shapes",
            "text",
            "token_windows",
            "tokens",
        ],
    ]
    assert report["sizes"] == [4, 7, 6, 10]
    assert report["in"] == [True, True, True, False]
    assert report["unknown"] == (
        "no model is registered as 'vti'; registered: 'bidirectional_transformer', "
        "'causal_transformer', 'dit', 'vit'."
    )
    assert report["config"]["learning_rate"] == 0.5
    assert report["after naming"] == []
    assert {"jax", "equinox"} <= set(report["after a look-up"])


def test_a_built_in_is_imported_and_checked_at_its_first_look_up():
    def only_dumps(name, entry):
        if entry is not json.dumps:
            raise TypeError(f"widget {name!r} is not json.dumps")

    widgets = Registry("widget", check=only_dumps)
    widgets._register_builtin("dumps", "json:dumps")
    widgets._register_builtin("loads", "json:loads")
    widgets._register_builtin("missing", "dew_no_such_module:entry")
    assert widgets.names() == ("dumps", "loads", "missing") and len(widgets) == 3
    assert widgets["dumps"] is json.dumps
    with pytest.raises(TypeError, match=r"widget .loads. is not json\.dumps"):  # its check
        widgets["loads"]
    with pytest.raises(ModuleNotFoundError, match="dew_no_such_module"):
        widgets["missing"]
    with pytest.raises(ValueError, match="a widget is already registered as 'dumps'"):
        widgets._register_builtin("dumps", "json:dumps")
    with pytest.raises(ValueError, match="a widget name must be a non-empty string"):
        widgets._register_builtin(" x", "json:dumps")


def test_a_built_in_is_replaced_and_unregistered_without_importing_it():
    widgets = Registry("widget")
    widgets._register_builtin("first", "dew_no_such_module:first")
    widgets._register_builtin("second", "dew_no_such_module:second")
    with pytest.raises(ValueError, match="already registered as 'first'; pass replace=True"):
        widgets.register("first", len)
    widgets.register("first", len, replace=True)
    widgets.unregister("second")
    assert widgets.names() == ("first",) and widgets["first"] is len


def test_a_snapshot_of_the_entries_restores_a_built_in_not_yet_looked_up():
    """tests/conftest.py puts every registry's entries back after each test as a copy of its
    `_entries`: a built-in copied before its look-up is looked up again after the restore."""
    widgets = Registry("widget")
    widgets._register_builtin("dumps", "json:dumps")
    snapshot = dict(widgets._entries)
    assert widgets["dumps"] is json.dumps
    widgets.register("dumps", len, replace=True)
    widgets._entries.clear()
    widgets._entries.update(snapshot)
    assert widgets["dumps"] is json.dumps
