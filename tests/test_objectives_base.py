"""The objective base: abstract or final as in Equinox, the final preview over the preview hook,
and the default metrics each built-in objective declares."""

import inspect

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.artifacts import TokenRows, TokenScores
from dew.nn.backbones import BidirectionalTransformer, CausalTransformer
from dew.objectives import AbstractObjective, Objective
from dew.objectives.base import combine, trainable
from dew.objectives.dpo import DPOObjective
from dew.objectives.grpo import GRPOObjective
from dew.objectives.lm import LMObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective

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
