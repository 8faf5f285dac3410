"""DPOObjective: its loss and metrics against a float64 NumPy reference of the paper's
formula, masking, gradients (none into the reference), evaluate and preview, errors,
and a short training run that learns a preference."""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _checks import rejects

from dew import metrics
from dew._checks import explain_failure
from dew.artifacts import TokenRows, TokenScores
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import trainable
from dew.objectives.dpo import DPOObjective
from dew.objectives.sampling import Samples, sample_continuations
from dew.steps import TrainState, train_step

VOCAB = 6
PAD = 0


@eqx.filter_jit
def _build(key, max_seq_len: int, sharpen) -> CausalTransformer:
    model = CausalTransformer(
        vocab_size=VOCAB,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        mlp_features=32,
        max_seq_len=max_seq_len,
        key=key,
    )
    return eqx.tree_at(lambda m: m.stack.head.weight, model, model.stack.head.weight * sharpen)


@functools.cache
def _model(seed: int, *, max_seq_len: int = 12, sharpen: float = 8.0) -> CausalTransformer:
    """A tiny random model whose output head is scaled up, so its log-probabilities
    differ clearly from uniform. Built under one jit: the tests run on 2 CPU cores."""
    return _build(jax.random.key(seed), max_seq_len, jnp.float32(sharpen))


@eqx.filter_jit
def _loss(objective, params, batch):
    return objective.loss(params, batch, jax.random.key(0))


@eqx.filter_jit
def _logits(model, tokens):
    return jax.vmap(model)(tokens)


_sample = eqx.filter_jit(sample_continuations)


def _random_pairs(seed: int, *, rows: int = 5, length: int = 9, separate_masks: bool = False):
    """Rows of prompt, response and trailing PAD, as NumPy arrays. Prompt and response
    tokens are in [1, VOCAB); prompt lengths and response lengths vary by row and side."""
    rng = np.random.default_rng(seed)
    batch = {}
    prompt_lengths = rng.integers(1, 4, rows)
    for side in ("chosen", "rejected"):
        tokens = np.full((rows, length), PAD, np.int32)
        mask = np.zeros((rows, length), bool)
        for row in range(rows):
            prompt = int(prompt_lengths[row]) if not separate_masks else int(rng.integers(1, 4))
            response = int(rng.integers(1, length - prompt + 1))
            tokens[row, : prompt + response] = rng.integers(1, VOCAB, prompt + response)
            mask[row, :prompt] = True
        batch[side] = tokens
        batch[f"{side}_prompt_mask"] = mask
    if not separate_masks:
        # One shared prompt: the chosen row's prompt tokens on both sides.
        shared = batch["chosen_prompt_mask"]
        batch["rejected"] = np.where(shared, batch["chosen"], batch["rejected"])
        batch["prompt_mask"] = shared
        del batch["chosen_prompt_mask"], batch["rejected_prompt_mask"]
    return batch


def _jnp(batch):
    return {key: jnp.asarray(value) for key, value in batch.items()}


def _numpy_log_probs(model, tokens: np.ndarray) -> np.ndarray:
    """log p(token_t | tokens_<t), t >= 1, from the model's logits in float64."""
    logits = np.asarray(_logits(model, jnp.asarray(tokens[:, :-1])), np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return np.take_along_axis(log_softmax, tokens[:, 1:, None].astype(np.int64), -1)[..., 0]


def _numpy_counted(tokens: np.ndarray, prompt_mask: np.ndarray, pad_id) -> np.ndarray:
    counted = ~prompt_mask[:, 1:]
    if pad_id is not None:
        counted &= tokens[:, 1:] != pad_id
    return counted


def _numpy_dpo(policy, reference, batch, beta, pad_id):
    """The DPO loss and metrics of Rafailov et al. (2023), eq. 7, in float64."""
    rewards = {}
    for side in ("chosen", "rejected"):
        tokens = batch[side]
        mask = batch["prompt_mask"] if "prompt_mask" in batch else batch[f"{side}_prompt_mask"]
        counted = _numpy_counted(tokens, mask, pad_id)
        policy_lp = np.sum(_numpy_log_probs(policy, tokens) * counted, axis=1)
        reference_lp = np.sum(_numpy_log_probs(reference, tokens) * counted, axis=1)
        rewards[side] = beta * (policy_lp - reference_lp)
    h = rewards["chosen"] - rewards["rejected"]
    return np.mean(np.logaddexp(0.0, -h)), {
        "reward_accuracy": np.mean(h > 0),
        "reward_margin": np.mean(h),
        "chosen_reward": np.mean(rewards["chosen"]),
        "rejected_reward": np.mean(rewards["rejected"]),
    }


# Against the float64 reference.


@pytest.mark.parametrize(
    ("seed", "pad_id", "separate_masks", "beta"),
    [(0, PAD, False, 0.1), (1, PAD, True, 0.5), (2, None, False, 2.0)],
)
def test_loss_and_metrics_match_numpy_reference(seed, pad_id, separate_masks, beta):
    policy, reference = _model(seed), _model(seed + 100)
    batch = _random_pairs(seed, separate_masks=separate_masks)
    objective = DPOObjective(policy, reference, beta=beta, pad_id=pad_id)
    loss, aux = _loss(objective, objective.init_params(), _jnp(batch))
    expected_loss, expected_aux = _numpy_dpo(policy, reference, batch, beta, pad_id)
    np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-5, atol=1e-6)
    assert sorted(aux) == sorted(expected_aux)
    for name, value in expected_aux.items():
        np.testing.assert_allclose(float(aux[name]), value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_live_params_not_the_objectives_policy_enter_the_loss():
    policy, reference, other = _model(0), _model(1), _model(2)
    batch = _random_pairs(3)
    objective = DPOObjective(policy, reference, beta=0.5, pad_id=PAD)
    loss, _ = _loss(objective, trainable(other), _jnp(batch))
    expected, _ = _numpy_dpo(other, reference, batch, 0.5, PAD)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_loss_is_log_two_when_the_policy_is_the_reference():
    model = _model(0)
    objective = DPOObjective(model, model, beta=0.5, pad_id=PAD)
    loss, aux = _loss(objective, objective.init_params(), _jnp(_random_pairs(4)))
    assert float(loss) == pytest.approx(math.log(2.0), abs=1e-7)
    assert float(aux["reward_margin"]) == 0.0
    assert float(aux["reward_accuracy"]) == 0.0


# Masking.


def test_pad_targets_count_like_excluded_positions_whatever_they_hold():
    """Trailing `pad_id` targets contribute exactly what positions excluded through the
    prompt mask contribute, and an excluded trailing position's token can be anything:
    the padded loss equals the loss with the padding replaced by random tokens that
    the masks exclude instead."""
    policy, reference = _model(5), _model(6)
    batch = _random_pairs(5, separate_masks=True)
    padded, _ = _loss(
        DPOObjective(policy, reference, beta=0.5, pad_id=PAD),
        trainable(policy),
        _jnp(batch),
    )
    rng = np.random.default_rng(5)
    replaced = dict(batch)
    for side in ("chosen", "rejected"):
        padding = batch[side] == PAD
        replaced[side] = np.where(padding, rng.integers(1, VOCAB, padding.shape), batch[side])
        replaced[side] = replaced[side].astype(np.int32)
        replaced[f"{side}_prompt_mask"] = batch[f"{side}_prompt_mask"] | padding
    assert not np.array_equal(replaced["chosen"], batch["chosen"])
    unpadded, _ = _loss(
        DPOObjective(policy, reference, beta=0.5), trainable(policy), _jnp(replaced)
    )
    np.testing.assert_allclose(float(padded), float(unpadded), rtol=1e-6)


def test_prompt_positions_are_not_scored():
    """Marking one more leading token as prompt removes exactly its target's log-prob."""
    policy, reference = _model(7), _model(8)
    tokens = np.array([[1, 2, 3, 4, 5, 1]], np.int32)
    objective = DPOObjective(policy, reference, beta=1.0)
    sequence_log_probs = eqx.filter_jit(lambda o, p, b: o.sequence_log_probs(p, b))
    log_probs = {}
    for prompt in (1, 2):
        mask = np.arange(6)[None, :] < prompt
        batch = {"chosen": tokens, "rejected": tokens[:, ::-1].copy(), "prompt_mask": mask}
        log_probs[prompt] = sequence_log_probs(objective, objective.init_params(), _jnp(batch))
    dropped = _numpy_log_probs(policy, tokens)[0, 0]  # log p(tokens[1] | tokens[0])
    for model in (0, 1):  # the policy's and the reference's
        for side in (0, 1):
            assert log_probs[1][model][side, 0] < log_probs[2][model][side, 0]
    np.testing.assert_allclose(
        float(log_probs[1][0][0, 0] - log_probs[2][0][0, 0]), dropped, rtol=1e-5
    )


# Gradients and jit.


def test_jit_and_grad_reach_only_the_policy():
    policy, reference = _model(9), _model(10)
    objective = DPOObjective(policy, reference, beta=0.5, pad_id=PAD)
    params = objective.init_params()
    batch = _jnp(_random_pairs(9))
    value_and_grad = jax.jit(
        jax.value_and_grad(lambda p, b: objective.loss(p, b, jax.random.key(0)), has_aux=True)
    )
    (loss, aux), grads = value_and_grad(params, batch)
    expected, _ = _numpy_dpo(policy, reference, _random_pairs(9), 0.5, PAD)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert set(aux) == {"reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward"}

    assert jax.tree.structure(params) == jax.tree.structure(trainable(policy))
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    leaves = jax.tree.leaves(grads)
    assert len(leaves) == len(jax.tree.leaves(trainable(policy)))
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in leaves)
    assert any(float(jnp.abs(leaf).max()) > 0 for leaf in leaves)


def test_the_reference_gets_no_gradient():
    policy, reference = _model(11), _model(12)
    batch = _jnp(_random_pairs(11))

    @eqx.filter_jit
    @eqx.filter_grad
    def reference_grads(frozen):
        objective = DPOObjective(policy, frozen, beta=0.5, pad_id=PAD)
        return objective.loss(objective.init_params(), batch, jax.random.key(0))[0]

    leaves = jax.tree.leaves(reference_grads(reference))
    assert len(leaves) == len(jax.tree.leaves(trainable(reference)))
    assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in leaves)


# Evaluate and preview.


def test_evaluate_scores_the_policy_on_the_chosen_rows():
    policy, reference = _model(13), _model(14)
    batch = _random_pairs(13)
    objective = DPOObjective(policy, reference, beta=0.5, pad_id=PAD)
    evaluate = eqx.filter_jit(lambda o, p, b: o.evaluate(p, b, jax.random.key(0)))
    scores = evaluate(objective, objective.init_params(), _jnp(batch))
    assert isinstance(scores, TokenScores)
    counted = _numpy_counted(batch["chosen"], batch["prompt_mask"], PAD)
    np.testing.assert_array_equal(np.asarray(scores.weights), counted.astype(np.float32))
    expected_nll = -_numpy_log_probs(policy, batch["chosen"])
    np.testing.assert_allclose(np.asarray(scores.losses), expected_nll, rtol=1e-5, atol=1e-6)
    perplexity = metrics.perplexity()
    value = perplexity.finalize(perplexity.merge(perplexity.init(), perplexity(scores)))
    expected = np.exp(np.sum(expected_nll * counted) / np.sum(counted))
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)


_preview = eqx.filter_jit(
    lambda objective, params, batch, key: objective.preview(params, batch, key)
)


def test_preview_samples_the_live_policy_never_the_reference():
    policy, live = _model(15), _model(16)
    tokens = np.array([[1, 2, 3, 4, 5, 1], [2, 3, 4, 5, 1, 2], [3, 3, 1, 0, 0, 0]], np.int32)
    mask = np.broadcast_to(np.arange(6) < 2, tokens.shape)
    batch = _jnp({"chosen": tokens, "rejected": tokens, "prompt_mask": mask})
    samples = Samples(max_new_tokens=4, num_samples=2)
    params, key = trainable(live), jax.random.key(3)

    previews = [
        _preview(
            DPOObjective(policy, reference, beta=0.5, pad_id=PAD, samples=samples),
            params,
            batch,
            key,
        )
        for reference in (_model(17), live)
    ]
    first = previews[0]
    assert isinstance(first, TokenRows)
    np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(previews[1].tokens))

    expected = _sample(live, batch["chosen"][:2, :2], key, max_new_tokens=4)
    assert first.tokens.shape == (2, 10)
    np.testing.assert_array_equal(np.asarray(first.tokens[:, :6]), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(first.tokens[:, 6:]), PAD)
    generated = (np.arange(10) >= 2) & (np.arange(10) < 6)
    np.testing.assert_array_equal(np.asarray(first.mask), np.broadcast_to(generated, (2, 10)))

    from_objective_policy = _sample(policy, batch["chosen"][:2, :2], key, max_new_tokens=4)
    assert not np.array_equal(np.asarray(expected), np.asarray(from_objective_policy))


def test_preview_continues_each_row_after_its_own_prompt():
    """Greedy previews of rows with prompts of 1, 3 and 9 tokens: each generated token
    is the policy's argmax after the row's prefix, and generation stops after
    max_new_tokens or at max_seq_len (12)."""
    policy = _model(18)
    rng = np.random.default_rng(18)
    tokens = rng.integers(1, VOCAB, (3, 10)).astype(np.int32)
    prompts = np.array([1, 3, 9])
    mask = np.arange(10)[None, :] < prompts[:, None]
    batch = _jnp({"chosen": tokens, "rejected": tokens, "prompt_mask": mask})
    objective = DPOObjective(
        policy, policy, beta=1.0, samples=Samples(temperature=0.0, max_new_tokens=4)
    )
    preview = _preview(objective, objective.init_params(), batch, jax.random.key(0))
    rows = np.asarray(preview.tokens)
    assert rows.shape == (3, 12)
    greedy = np.argmax(np.asarray(_logits(policy, jnp.asarray(rows))), axis=-1)
    for row, prompt in enumerate(prompts):
        end = min(prompt + 4, 12)
        np.testing.assert_array_equal(rows[row, :prompt], tokens[row, :prompt])
        np.testing.assert_array_equal(rows[row, prompt:end], greedy[row, prompt - 1 : end - 1])
        np.testing.assert_array_equal(rows[row, end:], 0)
        generated = (np.arange(12) >= prompt) & (np.arange(12) < end)
        np.testing.assert_array_equal(np.asarray(preview.mask[row]), generated)


# Bad input.


def _good_batch():
    return _jnp(_random_pairs(20, rows=2, length=6))


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda b: b.update(chosen=b["chosen"].at[1, 2].set(VOCAB)), ValueError, "token ID 6"),
        (lambda b: b.update(rejected=b["rejected"].at[0, 1].set(-1)), ValueError, "token ID -1"),
        (lambda b: b.update(chosen=b["chosen"].astype(jnp.float32)), ValueError, "integer"),
        (
            lambda b: b.update(
                rejected=b["rejected"][:, :5],
                chosen_prompt_mask=b["prompt_mask"],
                rejected_prompt_mask=b.pop("prompt_mask")[:, :5],
            ),
            ValueError,
            "one shape",
        ),
        (lambda b: b.update(prompt_mask=b["prompt_mask"][:, :5]), ValueError, "shaped like"),
        (lambda b: b.update(prompt_mask=b["prompt_mask"].astype(jnp.int32)), ValueError, "bool"),
        (lambda b: b.pop("prompt_mask"), KeyError, "prompt mask"),
        (lambda b: b.pop("rejected"), KeyError, "reads batch key 'rejected', but the batch"),
        (
            lambda b: b.update(chosen_prompt_mask=b["prompt_mask"]),
            ValueError,
            "either batch\\['prompt_mask'\\]",
        ),
        (
            lambda b: b.update(prompt_mask=jnp.ones_like(b["prompt_mask"])),
            ValueError,
            "no counted response token",
        ),
    ],
)
def test_bad_batches_raise_before_compute(change, error, match):
    model = _model(21)
    objective = DPOObjective(model, model, beta=0.5, pad_id=PAD)
    batch = _good_batch()
    change(batch)
    with pytest.raises(error, match=match):
        objective.loss(objective.init_params(), batch, jax.random.key(0))


def test_out_of_range_ids_raise_under_jit():
    model = _model(22)
    objective = DPOObjective(model, model, beta=0.5)
    batch = _good_batch()
    batch["chosen"] = batch["chosen"].at[0, 3].set(VOCAB + 3)
    with pytest.raises(Exception, match=r"batch\['chosen'\] holds token IDs outside \[0, 6\)"):
        jax.block_until_ready(_loss(objective, objective.init_params(), batch))


@pytest.mark.parametrize("beta", [0.0, -1.0, math.inf, math.nan])
def test_beta_must_be_positive_and_finite(beta):
    model = _model(23)
    with pytest.raises(ValueError, match="beta must be a finite real > 0"):
        DPOObjective(model, model, beta=beta)


def test_integer_beta_is_rejected_as_a_type_or_a_value():
    model = _model(23)
    with rejects(ValueError, "beta must be a finite real > 0", parameter="beta"):
        DPOObjective(model, model, beta=0)


def test_bad_configuration_raises():
    model = _model(24)
    with pytest.raises(ValueError, match="pad_id must be None or a token ID"):
        DPOObjective(model, model, beta=1.0, pad_id=VOCAB)
    # The shapes of a model suffice: the check reads its vocab_size.
    other = eqx.filter_eval_shape(
        CausalTransformer, VOCAB + 1, 16, 1, 2, 32, 12, key=jax.random.key(0)
    )
    with pytest.raises(ValueError, match="vocab_size 7 for the reference"):
        DPOObjective(model, other, beta=1.0)
    with pytest.raises(ValueError, match=r"Samples\.prompt_len must be None"):
        DPOObjective(model, model, beta=1.0, samples=Samples(prompt_len=2))


# Learning.


def _preference_pairs(rng: np.random.Generator, rows: int):
    """Prompts of two tokens; the chosen response counts up from the prompt's last token
    (cycling through 1..5), the rejected one is random."""
    prompts = rng.integers(1, VOCAB, (rows, 2))
    chosen = np.empty((rows, 4), np.int64)
    previous = prompts[:, -1]
    for t in range(4):
        previous = previous % (VOCAB - 1) + 1
        chosen[:, t] = previous
    rejected = rng.integers(1, VOCAB, (rows, 4))
    mask = np.zeros((rows, 6), bool)
    mask[:, :2] = True
    return _jnp(
        {
            "chosen": np.concatenate([prompts, chosen], 1).astype(np.int32),
            "rejected": np.concatenate([prompts, rejected], 1).astype(np.int32),
            "prompt_mask": mask,
        }
    )


@pytest.mark.slow
def test_training_learns_the_preference():
    model = _model(0, sharpen=1.0)  # the standard head: near-uniform predictions
    objective = DPOObjective(model, model, beta=0.5)
    optimizer = optax.adam(1e-2)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    step = jax.jit(lambda s, b, k: train_step(objective, optimizer, s, b, k), donate_argnums=0)
    rng = np.random.default_rng(0)
    train, held_out = _preference_pairs(rng, 32), _preference_pairs(rng, 32)
    history = []
    for index in range(40):
        state, step_metrics = step(state, train, jax.random.key(index))
        history.append({name: float(value) for name, value in step_metrics.items()})
    assert history[0]["loss"] == pytest.approx(math.log(2.0), abs=1e-6)
    assert history[-1]["loss"] < 0.1
    assert history[-1]["reward_accuracy"] == 1.0
    loss, aux = _loss(objective, state.params, held_out)
    assert float(loss) < 0.2
    assert float(aux["reward_accuracy"]) >= 0.95
    assert float(aux["chosen_reward"]) > 0.0 > float(aux["rejected_reward"])
    # The donated states never owned the objective's arrays.
    assert not any(
        leaf.is_deleted() for leaf in jax.tree.leaves(eqx.filter(objective, eqx.is_array))
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda b: b.update(chosen=b["chosen"].at[1, 2].set(VOCAB)),
            r"batch\['chosen'\] holds token ID 6 at row 1, position 2; valid IDs are 0 to 5",
        ),
        (
            lambda b: b.update(prompt_mask=b["prompt_mask"].at[1].set(True)),
            r"a row of batch\['chosen'\] has no counted response token .*: row 1\.$",
        ),
    ],
)
def test_a_failed_compiled_loss_becomes_the_host_check(change, message):
    model = _model(24)
    objective = DPOObjective(model, model, beta=0.5)
    batch = _good_batch()
    change(batch)
    with pytest.raises(ValueError, match=message), explain_failure(objective, batch):
        jax.block_until_ready(
            jax.jit(objective.loss)(objective.init_params(), batch, jax.random.key(0))
        )
    with pytest.raises(ValueError, match=message):
        objective.check_batch(batch)
    objective.check_batch(
        {"chosen": batch["chosen"], "prompt_mask": batch["prompt_mask"]} | _good_batch()
    )
