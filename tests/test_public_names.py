"""Every public name has one home (decision 0086): one public module lists it in `__all__`,
so the API reference shows it once; a few documented shortcuts stay importable elsewhere.

Run as a script (`python tests/test_public_names.py`) it prints the inventory: how many
public namespaces and `__all__` entries there are, and every object listed under several
public paths. Issue 28 counted 411 entries over 47 namespaces, 24 objects listed under two
to four paths and 28 metric classes beside their factories before this change.
"""

import collections
import importlib
import types

import pytest
from test_reference_site import public_modules

# Shortcuts a product document or the guides import from a second namespace: importable
# there, never in that namespace's `__all__` (decision 0086). Each maps to its home.
ALIASES = {
    # the dew guide imports these from `dew` (`from dew import Trainer, metrics`) ...
    "dew.Trainer": "dew.training.Trainer",
    "dew.evaluate": "dew.evaluation.evaluate",
    "dew.Evaluation": "dew.evaluation.Evaluation",
    "dew.load_run": "dew.config.load_run",
    "dew.LoadedRun": "dew.config.LoadedRun",
    "dew.profile": "dew.profiling.profile",
    "dew.Profile": "dew.profiling.Profile",
    "dew.InMemoryTracker": "dew.tracking.InMemoryTracker",
    "dew.Trackers": "dew.tracking.Trackers",
    "dew.LocalTracker": "dew.tracking.local.LocalTracker",
    "dew.MLflowTracker": "dew.tracking.mlflow.MLflowTracker",
    "dew.TensorBoardTracker": "dew.tracking.tensorboard.TensorBoardTracker",
    "dew.WandbTracker": "dew.tracking.wandb.WandbTracker",
    # ... and the trackers from `dew.training` too
    "dew.training.InMemoryTracker": "dew.tracking.InMemoryTracker",
    "dew.training.Trackers": "dew.tracking.Trackers",
    "dew.training.LocalTracker": "dew.tracking.local.LocalTracker",
    "dew.training.MLflowTracker": "dew.tracking.mlflow.MLflowTracker",
    "dew.training.TensorBoardTracker": "dew.tracking.tensorboard.TensorBoardTracker",
    "dew.training.WandbTracker": "dew.tracking.wandb.WandbTracker",
    # the tracking package holds every tracker dew ships
    "dew.tracking.LocalTracker": "dew.tracking.local.LocalTracker",
    "dew.tracking.MLflowTracker": "dew.tracking.mlflow.MLflowTracker",
    "dew.tracking.TensorBoardTracker": "dew.tracking.tensorboard.TensorBoardTracker",
    "dew.tracking.WandbTracker": "dew.tracking.wandb.WandbTracker",
    # the backbones package and the objectives' modules
    "dew.nn.backbones.CausalTransformer": "dew.nn.backbones.causal_transformer.CausalTransformer",
    "dew.nn.backbones.BidirectionalTransformer": (
        "dew.nn.backbones.bidirectional_transformer.BidirectionalTransformer"
    ),
    "dew.nn.backbones.DiT": "dew.nn.backbones.dit.DiT",
    "dew.nn.backbones.ViT": "dew.nn.backbones.vit.ViT",
    "dew.objectives.AbstractObjective": "dew.objectives.base.AbstractObjective",
    "dew.objectives.Objective": "dew.objectives.base.AbstractObjective",
    "dew.objectives.base.Objective": "dew.objectives.base.AbstractObjective",
    "dew.objectives.lm.generate": "dew.objectives.sampling.generate",
    "dew.objectives.lm.Generation": "dew.objectives.sampling.Generation",
    "dew.objectives.lm.Samples": "dew.objectives.sampling.Samples",
    "dew.objectives.dpo.Samples": "dew.objectives.sampling.Samples",
    "dew.objectives.grpo.Samples": "dew.objectives.sampling.Samples",
    # the artifacts' transfers and the process agreements they use
    "dew.artifacts.agree_process_phase": "dew.distributed.agree_process_phase",
    "dew.artifacts.PhaseFailedError": "dew.distributed.PhaseFailedError",
}

# Values whose identity says nothing (equal strings and numbers may be one object).
_PLAIN = (str, bytes, int, float, bool, tuple, frozenset, type(None))


def _import(name):
    try:
        return importlib.import_module(name)
    except ImportError as error:  # an optional extra imported at import time
        if __name__ != "__main__":
            pytest.skip(f"{name} needs the optional {error.name}")
        raise


def inventory() -> tuple[int, int, dict[int, list[str]]]:
    """The number of public namespaces with an `__all__`, their `__all__` entries, and each
    listed object (by identity; modules and plain values left out) with its public paths."""
    namespaces = entries = 0
    homes: dict[int, list[str]] = collections.defaultdict(list)
    for name in public_modules():
        module = _import(name)
        listed = getattr(module, "__all__", None)
        if listed is None:
            continue
        namespaces += 1
        entries += len(listed)
        for attribute in listed:
            value = getattr(module, attribute)
            if not isinstance(value, (types.ModuleType, *_PLAIN)):
                homes[id(value)].append(f"{name}.{attribute}")
    return namespaces, entries, homes


def _resolve(path: str):
    module, _, attribute = path.rpartition(".")
    return getattr(_import(module), attribute)


def test_every_listed_object_has_one_home():
    _, _, homes = inventory()
    several = sorted(paths for paths in homes.values() if len(paths) > 1)
    assert several == [], "objects listed in the __all__ of several public modules"


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_a_documented_shortcut_is_its_home_s_object_and_not_listed(alias):
    home = ALIASES[alias]
    assert _resolve(alias) is _resolve(home)
    module, _, attribute = alias.rpartition(".")
    assert attribute not in _import(module).__all__, f"{alias} is listed beside {home}"
    home_module, _, home_attribute = home.rpartition(".")
    assert home_attribute in _import(home_module).__all__, f"{home} is not listed at home"


def test_a_built_in_metric_is_built_by_its_factory_alone():
    from dew import metrics

    classes = sorted(
        name
        for name in metrics.__all__
        if isinstance(getattr(metrics, name), type)
        and issubclass(getattr(metrics, name), metrics.Metric)
    )
    assert classes == ["Metric", "MetricSet"]
    # the factories build what the classes did, under the same names
    assert metrics.perplexity().name == "perplexity"
    assert metrics.psnr(data_range=255.0).data_range == 255.0
    with pytest.raises(AttributeError):
        metrics.Perplexity  # noqa: B018


@pytest.mark.parametrize(
    "internal",
    [
        "dew.training.counts_line",
        "dew.training.key_text",
        "dew.training.verbose_console",
        "dew.evaluation.run_pass",
        "dew.evaluation.PassResult",
        "dew.config.sweep.LEDGER_VERSION",
        "dew.config.sweep.OWNER_ATTR",
        "dew.nn.inception.FID_WEIGHTS_FILENAME",
        "dew.nn.inception.FID_WEIGHTS_SHA256_PREFIX",
        "dew.nn.inception.FID_WEIGHTS_URL",
        "dew.supervised.gaussian_crps",
    ],
)
def test_an_internal_name_is_not_listed(internal):
    module, _, attribute = internal.rpartition(".")
    assert attribute not in _import(module).__all__


if __name__ == "__main__":
    namespaces, entries, homes = inventory()
    several = sorted(paths for paths in homes.values() if len(paths) > 1)
    print(f"{entries} __all__ entries over {namespaces} public namespaces")
    print(f"{len(several)} objects listed under several public paths")
    for paths in several:
        print("  " + ", ".join(paths))
