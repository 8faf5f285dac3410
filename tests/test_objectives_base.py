"""The objective base: abstract or final as in Equinox, the final preview over the preview hook,
the default metrics each built-in objective declares, and the batch keys each one reads."""

import functools
import inspect

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.artifacts import TokenRows, TokenScores
from dew.naming import Split
from dew.nn.backbones import BidirectionalTransformer, CausalTransformer
from dew.nn.backbones.dit import DiT
from dew.nn.backbones.vit import ViT
from dew.objectives import AbstractObjective, Objective
from dew.objectives.base import (
    MissingBatchKeyError,
    check_batch_keys,
    check_on_host,
    check_token_batch,
    check_token_ids,
    combine,
    trainable,
)
from dew.objectives.classifier import ClassifierObjective
from dew.objectives.diffusion import DiffusionObjective
from dew.objectives.dpo import DPOObjective
from dew.objectives.grpo import GRPOObjective
from dew.objectives.jepa import JEPAObjective
from dew.objectives.lm import LMObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective
from dew.objectives.supervised import SupervisedObjective

SIZES = {"emb_features": 16, "num_layers": 1, "num_heads": 2, "mlp_features": 32}
BUILT_INS = (LMObjective, MaskedDiffusionObjective, DPOObjective, GRPOObjective)


def _reward(prompts, completions):
    return jnp.zeros(completions.shape[:2], jnp.float32)


def _built_ins():
    causal = CausalTransformer(vocab_size=4, max_seq_len=12, **SIZES, key=jax.random.key(0))
    bidirectional = BidirectionalTransformer(
        vocab_size=4, max_seq_len=8, **SIZES, key=jax.random.key(1)
    )
    return {
        LMObjective: LMObjective(causal, seq_len=8),
        MaskedDiffusionObjective: MaskedDiffusionObjective(bidirectional, seq_len=8),
        DPOObjective: DPOObjective(causal, causal, beta=0.1),
        GRPOObjective: GRPOObjective(causal, causal, _reward, group_size=2, max_new_tokens=3),
    }


def _concrete_methods(cls):
    return {
        name
        for name, member in vars(cls).items()
        if inspect.isfunction(member)
        and not name.startswith("__")
        and name not in cls.__abstractmethods__
    }


def test_objective_is_the_abstract_base_under_its_first_name():
    assert Objective is AbstractObjective
    assert all(isinstance(objective, Objective) for objective in _built_ins().values())


@pytest.mark.parametrize("cls", BUILT_INS, ids=lambda cls: cls.__name__)
def test_a_built_in_objective_overrides_no_concrete_method_of_the_base(cls):
    concrete = _concrete_methods(AbstractObjective)
    assert "preview" in concrete
    overridden = sorted(
        name for name in concrete if getattr(cls, name) is not vars(AbstractObjective)[name]
    )
    assert overridden == []
    assert not cls.__abstractmethods__  # final: every abstract method is implemented


def test_the_default_metrics_are_declared_by_each_objective():
    declared = {
        cls: tuple(metric.name for metric in objective.default_metrics())
        for cls, objective in _built_ins().items()
    }
    assert declared == {
        LMObjective: ("perplexity", "token_accuracy"),
        MaskedDiffusionObjective: (),
        DPOObjective: (),
        GRPOObjective: (),
    }


class _Regression(AbstractObjective):
    """A user objective without a preview of its own: it previews its scoring artifact."""

    model: eqx.nn.Linear
    name: str = eqx.field(static=True, default="regression")
    preview_value: object = None

    def init_params(self):
        return trainable(self.model)

    def loss(self, params, batch, key):
        return jnp.mean(jax.vmap(combine(params, self.model))(batch["x"]) ** 2), {}

    def evaluate(self, params, batch, key):
        losses = jax.vmap(combine(params, self.model))(batch["x"])
        return TokenScores(losses, jnp.ones_like(losses))

    def batch_keys(self, split):
        return {"x": None}

    def check_batch(self, batch):
        return None

    def generate_preview(self, params, batch, key):
        return self.preview_value

    def default_metrics(self):
        return ()


def test_the_preview_is_the_scoring_artifact_when_the_hook_generates_none():
    objective = _Regression(eqx.nn.Linear(2, 3, key=jax.random.key(0)))
    params, batch, key = objective.init_params(), {"x": jnp.ones((4, 2))}, jax.random.key(1)
    scored = objective.evaluate(params, batch, key)
    assert objective.preview(params, batch, key, scored) is scored
    fresh = objective.preview(params, batch, key)
    np.testing.assert_array_equal(np.asarray(fresh.losses), np.asarray(scored.losses))
    rows = TokenRows(jnp.zeros((1, 3), jnp.int32))
    generating = _Regression(objective.model, preview_value=rows)
    assert generating.preview(params, batch, key, scored) is rows


def test_a_preview_that_is_not_an_artifact_is_refused_naming_the_objective():
    objective = _Regression(eqx.nn.Linear(2, 3, key=jax.random.key(0)), preview_value="rows")
    with pytest.raises(TypeError, match="_Regression's preview must be a dew artifact, got str"):
        objective.preview(objective.init_params(), {"x": jnp.ones((1, 2))}, jax.random.key(0))


def test_an_objective_missing_a_hook_cannot_be_built():
    class Unfinished(AbstractObjective):
        name: str = eqx.field(static=True, default="unfinished")

        def init_params(self):
            return {}

        def loss(self, params, batch, key):
            return jnp.zeros(()), {}

        def evaluate(self, params, batch, key):
            return TokenRows(jnp.zeros((1, 1), jnp.int32))

    with pytest.raises(TypeError, match="abstract"):
        Unfinished()


def _squared_error(model, inputs, targets, sample_weight, key, training):
    return jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets))


@functools.cache
def _every_objective():
    """One of each objective dew ships (an image and a clip diffusion model both), built at
    the first test that reads it, not while the suite is collected."""
    vit = ViT(16, 4, 3, width=16, depth=1, heads=2, key=jax.random.key(2))
    images, clips = (
        DiT(16, 4, 3, width=16, depth=1, heads=2, frames=frames, key=jax.random.key(3))
        for frames in (None, 2)
    )
    linear = eqx.nn.Linear(4, 3, key=jax.random.key(4))
    return {
        **{cls.__name__: objective for cls, objective in _built_ins().items()},
        "DiffusionObjective": DiffusionObjective(images),
        "DiffusionObjective (clips)": DiffusionObjective(clips),
        "JEPAObjective": JEPAObjective(vit, vit, key=jax.random.key(5)),
        "ClassifierObjective": ClassifierObjective(linear, 3, inputs="features"),
        "SupervisedObjective": SupervisedObjective(linear, _squared_error),
    }


READS = {  # what each reads from a training batch, and what names each key
    "LMObjective": {"text": None},
    "MaskedDiffusionObjective": {"text": None},
    "DPOObjective": {"chosen": None, "rejected": None},
    "GRPOObjective": {"prompts": None},
    "DiffusionObjective": {"images": "its DiT has no frames"},
    "DiffusionObjective (clips)": {"clips": "its DiT has frames"},
    "JEPAObjective": {"images": None},
    "ClassifierObjective": {"features": "its `inputs` field", "labels": None},
    "SupervisedObjective": {"inputs": None, "targets": None},
}


@pytest.mark.parametrize("name", sorted(READS))
def test_every_objective_declares_the_keys_it_reads_and_its_checks_agree(name):
    objective = _every_objective()[name]
    assert dict(objective.batch_keys(Split.TRAIN)) == READS[name]
    evaluated = dict(objective.batch_keys(Split.VALIDATION))
    assert evaluated == ({"chosen": None} if name == "DPOObjective" else READS[name])
    for split, keys in ((Split.TRAIN, READS[name]), (Split.VALIDATION, evaluated)):
        with pytest.raises(MissingBatchKeyError) as caught:
            check_batch_keys(objective, {"other": np.zeros(2)}, split)
        message = str(caught.value)
        assert message.startswith(f"{type(objective).__name__} reads batch ")
        assert message.endswith(", but the batch has 'other'.")
        assert all(repr(key) in message for key in keys)
    # The objective's own host checks name a missing key the same way, on the batch
    # `evaluate` reads (a DPO batch without 'rejected' is one).
    with pytest.raises(MissingBatchKeyError) as own:
        objective.check_batch({"other": np.zeros(2)})
    assert str(own.value) == message
    assert isinstance(own.value, KeyError) and isinstance(own.value, ValueError)


def test_a_missing_key_is_named_with_what_names_it_and_the_keys_the_batch_has():
    classifier = _every_objective()["ClassifierObjective"]
    batch = {"images": np.zeros((2, 4)), "labels": np.zeros(2, np.int32)}
    with pytest.raises(MissingBatchKeyError) as caught:
        check_batch_keys(classifier, batch, Split.TRAIN)
    assert str(caught.value) == (
        "ClassifierObjective reads batch key 'features' (its `inputs` field), but the batch "
        "has 'images', 'labels'."
    )
    dpo = _every_objective()["DPOObjective"]
    pairs = {"chosen": np.zeros((2, 4), np.int32), "prompt_mask": np.zeros((2, 4), bool)}
    check_batch_keys(dpo, pairs, Split.VALIDATION)  # `evaluate` reads the chosen rows alone
    with pytest.raises(ValueError, match=r"^DPOObjective reads batch key 'rejected', but the "):
        check_batch_keys(dpo, pairs, Split.TRAIN)
    supervised = _every_objective()["SupervisedObjective"]
    with pytest.raises(ValueError, match=r"keys 'inputs' and 'targets', but the batch has no keys"):
        check_batch_keys(supervised, {}, Split.TRAIN)
    rows = (np.zeros((2, 4)), np.zeros(2))
    with pytest.raises(ValueError, match="but the batch is a tuple, not a mapping of keys"):
        check_batch_keys(supervised, rows, Split.TRAIN)


def _token_objectives():
    causal = CausalTransformer(
        vocab_size=5, emb_features=8, num_layers=1, num_heads=2, mlp_features=8,
        max_seq_len=8, key=jax.random.key(0),
    )  # fmt: skip
    bidirectional = BidirectionalTransformer(
        vocab_size=5, emb_features=8, num_layers=1, num_heads=2, mlp_features=8,
        max_seq_len=8, key=jax.random.key(0),
    )  # fmt: skip
    return [
        (LMObjective(causal, seq_len=7), 8),
        (MaskedDiffusionObjective(bidirectional, seq_len=8), 8),
    ]


@pytest.mark.parametrize("index", [0, 1], ids=["lm", "masked_diffusion"])
def test_a_host_batch_is_checked_in_numpy_without_a_copy_to_the_device(index):
    # Before: check_token_batch copied every host batch to the device (jnp.asarray) and
    # sliced it there, which the transfer guard refuses.
    objective, length = _token_objectives()[index]
    good = {"text": np.arange(2 * length, dtype=np.int32).reshape(2, length) % 5}
    bad = {"text": np.where(np.arange(length) == 3, 9, 0)[None].repeat(2, 0).astype(np.int32)}
    with jax.transfer_guard("disallow"):
        assert check_on_host(objective, good) is None
        with pytest.raises(ValueError, match="token ID 9 at row 0, position 3") as on_host:
            check_on_host(objective, bad)
    kind = type(objective).__name__
    assert str(on_host.value) == (
        f"{kind}: batch['text'] holds token ID 9 at row 0, position 3; valid IDs are 0 to 4 "
        "(vocab_size=5)."
    )


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (np.zeros((2, 6), np.float32), "got dtype float32"),
        (np.zeros((2, 3, 6), np.int32), r"shaped \(rows, length\), got shape \(2, 3, 6\)"),
        (np.zeros((2, 3), np.int32), "rows of at least 5 token IDs .* got rows of 3"),
        (np.array([[0, 1, 2, 3, -1, 0]], np.int32), "token ID -1 at row 0, position 4"),
        ([[0, 1, 2, 3, 4, 0]], "got dtype None"),
    ],
    ids=["dtype", "axes", "length", "id", "not an array"],
)
def test_check_token_ids_raises_what_check_token_batch_raises(tokens, message):
    limits = {"vocab_size": 4, "min_length": 5}
    with pytest.raises(ValueError, match=message) as host_half:
        check_token_ids("Kind", "text", tokens, **limits)
    with pytest.raises(ValueError, match=message) as whole:
        check_token_batch("Kind", "text", tokens, **limits)
    assert str(host_half.value) == str(whole.value)
    good = np.array([[0, 1, 2, 3, 3, 0]], np.int32)
    assert check_token_ids("Kind", "text", good, **limits) is None
    checked = check_token_batch("Kind", "text", good, **limits)
    assert isinstance(checked, jax.Array) and np.array_equal(checked, good)


def test_check_on_host_raises_the_objectives_own_error_and_leaves_methods_pytrees():
    model = CausalTransformer(
        vocab_size=5, emb_features=8, num_layers=1, num_heads=2, mlp_features=8,
        max_seq_len=8, key=jax.random.key(0),
    )  # fmt: skip
    objective = LMObjective(model, seq_len=8)
    good = {"text": np.zeros((2, 9), np.int32)}
    bad = {"text": np.full((2, 9), 7, np.int32)}
    assert check_on_host(objective, good) is None
    with pytest.raises(ValueError, match="token ID 7 at row 0, position 0") as on_host:
        check_on_host(objective, bad)
    with pytest.raises(ValueError, match="token ID 7") as direct:
        objective.check_batch(bad)
    assert str(on_host.value) == str(direct.value)
    # outside the host checks a method looked up on an objective is still Equinox's pytree
    assert isinstance(objective.loss, eqx.Module)
    assert objective.loss.__self__ is objective
