"""Masked diffusion: the NELBO against a NumPy reference, the forward process's statistics,
the ancestral sampler's schedule, the artifacts it returns, bad inputs, and learning."""

import itertools
import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _checks import rejects

from dew import Trainer
from dew._checks import explain_failure
from dew._domains import evaluation_key
from dew.artifacts import TokenRows
from dew.data import Dataset
from dew.metrics import Metric
from dew.nn.backbones import BidirectionalTransformer, CausalTransformer
from dew.objectives.masked_diffusion import (
    MaskedDiffusionObjective,
    ancestral_sample,
    masked_diffusion_nelbo,
)
from dew.steps import TrainState, train_step
from dew.telemetry.records import SamplingProtocol
from dew.tracking import InMemoryTracker
from dew.training._evaluation_event import key_text

VOCAB = 5
SEQ = 6
RNG = np.random.default_rng(0)

MODEL = BidirectionalTransformer(
    vocab_size=VOCAB,
    emb_features=16,
    num_layers=1,
    num_heads=2,
    mlp_features=32,
    max_seq_len=8,
    key=jax.random.key(0),
)
OBJECTIVE = MaskedDiffusionObjective(MODEL, seq_len=SEQ, sampling_steps=4, preview_count=3)
PARAMS = OBJECTIVE.init_params()
# Compiled once per module and reused by several tests.
LOSS = jax.jit(lambda params, batch, key: OBJECTIVE.loss(params, batch, key))
LOGITS = jax.jit(jax.vmap(MODEL))
EVALUATE = jax.jit(lambda params, batch, key: OBJECTIVE.evaluate(params, batch, key))
PREVIEW = jax.jit(lambda params, batch, key: OBJECTIVE.preview(params, batch, key))


def _tokens(rows: int, length: int = SEQ, vocab: int = VOCAB) -> jax.Array:
    return jnp.asarray(RNG.integers(0, vocab, (rows, length)), jnp.int32)


def _reference_nelbo(logits, tokens, masked, t) -> np.ndarray:
    """(1/t) * sum over masked positions of -log softmax(logits)[x] / seq, in float64."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, np.asarray(tokens)[..., None], axis=-1)[..., 0]
    masked_nll = np.where(np.asarray(masked), nll, 0.0)
    return masked_nll.sum(axis=-1) / np.asarray(t, np.float64) / logits.shape[1]


# The NELBO formula.


def test_nelbo_matches_a_float64_numpy_reference():
    rows, seq, vocab = 4, 7, 6
    logits = jnp.asarray(RNG.normal(0.0, 3.0, (rows, seq, vocab)), jnp.float32)
    tokens = _tokens(rows, seq, vocab)
    masked = jnp.asarray(RNG.random((rows, seq)) < 0.5)
    t = jnp.asarray([0.001, 0.25, 0.5, 0.999], jnp.float32)
    got = masked_diffusion_nelbo(logits, tokens, masked, t)
    assert got.shape == (rows,)
    np.testing.assert_allclose(got, _reference_nelbo(logits, tokens, masked, t), rtol=1e-5)


def test_unmasked_positions_carry_zero_weight():
    rows, seq, vocab = 3, 5, 4
    logits = jnp.asarray(RNG.normal(size=(rows, seq, vocab)), jnp.float32)
    tokens = _tokens(rows, seq, vocab)
    masked = jnp.asarray(RNG.random((rows, seq)) < 0.5).at[:, 0].set(False)
    t = jnp.asarray([0.2, 0.5, 0.9], jnp.float32)
    noise = jnp.asarray(RNG.normal(0.0, 10.0, logits.shape), jnp.float32)
    scrambled = jnp.where(masked[..., None], logits, logits + noise)
    other_tokens = jnp.where(masked, tokens, (tokens + 1) % vocab)
    base = masked_diffusion_nelbo(logits, tokens, masked, t)
    np.testing.assert_array_equal(masked_diffusion_nelbo(scrambled, tokens, masked, t), base)
    np.testing.assert_array_equal(masked_diffusion_nelbo(logits, other_tokens, masked, t), base)
    grads = jax.grad(lambda x: masked_diffusion_nelbo(x, tokens, masked, t).sum())(logits)
    assert not np.asarray(grads)[~np.asarray(masked)].any()
    assert np.asarray(grads)[np.asarray(masked)].any()
    nothing = jnp.zeros_like(masked)
    np.testing.assert_array_equal(masked_diffusion_nelbo(logits, tokens, nothing, t), 0.0)


def test_the_loss_is_the_nelbo_of_the_corruption_its_key_draws():
    tokens = _tokens(8)
    batch = {"text": jnp.concatenate([tokens, _tokens(8, 2)], axis=1)}  # only SEQ IDs used
    key = jax.random.key(3)
    loss, aux = LOSS(PARAMS, batch, key)
    noisy, masked, t = OBJECTIVE.corrupt(tokens, key)
    np.testing.assert_array_equal(noisy, np.where(masked, MODEL.mask_id, tokens))
    assert np.all((t >= OBJECTIVE.time_epsilon) & (t < 1.0))
    logits = LOGITS(noisy)
    assert logits.shape == (8, SEQ, VOCAB)  # no logit for the mask token
    reference = _reference_nelbo(logits, tokens, masked, t).mean()
    np.testing.assert_allclose(loss, reference, rtol=1e-5)
    assert set(aux) == {"masked_fraction"}
    np.testing.assert_allclose(aux["masked_fraction"], np.asarray(masked).mean(), rtol=1e-6)


def test_masking_follows_t_and_the_weighting_is_unbiased():
    # Each position is masked with probability t, and E[(1/t) * masked / seq] = 1, so a
    # uniform denoiser's NELBO is log(vocab) in expectation: the weight is 1/t.
    rows, seq = 256, 64
    tokens = jnp.zeros((rows, seq), jnp.int32)
    keys = jax.random.split(jax.random.key(7), 16)
    _, masked, t = jax.vmap(lambda key: OBJECTIVE.corrupt(tokens, key))(keys)
    fraction = np.asarray(masked, np.float64).mean(axis=-1)
    t = np.asarray(t, np.float64)
    assert abs((fraction - t).mean()) < 0.005
    assert np.abs(fraction - t).max() < 0.3
    assert abs(np.corrcoef(fraction.ravel(), t.ravel())[0, 1] - 1.0) < 0.05
    assert abs(t.mean() - (1.0 + OBJECTIVE.time_epsilon) / 2.0) < 0.02
    # Low-discrepancy times: each draw's rows are evenly spaced over [epsilon, 1).
    gaps = np.diff(np.sort(t, axis=-1), axis=-1)
    np.testing.assert_allclose(gaps, (1.0 - OBJECTIVE.time_epsilon) / rows, rtol=1e-3)
    uniform = jnp.zeros((rows, seq, VOCAB), jnp.float32)
    nelbo = jax.vmap(lambda masks, times: masked_diffusion_nelbo(uniform, tokens, masks, times))(
        masked, jnp.asarray(t, jnp.float32)
    )
    assert abs(float(jnp.mean(nelbo)) / math.log(VOCAB) - 1.0) < 0.03


@pytest.mark.slow
def test_the_loss_jits_and_differentiates():
    batch = {"text": _tokens(8, SEQ + 2)}
    key = jax.random.key(1)
    loss_and_grad = eqx.filter_jit(
        jax.value_and_grad(
            lambda params, batch, key: OBJECTIVE.loss(params, batch, key), has_aux=True
        )
    )
    (loss, aux), grads = loss_and_grad(PARAMS, batch, key)
    np.testing.assert_allclose(loss, LOSS(PARAMS, batch, key)[0], rtol=1e-5)
    assert np.isfinite(float(loss)) and 0.0 <= float(aux["masked_fraction"]) <= 1.0
    leaves = jax.tree.leaves(grads)
    assert leaves and all(bool(jnp.isfinite(leaf).all()) for leaf in leaves)
    assert any(bool((leaf != 0).any()) for leaf in leaves)
    # Under jit, out-of-range IDs are caught by a runtime check, not silently clamped.
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"outside \[0, 5\)"):
        loss_and_grad(PARAMS, {"text": batch["text"].at[0, 0].set(VOCAB)}, key)


# The sampler.


class _Counter(eqx.Module):
    """A denoiser that puts all its mass on the token equal to the number of masked
    positions it sees. Real tokens are 0..seq and the mask is seq + 1, so a generated
    token records how many positions were still masked at the step that unmasked it."""

    seq: int = eqx.field(static=True)

    @property
    def vocab_size(self) -> int:
        return self.seq + 1

    @property
    def mask_id(self) -> int:
        return self.seq + 1

    def __call__(self, tokens):
        count = jnp.sum(tokens == self.mask_id).astype(jnp.int32)
        hit = jnp.arange(self.vocab_size, dtype=jnp.int32)[None, :] == jnp.full((1, 1), count)
        return jnp.broadcast_to(jnp.where(hit, 0.0, -1e9), (tokens.shape[0], self.vocab_size))


def test_one_sampling_step_unmasks_everything_at_once():
    # Through the objective, so its sampling_steps is what the sampler runs.
    objective = MaskedDiffusionObjective(MODEL, seq_len=SEQ, sampling_steps=1)
    counting = eqx.tree_at(lambda objective: objective.model, objective, _Counter(SEQ))
    batch = {"text": _tokens(32)}
    rows = counting.evaluate(counting.init_params(), batch, jax.random.key(0))
    np.testing.assert_array_equal(rows.tokens, SEQ)
    four_steps = eqx.tree_at(lambda objective: objective.model, OBJECTIVE, _Counter(SEQ))
    rows = four_steps.evaluate(four_steps.init_params(), batch, jax.random.key(0))
    assert (np.asarray(rows.tokens) < SEQ).any()


def test_the_sampler_follows_the_reverse_schedule():
    rows, seq, steps = 64, 64, 4
    counter = _Counter(seq)
    mask_id = counter.mask_id
    values = np.asarray(
        ancestral_sample(
            counter, jax.random.key(5), rows=rows, seq_len=seq, steps=steps, mask_id=mask_id
        )
    )
    assert (values != mask_id).all()
    for row in values:
        distinct = sorted(set(row.tolist()), reverse=True)
        assert len(distinct) <= steps  # one model call per step
        # Each value is the masked count when it was drawn; the count then drops by the
        # number of positions drawn at that step. A token rewritten later breaks the chain.
        assert distinct[0] == seq
        for higher, lower in itertools.pairwise(distinct):
            assert lower == higher - int((row == higher).sum())
    # (s - t) / s from s to t on a uniform grid unmasks a position at each step with
    # probability 1/steps: a quarter at the first step, and the mean count is seq*(S+1)/(2S).
    assert abs((values == seq).mean() - 1.0 / steps) < 0.03
    assert abs(values.mean() - seq * (steps + 1) / (2 * steps)) < 2.0


def test_evaluate_returns_one_batch_of_generated_rows():
    batch = {"text": _tokens(5, SEQ + 2)}
    rows = EVALUATE(PARAMS, batch, jax.random.key(0))
    assert isinstance(rows, TokenRows)
    assert rows.tokens.shape == (5, SEQ) and rows.num_rows == 5
    assert jnp.issubdtype(rows.tokens.dtype, jnp.integer)
    assert rows.mask is not None and bool(rows.mask.all())
    tokens = np.asarray(rows.tokens)
    assert (tokens >= 0).all() and (tokens < VOCAB).all()  # never the mask ID
    again = EVALUATE(PARAMS, batch, jax.random.key(0))
    np.testing.assert_array_equal(again.tokens, tokens)
    other = EVALUATE(PARAMS, batch, jax.random.key(1))
    assert (np.asarray(other.tokens) != tokens).any()


def test_preview_draws_the_configured_count():
    batch = {"text": _tokens(5)}
    rows = PREVIEW(PARAMS, batch, jax.random.key(2))
    assert isinstance(rows, TokenRows) and rows.tokens.shape == (OBJECTIVE.preview_count, SEQ)
    tokens = np.asarray(rows.tokens)
    assert (tokens >= 0).all() and (tokens < VOCAB).all()
    np.testing.assert_array_equal(PREVIEW(PARAMS, batch, jax.random.key(2)).tokens, tokens)
    assert OBJECTIVE.name == "masked_diffusion"


# Bad input.


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (jnp.full((2, SEQ), VOCAB, jnp.int32), r"token ID 5 .* valid IDs are 0 to 4"),
        (jnp.full((2, SEQ), -1, jnp.int32), r"token ID -1 .* valid IDs are 0 to 4"),
        (jnp.zeros((2, SEQ), jnp.float32), r"integer token IDs .* float32"),
        (jnp.zeros((2, SEQ - 1), jnp.int32), rf"rows of at least {SEQ} .* got rows of {SEQ - 1}"),
        (jnp.zeros((SEQ,), jnp.int32), r"shaped \(rows, length\)"),
    ],
)
def test_bad_batches_raise_before_any_compute(text, match):
    with pytest.raises(ValueError, match=match):
        OBJECTIVE.loss(PARAMS, {"text": text}, jax.random.key(0))
    with pytest.raises(ValueError, match=match):
        OBJECTIVE.evaluate(PARAMS, {"text": text}, jax.random.key(0))


def test_a_batch_without_text_names_the_key():
    with pytest.raises(KeyError, match=r"reads batch key 'text', but the batch has 'tokens'\."):
        OBJECTIVE.loss(PARAMS, {"tokens": _tokens(2)}, jax.random.key(0))


@pytest.mark.parametrize(
    ("arguments", "match", "parameter"),
    [
        ({"seq_len": 0}, r"seq_len must be an integer >= 1, got 0", ""),
        ({"seq_len": 9}, r"seq_len must be between 1 and .* \(8\), got 9", ""),
        ({"seq_len": 2.5}, r"seq_len must be an integer >= 1, got 2.5", "seq_len"),
        ({"seq_len": True}, r"seq_len must be an integer >= 1, got True", "seq_len"),
        ({"seq_len": 4, "sampling_steps": 0}, r"sampling_steps must be an integer >= 1, got 0", ""),
        ({"seq_len": 4, "preview_count": 0}, r"preview_count must be an integer >= 1, got 0", ""),
        (
            {"seq_len": 4, "preview_count": 2.0},
            r"preview_count must be an integer",
            "preview_count",
        ),
        ({"seq_len": 4, "time_epsilon": 0.0}, r"time_epsilon .* between 0 and 1, got 0.0", ""),
        ({"seq_len": 4, "time_epsilon": 1.0}, r"time_epsilon .* between 0 and 1, got 1.0", ""),
        ({"seq_len": 4, "time_epsilon": math.nan}, r"time_epsilon .* got nan", ""),
        ({"seq_len": 4, "time_epsilon": "0.1"}, r"time_epsilon .* got '0.1'", "time_epsilon"),
    ],
)
def test_bad_constructor_arguments_raise(arguments, match, parameter):
    with rejects(ValueError, match, parameter=parameter):
        MaskedDiffusionObjective(MODEL, **arguments)


def test_a_causal_model_is_refused():
    causal = CausalTransformer(
        vocab_size=VOCAB,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        mlp_features=32,
        max_seq_len=8,
        key=jax.random.key(0),
    )
    with rejects(
        ValueError, r"needs a BidirectionalTransformer .* CausalTransformer", parameter="model"
    ):
        MaskedDiffusionObjective(causal, seq_len=4)


# Learning.


@pytest.mark.slow
def test_training_learns_the_patterns_and_samples_reproduce_them():
    # Two patterns over disjoint tokens: each position alone is a coin flip between two
    # tokens, so samples match a pattern only if the denoiser reads the unmasked tokens.
    length = MODEL.max_seq_len
    patterns = jnp.stack([jnp.arange(length, dtype=jnp.int32) % 2 + 2 * p for p in range(2)])
    batch = {"text": jnp.tile(patterns, (8, 1))}
    objective = MaskedDiffusionObjective(MODEL, seq_len=length, sampling_steps=16)
    optimizer = optax.adam(1e-2)
    state = TrainState.create(objective, optimizer, key=jax.random.key(1))
    step = jax.jit(
        lambda state, batch, key: train_step(objective, optimizer, state, batch, key),
        donate_argnums=0,
    )
    losses = []
    for key in jax.random.split(jax.random.key(2), 100):
        state, metrics = step(state, batch, key)
        losses.append(float(metrics["loss"]))
    start, end = np.mean(losses[:5]), np.mean(losses[-20:])
    assert end < 0.4 * start, (start, end)
    generate = eqx.filter_jit(objective.evaluate)
    rows = np.asarray(generate(state.params, batch, jax.random.key(3)).tokens)
    matches = (rows[:, None, :] == np.asarray(patterns)[None]).all(axis=-1).any(axis=-1)
    # Independent coin flips would match a pattern in 2 / 2**8 of the rows.
    assert matches.mean() > 0.5, rows


def test_a_failed_compiled_loss_becomes_the_host_check():
    batch = {"text": _tokens(2).at[1, 3].set(VOCAB)}
    message = r"batch\['text'\] holds token ID 5 at row 1, position 3; valid IDs are 0 to 4"
    with pytest.raises(ValueError, match=message), explain_failure(OBJECTIVE, batch):
        jax.block_until_ready(jax.jit(OBJECTIVE.loss)(PARAMS, batch, jax.random.key(0)))
    with pytest.raises(ValueError, match=message):
        OBJECTIVE.check_batch(batch)
    OBJECTIVE.check_batch({"text": _tokens(2)})


# The sampling protocol.


class MeanToken(Metric[TokenRows]):
    """The mean generated token ID: something to score generated rows with."""

    name: str = eqx.field(static=True, default="mean_token")
    artifact_type: ClassVar[type[TokenRows]] = TokenRows

    def init(self):
        return jnp.zeros((2,), jnp.float32)

    def statistics(self, artifact: TokenRows):
        tokens = artifact.tokens.astype(jnp.float32)
        return jnp.stack([tokens.sum(), jnp.asarray(tokens.size, jnp.float32)])

    def merge(self, accumulated, contribution):
        return accumulated + contribution

    def finalize(self, accumulated):
        return accumulated[0] / accumulated[1]


@pytest.mark.slow  # a fit with an evaluation that samples: compiles the sampler
def test_a_fit_reports_its_sampling_protocol():
    rows = {"text": _tokens(5)}
    data = Dataset(
        train=lambda partition: itertools.repeat(rows),
        val=lambda partition: iter([rows, {"text": _tokens(3)}]),
    )
    tracker = InMemoryTracker()
    key = jax.random.key(4)
    Trainer(OBJECTIVE, optax.adam(1e-3), key=key).fit(
        data, 2, log_every=2, eval_every=2, metrics=[MeanToken()], tracker=tracker, progress=False
    )
    protocol = {
        "objective": "masked_diffusion",
        "solver": "ancestral",
        "steps": 4,
        "guidance": None,  # the ancestral sampler takes none
        "seed_domain": None,  # it draws from the scoring keys themselves
        "conditioning": "unconditional",
    }
    assert tracker.artifacts["sampling_protocol"] == [
        (0, SamplingProtocol(**protocol)),
        (
            2,
            SamplingProtocol(
                **protocol,
                generated_rows=8,
                real_rows=8,
                event_key=key_text(evaluation_key(key, 2)),
            ),
        ),
    ]
