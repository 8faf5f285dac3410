"""LMObjective: the loss against a NumPy cross entropy, padding, errors, previews, learning."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import metrics
from dew.artifacts import TokenRows, TokenScores
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import combine
from dew.objectives.lm import LMObjective, Samples
from dew.steps import TrainState, train_step

VOCAB = 5


def _model(**change):
    sizes = {
        "vocab_size": VOCAB,
        "emb_features": 16,
        "num_layers": 1,
        "num_heads": 2,
        "mlp_features": 32,
        "max_seq_len": 16,
    }
    return CausalTransformer(**(sizes | change), key=jax.random.key(1))


def _rows(rows=4, length=9, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (rows, length)).astype(np.int32)


def _numpy_weighted_cross_entropy(logits, targets, weights):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    return (nll * weights).sum() / weights.sum(), nll


def test_loss_is_the_token_weighted_cross_entropy():
    objective = LMObjective(_model(), seq_len=8)
    tokens = _rows()
    weights = np.random.default_rng(1).random(tokens.shape).astype(np.float32)
    params = objective.init_params()
    loss, _ = eqx.filter_jit(objective.loss)(
        params, {"text": jnp.asarray(tokens), "weights": jnp.asarray(weights)}, jax.random.key(0)
    )
    # compiled once each: run eagerly, every operation compiles on its own (8 s against 2 s)
    forward = eqx.filter_jit(lambda p, rows: jax.vmap(combine(p, objective.model))(rows))
    logits = forward(params, jnp.asarray(tokens[:, :8]))
    expected, nll = _numpy_weighted_cross_entropy(logits, tokens[:, 1:], weights[:, 1:])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    scores = eqx.filter_jit(objective.evaluate)(
        params, {"text": jnp.asarray(tokens)}, jax.random.key(0)
    )
    assert isinstance(scores, TokenScores)
    np.testing.assert_allclose(scores.losses, nll, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(scores.weights, np.ones((4, 8), np.float32))
    np.testing.assert_array_equal(
        scores.correct, np.argmax(np.asarray(logits), -1) == tokens[:, 1:]
    )


def test_padding_targets_carry_zero_weight():
    objective = LMObjective(_model(), seq_len=8, pad_id=0)
    tokens = _rows(seed=3)
    tokens[:, 6:] = 0
    params = objective.init_params()
    evaluate, loss_of = eqx.filter_jit(objective.evaluate), eqx.filter_jit(objective.loss)
    scores = evaluate(params, {"text": jnp.asarray(tokens)}, jax.random.key(0))
    np.testing.assert_array_equal(scores.weights, (tokens[:, 1:] != 0).astype(np.float32))
    loss, _ = loss_of(params, {"text": jnp.asarray(tokens)}, jax.random.key(0))
    # Changing what follows the padding changes neither the counted logits nor the loss.
    other = tokens.copy()
    other[:, 7:] = 0
    other_loss, _ = loss_of(params, {"text": jnp.asarray(other)}, jax.random.key(0))
    np.testing.assert_allclose(loss, other_loss, rtol=1e-6)


def test_rows_longer_than_seq_len_plus_one_use_their_first_window():
    objective = LMObjective(_model(), seq_len=8)
    tokens = _rows(length=12)
    params = objective.init_params()
    long_loss, _ = objective.loss(params, {"text": jnp.asarray(tokens)}, jax.random.key(0))
    short_loss, _ = objective.loss(params, {"text": jnp.asarray(tokens[:, :9])}, jax.random.key(0))
    np.testing.assert_allclose(long_loss, short_loss)


def test_grad_through_the_loss_is_finite_and_reaches_every_parameter():
    objective = LMObjective(_model(), seq_len=8)
    grads = jax.jit(  # compiled: an eager grad dispatches op by op
        jax.grad(lambda p: objective.loss(p, {"text": jnp.asarray(_rows())}, jax.random.key(0))[0])
    )(objective.init_params())
    leaves = jax.tree.leaves(grads)
    assert all(np.isfinite(leaf).all() for leaf in leaves)
    assert sum(float(jnp.abs(leaf).sum()) > 0 for leaf in leaves) >= len(leaves) - 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (np.full((2, 9), 5, np.int32), r"token ID 5 at row 0, position 0; valid IDs are 0 to 4"),
        (np.full((2, 9), -1, np.int32), r"token ID -1 at row 0, position 0"),
        (np.zeros((2, 9), np.float32), "needs integer token IDs in batch\\['text'\\], got dtype"),
        (
            np.zeros((2, 8), np.int32),
            "rows of at least 9 token IDs in batch\\['text'\\], got rows of 8",
        ),
        (np.zeros((9,), np.int32), r"shaped \(rows, length\), got shape \(9,\)"),
    ],
)
def test_bad_token_batches_raise_before_any_compute(text, message):
    objective = LMObjective(_model(), seq_len=8)
    with pytest.raises(ValueError, match=message):
        objective.loss(objective.init_params(), {"text": jnp.asarray(text)}, jax.random.key(0))


def test_out_of_range_ids_raise_under_jit_too():
    objective = LMObjective(_model(), seq_len=8)
    loss = eqx.filter_jit(objective.loss)
    bad = {"text": jnp.full((2, 9), 9, jnp.int32)}
    with pytest.raises(Exception, match=r"token IDs outside \[0, 5\)"):
        jax.block_until_ready(loss(objective.init_params(), bad, jax.random.key(0)))


def test_missing_text_raises():
    objective = LMObjective(_model(), seq_len=8)
    with pytest.raises(
        KeyError, match=r"^LMObjective reads batch key 'text', but the batch has 'tokens'\.$"
    ):
        objective.loss(
            objective.init_params(), {"tokens": jnp.zeros((1, 9), jnp.int32)}, jax.random.key(0)
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 17}, "seq_len must be between 1 and the model's max_seq_len"),
        ({"seq_len": 8, "pad_id": 5}, r"pad_id must be a token ID in \[0, 5\)"),
        (
            {"seq_len": 15, "samples": Samples(prompt_len=16)},
            "need prompt_len < max_seq_len to leave room for a continuation",
        ),
    ],
)
def test_bad_objective_configuration_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LMObjective(_model(), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ({"top_k": 0}, "top_k must be None or an integer >= 1"),
        ({"top_p": 0.0}, r"top_p must be None or a real in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be None or a real in \(0, 1\], got 1.5"),
    ],
)
def test_bad_samples_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Samples(**kwargs)


def test_preview_continuations_are_capped_by_max_seq_len():
    objective = LMObjective(_model(max_seq_len=10), seq_len=8, samples=Samples(prompt_len=4))
    assert objective.new_tokens == 6
    preview = objective.preview(
        objective.init_params(), {"text": jnp.asarray(_rows())}, jax.random.key(0)
    )
    assert preview.tokens.shape == (4, 10)


def test_preview_continues_prompt_rows():
    samples = Samples(temperature=1.0, max_new_tokens=5, prompt_len=3, num_samples=2)
    objective = LMObjective(_model(), seq_len=8, samples=samples)
    tokens = jnp.asarray(_rows())
    params = objective.init_params()
    preview = objective.preview(params, {"text": tokens}, jax.random.key(2))
    assert isinstance(preview, TokenRows)
    assert preview.tokens.shape == (2, 8)
    np.testing.assert_array_equal(preview.tokens[:, :3], tokens[:2, :3])
    np.testing.assert_array_equal(preview.mask[0], [False] * 3 + [True] * 5)
    assert int(preview.tokens.min()) >= 0
    assert int(preview.tokens.max()) < VOCAB
    again = objective.preview(params, {"text": tokens}, jax.random.key(2))
    np.testing.assert_array_equal(preview.tokens, again.tokens)


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_greedy_preview_follows_the_argmax_and_the_narrowest_filters_are_greedy():
    model = _model()
    tokens = jnp.asarray(_rows())
    greedy = LMObjective(model, seq_len=8, samples=Samples(temperature=0.0, prompt_len=3))
    top1 = LMObjective(model, seq_len=8, samples=Samples(top_k=1, prompt_len=3))
    nucleus = LMObjective(model, seq_len=8, samples=Samples(top_p=1e-6, prompt_len=3))
    params = greedy.init_params()
    rows = greedy.preview(params, {"text": tokens}, jax.random.key(0)).tokens
    for narrowest in (top1, nucleus):
        np.testing.assert_array_equal(
            rows, narrowest.preview(params, {"text": tokens}, jax.random.key(5)).tokens
        )
    logits = jax.vmap(model)(rows)
    np.testing.assert_array_equal(rows[:, 3:], np.argmax(np.asarray(logits), -1)[:, 2:-1])


@pytest.mark.slow
def test_training_drives_the_loss_far_below_its_start():
    objective = LMObjective(_model(), seq_len=8)
    optimizer = optax.adam(1e-2)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    cycle = np.array([0, 1, 2, 3, 4, 0, 1, 2, 3], np.int32)
    batch = {"text": jnp.asarray(np.stack([np.roll(cycle, -i) for i in range(5)]))}
    step = jax.jit(lambda s, b, k: train_step(objective, optimizer, s, b, k), donate_argnums=0)
    losses = []
    for i in range(60):
        state, out = step(state, batch, jax.random.key(i))
        losses.append(float(out["loss"]))
    assert losses[-1] < 0.05 * losses[0]
    scores = objective.evaluate(state.params, batch, jax.random.key(0))
    ppl = metrics.perplexity()
    assert float(ppl.finalize(ppl(scores))) < 1.1
