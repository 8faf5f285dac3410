"""Gradient accumulation (`train_step(accumulate=k)`, `Trainer.fit(accumulate=k)`): one
accumulated step is the one big-batch step, for the LM (token-weighted: a micro-batch with
more targets weighs more), DPO and the classifier, and the window reports the big batch's
loss; against the definition, a float64 law over every `k` dividing the batch."""

import functools
import json
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _builders import TINY
from _checks import rejects
from hypothesis import given, settings
from hypothesis import strategies as st

from dew import Trainer
from dew._accumulate import micro_batches
from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
from dew.data import Dataset
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.classifier import ClassifierObjective
from dew.objectives.dpo import DPOObjective
from dew.objectives.lm import LMObjective
from dew.objectives.supervised import SupervisedObjective
from dew.registry import datasets
from dew.steps import TrainState, train_step
from dew.tracking import InMemoryTracker
from dew.training._compiled_step import compiled_steps

SGD = optax.sgd(1.0)  # the update is the gradient itself: params compare gradients
KEY = jax.random.key(3)  # the losses below ignore their key


@eqx.filter_jit  # the objective's arrays traced, `accumulate` and the flag static
def _step(objective, state, batch, accumulate=1, log_optimizer=False):
    logging = {"log_optimizer": True, "learning_rate": 1.0} if log_optimizer else {}
    return train_step(objective, SGD, state, batch, KEY, accumulate=accumulate, **logging)


def _state(objective):
    return TrainState.create(objective, SGD, key=jax.random.key(0))


def _largest_difference(left, right):
    pairs = zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True)
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)


def _assert_big_batch_step(objective, batch, accumulate, *, tolerance=1e-6, **kwargs):
    """The accumulated step's params and outputs are the big-batch step's within
    `tolerance` (absolute on the params; relative and absolute on each output)."""
    state = _state(objective)
    big_state, big = _step(objective, state, batch, **kwargs)
    state = _state(objective)
    small_state, small = _step(objective, state, batch, accumulate, **kwargs)
    assert int(small_state.step) == int(big_state.step) == 1
    assert _largest_difference(small_state.params, big_state.params) <= tolerance
    assert sorted(small) == sorted(big)
    for name, value in big.items():
        np.testing.assert_allclose(small[name], value, rtol=tolerance, atol=tolerance, err_msg=name)
    return big


# -- the LM: token-weighted --------------------------------------------------------------------

VOCAB, SEQ = 7, 8


@functools.cache
def _lm() -> LMObjective:
    model = CausalTransformer(
        vocab_size=VOCAB,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        mlp_features=32,
        max_seq_len=16,
        key=jax.random.key(0),
    )
    return LMObjective(model, seq_len=SEQ, pad_id=0)


def _lm_batch(rows=8, seed=0):
    """Rows ending in pads after a random length, and random per-token weights: the
    micro-batches hold very different target weights."""
    rng = np.random.default_rng(seed)
    text = rng.integers(1, VOCAB, (rows, SEQ + 1)).astype(np.int32)
    for row in range(rows):
        text[row, int(rng.integers(2, SEQ + 1)) :] = 0
    weights = rng.choice([0.0, 0.5, 1.0, 2.0], (rows, SEQ + 1)).astype(np.float32)
    return {"text": jnp.asarray(text), "weights": jnp.asarray(weights)}


@eqx.filter_jit
def _loss(objective, params, batch):
    return objective.loss(params, batch, KEY)[0]


@pytest.mark.parametrize("accumulate", [4, 8])
def test_an_accumulated_lm_step_is_the_big_batch_step(accumulate):
    objective, batch = _lm(), _lm_batch()
    big = _assert_big_batch_step(objective, batch, accumulate, log_optimizer=True)
    # The micro-batches' target weights differ, so a mean of their means is another loss:
    # the accumulation weighs each by its targets.
    micro = micro_batches(batch, accumulate)
    parts = [jax.tree.map(lambda leaf, i=i: leaf[i], micro) for i in range(accumulate)]
    weights = [float(objective.loss_weight(part)) for part in parts]
    assert len(set(weights)) > 1
    params = _lm().init_params()
    means = [float(_loss(objective, params, part)) for part in parts]
    assert abs(float(np.mean(means)) - float(big["loss"])) > 1e-3
    np.testing.assert_allclose(np.dot(weights, means) / sum(weights), big["loss"], rtol=1e-6)


def test_an_lm_micro_batch_of_pads_alone_adds_nothing():
    batch = _lm_batch()
    text = np.asarray(batch["text"]).copy()
    text[1::2, 1:] = 0  # micro-batch 1 of 2 (rows 1, 3, 5, 7): pads alone, no target
    batch = {"text": jnp.asarray(text), "weights": batch["weights"]}
    _assert_big_batch_step(_lm(), batch, 2, log_optimizer=True)


# -- DPO: a mean over pairs --------------------------------------------------------------------


@functools.cache
def _dpo() -> DPOObjective:
    def model(seed):
        return CausalTransformer(
            vocab_size=VOCAB,
            emb_features=16,
            num_layers=1,
            num_heads=2,
            mlp_features=32,
            max_seq_len=12,
            key=jax.random.key(seed),
        )

    return DPOObjective(model(0), model(1), beta=0.5, pad_id=0)


def _pairs(rows=8, length=9, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 4, rows)
    batch = {}
    for side in ("chosen", "rejected"):
        tokens = np.zeros((rows, length), np.int32)
        for row in range(rows):
            end = int(prompts[row]) + int(rng.integers(1, length - prompts[row] + 1))
            tokens[row, :end] = rng.integers(1, VOCAB, end)
        batch[side] = tokens
    mask = np.arange(length)[None, :] < prompts[:, None]
    batch["rejected"] = np.where(mask, batch["chosen"], batch["rejected"])
    return {**{key: jnp.asarray(value) for key, value in batch.items()}, "prompt_mask": mask}


@pytest.mark.parametrize("accumulate", [4])
def test_an_accumulated_dpo_step_is_the_big_batch_step(accumulate):
    _assert_big_batch_step(_dpo(), _pairs(), accumulate, log_optimizer=True)


# -- the classifier: sample-weighted, and a law over every k ------------------------------------

ROWS = 12


@functools.cache
def _classifier() -> ClassifierObjective:
    return ClassifierObjective(eqx.nn.MLP(4, 3, 8, 1, key=jax.random.key(0)), classes=3)


def _rows(seed, weighted):
    rng = np.random.default_rng(seed)
    batch = {
        "inputs": jnp.asarray(rng.normal(size=(ROWS, 4)), jnp.float32),
        "labels": jnp.asarray(rng.integers(0, 3, ROWS), jnp.int32),
    }
    if weighted:
        batch["sample_weight"] = jnp.asarray(rng.choice([0.0, 0.25, 1.0, 3.0], ROWS), jnp.float32)
    return batch


@pytest.mark.parametrize("weighted", [False, True])
def test_an_accumulated_classifier_step_is_the_big_batch_step(weighted):
    _assert_big_batch_step(_classifier(), _rows(0, weighted), 4, log_optimizer=True)


@settings(max_examples=20, deadline=None)
@given(
    accumulate=st.sampled_from([1, 2, 3, 4, 6, 12]),
    seed=st.integers(0, 2**16),
    weighted=st.booleans(),
)
def test_any_k_dividing_the_batch_gives_the_big_batch_step(accumulate, seed, weighted):
    batch = _rows(seed, weighted)
    if weighted and float(jnp.sum(batch["sample_weight"])) == 0:
        batch["sample_weight"] = batch["sample_weight"].at[0].set(1.0)
    _assert_big_batch_step(_classifier(), batch, accumulate)


def _row_squared_error(model, inputs, targets, sample_weight, key, training):
    return jnp.sum(jnp.square(jax.vmap(model)(inputs) - targets), axis=1)


@settings(max_examples=15, deadline=None)
@given(
    accumulate=st.sampled_from([2, 3, 4, 6, 12]),
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 7.0]), min_size=ROWS, max_size=ROWS),
)
def test_in_float64_the_accumulated_step_is_the_big_batch_step_exactly(accumulate, weights):
    """Against the definition: in float64 the accumulated step and the big-batch step agree to
    1e-12 (the float32 tests' 1e-6 is rounding, not a different sum)."""
    weights[0] = 1.0  # a batch that weighs something
    with jax.enable_x64(True):
        model = eqx.nn.MLP(4, 2, 8, 1, key=jax.random.key(1))
        objective = SupervisedObjective(model, _row_squared_error)
        assert jax.tree.leaves(objective.init_params())[0].dtype == jnp.float64
        rng = np.random.default_rng(accumulate)
        batch = {
            "inputs": jnp.asarray(rng.normal(size=(ROWS, 4))),
            "targets": jnp.asarray(rng.normal(size=(ROWS, 2))),
            "sample_weight": jnp.asarray(weights, jnp.float64),
        }
        _assert_big_batch_step(objective, batch, accumulate, tolerance=1e-12)


# -- the compiled step ---------------------------------------------------------------------------


def test_accumulate_one_is_the_step_without_a_scan():
    objective, batch = _classifier(), _rows(0, True)
    state = _state(objective)

    def jaxpr(accumulate):
        def step(state, batch):
            return train_step(objective, SGD, state, batch, KEY, accumulate=accumulate)

        return str(jax.make_jaxpr(step)(state, batch))

    assert "scan" not in jaxpr(1) and "scan" in jaxpr(2)
    arrays, static = eqx.partition(objective, eqx.is_array)
    compiled = (jax.tree.structure(arrays), static, SGD)
    plain, one = compiled_steps(*compiled), compiled_steps(*compiled, accumulate=1)
    assert plain[0].host is one[0].host and plain[1].device is one[1].device  # one cache entry
    assert compiled_steps(*compiled, accumulate=2)[0].host is not plain[0].host


def test_an_accumulated_step_holds_one_micro_batchs_activations():
    model = CausalTransformer(
        vocab_size=64,
        emb_features=32,
        num_layers=2,
        num_heads=2,
        mlp_features=64,
        max_seq_len=64,
        key=jax.random.key(0),
    )
    objective = LMObjective(model, seq_len=64)
    state, batch = _state(objective), {"text": jnp.zeros((64, 65), jnp.int32)}

    def temporary_bytes(accumulate):
        def step(state, batch):
            return train_step(objective, SGD, state, batch, KEY, accumulate=accumulate)

        compiled = jax.jit(step).lower(state, batch).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    # Measured on CPU (jax 0.10.2): 39.8 MB for the batch of 64 rows, 8.3 MB at
    # accumulate=4 and 2.1 MB at 16.
    assert temporary_bytes(4) < 0.35 * temporary_bytes(1)


def _fit(objective, batches, *, rows, steps, log_every, **kwargs):
    tracker = InMemoryTracker()
    data = Dataset(train=lambda partition: iter(batches), records=rows * steps, batch=rows)
    # SGD: Adam divides each gradient entry by its own scale, so a rounding-level difference
    # in an entry near zero would be a learning-rate-sized difference in its update.
    trainer = Trainer(objective, optax.sgd(0.5), key=jax.random.key(1), learning_rate=0.5)
    state = trainer.fit(data, steps, log_every=log_every, tracker=tracker, progress=False, **kwargs)
    return state, tracker.scalars


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_fit_with_accumulate_trains_and_reports_as_the_big_batches_do(steps_per_call):
    batches = [_lm_batch(seed=seed) for seed in range(4)]
    fit = functools.partial(
        _fit, _lm(), batches, rows=8, steps=4, log_every=2, steps_per_call=steps_per_call
    )
    big_state, big = fit(log_optimizer=True)
    state, reported = fit(accumulate=4, log_optimizer=True)
    assert int(state.step) == 4
    assert _largest_difference(state.params, big_state.params) <= 1e-6
    assert sorted(reported) == sorted(big)
    for tag, points in big.items():
        assert [step for step, _ in reported[tag]] == [step for step, _ in points] == [2, 4]
        np.testing.assert_allclose(
            [value for _, value in reported[tag]], [value for _, value in points], rtol=1e-5
        )


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, "4"])
def test_fit_refuses_an_accumulate_that_is_no_integer_above_zero(bad):
    message = rf"accumulate must be an integer >= 1, got {bad!r}\."
    with rejects(ValueError, message, parameter="accumulate"):
        _fit(_classifier(), [_rows(0, False)], rows=ROWS, steps=1, log_every=1, accumulate=bad)


def test_fit_refuses_an_accumulate_that_does_not_divide_the_batch():
    message = "accumulate=5 must divide the batch's rows, got a batch of 12 rows"
    with pytest.raises(ValueError, match=message):
        _fit(_classifier(), [_rows(0, False)], rows=ROWS, steps=1, log_every=1, accumulate=5)


# -- the configuration: trainer.accumulate ----------------------------------------------------


@pytest.mark.parametrize(
    ("accumulate", "message"),
    [
        (0, "trainer.accumulate must be an integer >= 1, got 0."),
        (
            3,
            "trainer.accumulate must divide trainer.batch_size (8) into equal micro-batches, "
            "got 3.",
        ),
    ],
)
def test_the_configuration_refuses_a_bad_accumulate(accumulate, message):
    trainer = {"batch_size": 8, "accumulate": accumulate}
    with pytest.raises(ValueError, match=re.escape(message)):
        RunConfig.from_dict({"model": {"name": "m"}, "data": {"name": "d"}, "trainer": trainer})


def test_dew_train_accumulates_records_it_and_resumes_with_another_value(tmp_path):
    def config(steps, accumulate):
        return RunConfig(
            model=ModelConfig("causal_transformer", dict(TINY)),
            data=datasets["token_windows"](seq_len=8, num_tokens=2048),
            optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
            trainer=TrainerConfig(
                name="tiny",
                checkpoint_dir=str(tmp_path),
                steps=steps,
                batch_size=8,
                log_every=2,
                checkpoint_every=2,
                accumulate=accumulate,
            ),
        )

    assert int(config(2, 4).train(progress=False).step) == 2
    record = json.loads((tmp_path / "tiny" / "run.json").read_text())
    assert record["trainer"]["accumulate"] == 4
    # the same run with another accumulate (the same updates in another memory) resumes
    assert int(config(4, 2).train(progress=False).step) == 4
