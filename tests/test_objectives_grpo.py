"""GRPOObjective: group advantages, the clipped surrogate and k3 KL against float64 NumPy
references (with ratios away from 1), the objective's loss on precomputed and sampled
batches, gradients (none into the reference), evaluate and preview, errors, and short
training runs that raise the reward."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _checks import rejects
from hypothesis import given, settings
from hypothesis import strategies as st

from dew._checks import explain_failure
from dew.artifacts import TokenRows
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import trainable
from dew.objectives.grpo import GRPOObjective, group_advantages, grpo_loss_terms
from dew.objectives.sampling import Samples, sample_continuations
from dew.steps import TrainState, train_step

VOCAB = 6
TARGET = 3
GROUP = 4
NEW = 3


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
def _model(seed: int, *, max_seq_len: int = 8, sharpen: float = 4.0) -> CausalTransformer:
    """A tiny random model with a scaled-up head, built under one jit."""
    return _build(jax.random.key(seed), max_seq_len, jnp.float32(sharpen))


@eqx.filter_jit
def _loss(objective, params, batch, key):
    return objective.loss(params, batch, key)


@eqx.filter_jit
def _rollout(objective, params, batch, key):
    return objective.rollout(params, batch, key)


@eqx.filter_jit
def _logits(model, tokens):
    return jax.vmap(model)(tokens)


_sample = eqx.filter_jit(sample_continuations)


def target_fraction(prompts, completions):
    """The fraction of a completion's tokens equal to TARGET."""
    return jnp.mean(jnp.where(completions == TARGET, 1.0, 0.0), axis=-1)


def echoes_prompt(prompts, completions):
    """How many of a completion's tokens repeat its prompt's first token (an int32 reward)."""
    return jnp.sum(jnp.where(completions == prompts[:, :1, None], 1, 0), axis=-1)


def _prompts(seed: int, rows: int = 3, length: int = 2) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, (rows, length)), jnp.int32)


# NumPy references.


def _numpy_advantages(rewards: np.ndarray) -> np.ndarray:
    rewards = np.asarray(rewards, np.float64)
    mean = rewards.mean(axis=1, keepdims=True)
    std = rewards.std(axis=1, keepdims=True)  # population std, ddof=0
    return (rewards - mean) / (std + 1e-6)


def _numpy_terms(log_probs, old, ref, advantages, epsilon, beta):
    log_probs, old, ref = (np.asarray(x, np.float64) for x in (log_probs, old, ref))
    a = np.asarray(advantages, np.float64)[:, :, None]
    ratio = np.exp(log_probs - old)
    surrogate = np.minimum(ratio * a, np.clip(ratio, 1 - epsilon, 1 + epsilon) * a)
    kl = np.exp(ref - log_probs) - (ref - log_probs) - 1
    clipped = ((ratio < 1 - epsilon) & (a < 0)) | ((ratio > 1 + epsilon) & (a > 0))
    return -np.mean(surrogate - beta * kl), surrogate, kl, clipped


def _numpy_completion_log_probs(model, prompts, completions, temperature):
    """log p(completion token | prefix) from the model's logits / temperature, in float64."""
    prompts, completions = np.asarray(prompts), np.asarray(completions)
    rows, group, new = completions.shape
    sequences = np.concatenate(
        [np.repeat(prompts, group, axis=0), completions.reshape(rows * group, new)], axis=1
    )
    logits = np.asarray(_logits(model, jnp.asarray(sequences[:, :-1])), np.float64) / temperature
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(log_softmax, sequences[:, 1:, None].astype(np.int64), -1)[..., 0]
    return picked[:, prompts.shape[1] - 1 :].reshape(rows, group, new)


# The pure pieces.


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_advantages_match_numpy(seed):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, (5, 6)).astype(np.float32)
    rewards[0] = 1.0  # a group of equal rewards has no advantage
    rewards[1, :3] *= 100.0
    advantages = np.asarray(group_advantages(jnp.asarray(rewards)))
    np.testing.assert_allclose(advantages, _numpy_advantages(rewards), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(advantages[0], 0.0)
    np.testing.assert_allclose(advantages.mean(axis=1), 0.0, atol=1e-5)


_MAGNITUDES = st.floats(min_value=-6.0, max_value=6.0).map(lambda exponent: 10.0**exponent)


# A few group sizes (each new shape compiles the eager ops again): one, two, an odd one, the
# reported 16, and 64; the magnitudes carry the variety.
@given(
    size=st.sampled_from([1, 2, 3, 16, 64]),
    magnitude=_MAGNITUDES,
    sign=st.sampled_from([-1.0, 1.0]),
    rows=st.integers(1, 3),
)
@settings(max_examples=80)
def test_a_group_of_equal_rewards_gets_exactly_zero_advantages(size, magnitude, sign, rows):
    # A float32 mean of equal values can be an ulp off (0.1 in a group of 3, 37.3 in a
    # group of 16), and dividing by std + 1e-6 would blow that up into a push.
    rewards = np.full((rows, size), sign * magnitude, np.float32)
    advantages = np.asarray(group_advantages(jnp.asarray(rewards)))
    assert advantages.dtype == np.float32
    np.testing.assert_array_equal(advantages, 0.0)


@pytest.mark.parametrize(("reward", "size"), [(0.1, 3), (37.3, 16)])
def test_the_reported_constant_groups_get_zero_advantages(reward, size):
    rewards = jnp.full((1, size), reward, jnp.float32)
    assert float(jnp.mean(rewards)) != float(rewards[0, 0])  # the ulp is real
    np.testing.assert_array_equal(np.asarray(group_advantages(rewards)), 0.0)


@st.composite
def _groups(draw):
    """Groups of float32 rewards: spread widely, or a few ulps around one value."""
    size = draw(st.integers(2, 64))
    if draw(st.booleans()):
        values = st.floats(-1e6, 1e6, width=32)
        return np.array(draw(st.lists(values, min_size=size, max_size=size)), np.float32)
    base = np.float32(draw(st.sampled_from([-1.0, 1.0])) * draw(_MAGNITUDES))
    ulps = draw(st.lists(st.integers(-3, 3), min_size=size, max_size=size))
    return (base + np.array(ulps, np.float32) * np.spacing(base)).astype(np.float32)


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
@given(group=_groups())
@settings(max_examples=80)
def test_group_advantages_match_a_float64_reference(group):
    advantages = np.asarray(group_advantages(jnp.asarray(group[None])))
    np.testing.assert_allclose(advantages, _numpy_advantages(group[None]), rtol=1e-5, atol=1e-5)


def test_group_advantages_ignore_a_groups_offset_and_scale():
    rewards = np.random.default_rng(3).normal(size=(4, 8)).astype(np.float32)
    offset = np.arange(4, dtype=np.float32)[:, None] * 10.0
    base = np.asarray(group_advantages(jnp.asarray(rewards)))
    moved = np.asarray(group_advantages(jnp.asarray(3.0 * rewards + offset)))
    np.testing.assert_allclose(moved, base, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("epsilon", "beta"), [(0.2, 0.04), (0.1, 0.5), (0.3, 0.0)])
def test_grpo_loss_terms_match_numpy_with_ratios_away_from_one(epsilon, beta):
    rng = np.random.default_rng(int(epsilon * 100))
    shape = (4, 6, 8)
    log_probs = rng.uniform(-3.0, -0.1, shape)
    old = log_probs + rng.uniform(-0.9, 0.9, shape)  # ratios between 0.4 and 2.5
    ref = log_probs + rng.normal(0.0, 0.5, shape)
    advantages = rng.normal(size=shape[:2])
    terms = grpo_loss_terms(
        *(jnp.asarray(x, jnp.float32) for x in (log_probs, old, ref, advantages)), epsilon, beta
    )
    loss, surrogate, kl, clipped = _numpy_terms(log_probs, old, ref, advantages, epsilon, beta)
    np.testing.assert_allclose(float(terms.loss), loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(terms.surrogate), surrogate, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(terms.kl), kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(terms.clipped), clipped)
    ratio = np.exp(log_probs - old)
    assert clipped.any() and (~clipped).any()
    assert ((ratio < 1 - epsilon) & clipped).any() and ((ratio > 1 + epsilon) & clipped).any()
    assert (np.asarray(terms.kl) >= 0).all()


def test_grpo_loss_terms_gradient_matches_the_analytic_one():
    """d loss / d logp = -(1/n) [unclipped * ratio * A - beta * (1 - exp(ref - logp))]:
    clipped tokens pass no surrogate gradient; old and reference log-probs pass none."""
    rng = np.random.default_rng(4)
    shape = (2, 3, 4)
    log_probs = rng.uniform(-3.0, -0.1, shape)
    old = log_probs + rng.uniform(-0.6, 0.6, shape)
    ref = log_probs + rng.normal(0.0, 0.5, shape)
    advantages = rng.normal(size=shape[:2])
    epsilon, beta = 0.2, 0.1
    args = [jnp.asarray(x, jnp.float32) for x in (log_probs, old, ref, advantages)]
    grads = jax.grad(
        lambda lp, o, r, a: grpo_loss_terms(lp, o, r, a, epsilon, beta).loss, argnums=(0, 1, 2, 3)
    )(*args)
    _, _, _, clipped = _numpy_terms(log_probs, old, ref, advantages, epsilon, beta)
    ratio = np.exp(log_probs - old)
    surrogate_grad = np.where(clipped, 0.0, ratio * advantages[:, :, None])
    kl_grad = 1.0 - np.exp(ref - log_probs)
    expected = -(surrogate_grad - beta * kl_grad) / log_probs.size
    np.testing.assert_allclose(np.asarray(grads[0]), expected, rtol=1e-4, atol=1e-7)
    for constant in grads[1:]:
        np.testing.assert_array_equal(np.asarray(constant), 0.0)


# The objective.


@pytest.mark.parametrize(
    ("reward_fn", "given_rewards", "temperature"),
    [(target_fraction, True, 1.0), (echoes_prompt, False, 0.7)],
)
def test_loss_on_a_precomputed_batch_matches_numpy(reward_fn, given_rewards, temperature):
    kl_beta = 0.04 if temperature == 1.0 else 0.5
    policy, reference, sampler = _model(0), _model(1), _model(2)
    prompts = _prompts(0)
    rng = np.random.default_rng(0)
    completions = rng.integers(0, VOCAB, (3, GROUP, NEW))
    # Old log-probs of another model: ratios away from 1, so both clip branches act.
    old = _numpy_completion_log_probs(sampler, prompts, completions, temperature)
    rewards = rng.uniform(0.0, 1.0, (3, GROUP))
    batch = {
        "prompts": prompts,
        "completions": jnp.asarray(completions, jnp.int32),
        "old_log_probs": jnp.asarray(old, jnp.float32),
    }
    if given_rewards:
        batch["rewards"] = jnp.asarray(rewards, jnp.float32)
    else:
        rewards = np.sum(completions == np.asarray(prompts)[:, :1, None], axis=-1)
    objective = GRPOObjective(
        policy, reference, reward_fn, GROUP, NEW, kl_beta=kl_beta, temperature=temperature
    )
    loss, aux = _loss(objective, objective.init_params(), batch, jax.random.key(0))

    log_probs = _numpy_completion_log_probs(policy, prompts, completions, temperature)
    ref = _numpy_completion_log_probs(reference, prompts, completions, temperature)
    expected, _, kl, clipped = _numpy_terms(
        log_probs, old, ref, _numpy_advantages(rewards), 0.2, kl_beta
    )
    assert 0.0 < clipped.mean() < 1.0
    np.testing.assert_allclose(float(loss), expected, rtol=1e-4, atol=1e-6)
    expected_aux = {
        "reward_mean": np.mean(rewards),
        "reward_std": np.mean(np.std(rewards, axis=1)),
        "kl": np.mean(kl),
        "clip_fraction": np.mean(clipped),
    }
    assert sorted(aux) == sorted(expected_aux)
    for name, value in expected_aux.items():
        np.testing.assert_allclose(float(aux[name]), value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_sampled_step_is_an_on_policy_step_on_its_rollout():
    """`loss` on prompts samples what `rollout` samples with the same key: completions
    of the policy at the live params, scored by reward_fn. On them the ratio is 1, no
    token is clipped, and the loss reduces to kl_beta * mean(k3)."""
    policy, reference, live = _model(3), _model(4), _model(5)
    objective = GRPOObjective(policy, reference, target_fraction, GROUP, NEW)
    params, batch, key = trainable(live), {"prompts": _prompts(1)}, jax.random.key(7)
    rollout = _rollout(objective, params, batch, key)

    repeated = jnp.repeat(batch["prompts"], GROUP, axis=0)
    sampled = _sample(live, repeated, key, max_new_tokens=NEW)[:, 2:].reshape(3, GROUP, NEW)
    np.testing.assert_array_equal(np.asarray(rollout["completions"]), np.asarray(sampled))
    np.testing.assert_array_equal(
        np.asarray(rollout["rewards"]), np.asarray(target_fraction(batch["prompts"], sampled))
    )
    np.testing.assert_allclose(
        np.asarray(rollout["old_log_probs"]),
        _numpy_completion_log_probs(live, batch["prompts"], sampled, 1.0),
        rtol=1e-5,
        atol=1e-5,
    )

    loss, aux = _loss(objective, params, batch, key)
    on_rollout, rollout_aux = _loss(objective, params, rollout, jax.random.key(99))
    np.testing.assert_allclose(float(loss), float(on_rollout), rtol=1e-5, atol=1e-7)
    for name in aux:
        np.testing.assert_allclose(float(aux[name]), float(rollout_aux[name]), rtol=1e-5)
    assert float(aux["clip_fraction"]) == 0.0
    assert float(aux["kl"]) > 0.0
    np.testing.assert_allclose(float(loss), 0.04 * float(aux["kl"]), rtol=1e-4)


@pytest.mark.parametrize("precomputed", [False, True])
def test_jit_and_grad_reach_only_the_policy(precomputed):
    policy, reference = _model(6), _model(7)
    objective = GRPOObjective(policy, reference, target_fraction, GROUP, NEW)
    params, key = objective.init_params(), jax.random.key(1)
    batch = {"prompts": _prompts(2)}
    if precomputed:
        batch = _rollout(objective, params, batch, key)
        batch["old_log_probs"] = batch["old_log_probs"] + 0.3  # ratios of 0.74: some clip
    value_and_grad = jax.jit(
        jax.value_and_grad(lambda p, b, k: objective.loss(p, b, k), has_aux=True)
    )
    (loss, aux), grads = value_and_grad(params, batch, key)
    expected, _ = _loss(objective, params, batch, key)
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5, atol=1e-7)
    assert set(aux) == {"reward_mean", "reward_std", "kl", "clip_fraction"}
    assert jax.tree.structure(grads) == jax.tree.structure(trainable(policy))
    leaves = jax.tree.leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in leaves)
    assert any(float(jnp.abs(leaf).max()) > 0 for leaf in leaves)


def test_the_reference_gets_no_gradient():
    policy, reference = _model(8), _model(9)
    batch = {"prompts": _prompts(3)}

    @eqx.filter_jit
    @eqx.filter_grad
    def reference_grads(frozen):
        objective = GRPOObjective(policy, frozen, target_fraction, GROUP, NEW, kl_beta=1.0)
        return objective.loss(objective.init_params(), batch, jax.random.key(0))[0]

    leaves = jax.tree.leaves(reference_grads(reference))
    assert len(leaves) == len(jax.tree.leaves(trainable(reference)))
    assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in leaves)


def test_evaluate_and_preview_sample_the_live_policy_never_the_reference():
    policy, live = _model(10), _model(11)
    prompts = _prompts(4, rows=4)
    params, key = trainable(live), jax.random.key(5)
    samples = Samples(max_new_tokens=4, num_samples=2, top_k=3)
    evaluate = eqx.filter_jit(lambda o, p, b, k: o.evaluate(p, b, k))
    preview = eqx.filter_jit(lambda o, p, b, k: o.preview(p, b, k))

    results = []
    for reference in (_model(12), live):
        objective = GRPOObjective(
            policy, reference, target_fraction, GROUP, NEW, temperature=0.8, samples=samples
        )
        results.append(
            (
                evaluate(objective, params, {"prompts": prompts}, key),
                preview(objective, params, {"prompts": prompts}, key),
            )
        )
    (scored, shown), (scored_again, shown_again) = results
    assert isinstance(scored, TokenRows) and isinstance(shown, TokenRows)
    np.testing.assert_array_equal(np.asarray(scored.tokens), np.asarray(scored_again.tokens))
    np.testing.assert_array_equal(np.asarray(shown.tokens), np.asarray(shown_again.tokens))

    expected = _sample(live, prompts, key, max_new_tokens=NEW, temperature=0.8)
    np.testing.assert_array_equal(np.asarray(scored.tokens), np.asarray(expected))
    np.testing.assert_array_equal(
        np.asarray(scored.mask), np.broadcast_to(np.arange(5) >= 2, (4, 5))
    )
    expected = _sample(live, prompts[:2], key, max_new_tokens=4, temperature=1.0, top_k=3)
    np.testing.assert_array_equal(np.asarray(shown.tokens), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(shown.mask), np.arange(6)[None, :].repeat(2, 0) >= 2)
    from_objective_policy = _sample(policy, prompts, key, max_new_tokens=NEW, temperature=0.8)
    assert not np.array_equal(np.asarray(scored.tokens), np.asarray(from_objective_policy))


def test_a_preview_stops_at_max_seq_len():
    """The default Samples asks for 8 new tokens; 2-token prompts leave room for 6."""
    model = _model(10)
    objective = GRPOObjective(model, model, target_fraction, GROUP, NEW)
    prompts, key = _prompts(4, rows=4), jax.random.key(5)
    shown = eqx.filter_jit(lambda o, p, b, k: o.preview(p, b, k))(
        objective, objective.init_params(), {"prompts": prompts}, key
    )
    expected = _sample(model, prompts, key, max_new_tokens=6)
    np.testing.assert_array_equal(np.asarray(shown.tokens), np.asarray(expected))


# Bad input.


def _objective(**changes):
    model = _model(13)
    settings = {"group_size": GROUP, "max_new_tokens": NEW, **changes}
    return GRPOObjective(model, model, target_fraction, **settings)


def _precomputed_batch():
    rng = np.random.default_rng(5)
    return {
        "prompts": _prompts(5, rows=2),
        "completions": jnp.asarray(rng.integers(0, VOCAB, (2, GROUP, NEW)), jnp.int32),
        "old_log_probs": jnp.asarray(rng.uniform(-2.0, -0.5, (2, GROUP, NEW)), jnp.float32),
        "rewards": jnp.asarray(rng.uniform(size=(2, GROUP)), jnp.float32),
    }


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda b: b.update(prompts=b["prompts"].at[1, 0].set(VOCAB)), ValueError, "token ID 6"),
        (lambda b: b.update(prompts=b["prompts"].astype(jnp.float32)), ValueError, "integer"),
        (lambda b: b.update(prompts=b["prompts"][0]), ValueError, r"\(rows, length\)"),
        (lambda b: b.update(prompts=jnp.zeros((2, 6), jnp.int32)), ValueError, "max_seq_len 8"),
        (lambda b: b.pop("prompts"), KeyError, "reads batch key 'prompts', but the batch"),
        (lambda b: b.pop("old_log_probs"), KeyError, "both"),
        (lambda b: b.pop("completions"), KeyError, "both"),
        (
            lambda b: b.update(completions=b["completions"][:, :3]),
            ValueError,
            r"\(rows, group_size, new\) = \(2, 4, new\)",
        ),
        (
            lambda b: b.update(completions=b["completions"].at[1, 2, 0].set(-2)),
            ValueError,
            "ID -2 at row 1, group member 2, position 0",
        ),
        (
            lambda b: b.update(completions=b["completions"].astype(jnp.float32)),
            ValueError,
            "integer token IDs",
        ),
        (
            lambda b: b.update(old_log_probs=b["old_log_probs"][..., :2]),
            ValueError,
            "old_log_probs'\\] shaped like",
        ),
        (
            lambda b: b.update(old_log_probs=b["completions"]),
            ValueError,
            "floating log-probabilities",
        ),
        (lambda b: b.update(rewards=b["rewards"][:, :3]), ValueError, r"\(2, 4\)"),
    ],
)
def test_bad_batches_raise_before_compute(change, error, match):
    objective = _objective()
    batch = _precomputed_batch()
    change(batch)
    with pytest.raises(error, match=match):
        objective.loss(objective.init_params(), batch, jax.random.key(0))


def test_a_reward_fn_of_the_wrong_shape_raises():
    model = _model(13)
    objective = GRPOObjective(
        model, model, lambda prompts, completions: jnp.mean(completions, axis=(1, 2)), GROUP, NEW
    )
    with pytest.raises(ValueError, match=r"reward_fn returned rewards shaped \(2,\)"):
        objective.loss(objective.init_params(), {"prompts": _prompts(6, rows=2)}, jax.random.key(0))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"group_size": 1}, "group_size must be an integer >= 2, got 1"),
        ({"group_size": 0}, "group_size must be an integer >= 2, got 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ({"max_new_tokens": 8}, "leaves no room for a prompt"),
        ({"samples": Samples(prompt_len=2)}, r"Samples\.prompt_len must be None"),
        ({"clip_epsilon": 0.0}, "clip_epsilon must be a finite real > 0"),
        ({"kl_beta": -0.1}, "kl_beta must be a finite real >= 0"),
        ({"temperature": 0.0}, "temperature must be a finite real > 0"),
    ],
)
def test_bad_configuration_raises(changes, match):
    with pytest.raises(ValueError, match=match):
        _objective(**changes)


def test_a_fractional_group_size_is_rejected_as_a_type_or_a_value():
    with rejects(ValueError, "group_size must be an integer", parameter="group_size"):
        _objective(group_size=2.5)


def test_a_reference_of_another_vocabulary_is_refused():
    # The shapes of a model suffice: the check reads its vocab_size.
    other = eqx.filter_eval_shape(
        CausalTransformer, VOCAB + 1, 16, 1, 2, 32, 8, key=jax.random.key(0)
    )
    with pytest.raises(ValueError, match="vocab_size 7 for the reference"):
        GRPOObjective(_model(13), other, target_fraction, GROUP, NEW)


# Learning.


@pytest.mark.slow
def test_training_raises_the_reward():
    """Reward: the fraction of completion tokens equal to TARGET (1/6 at random)."""
    model = _model(0, sharpen=1.0)  # the standard head: near-uniform first samples
    objective = GRPOObjective(model, model, target_fraction, group_size=8, max_new_tokens=4)
    optimizer = optax.adam(1e-2)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    step = jax.jit(lambda s, b, k: train_step(objective, optimizer, s, b, k), donate_argnums=0)
    batch = {"prompts": _prompts(7, rows=8)}
    rewards = []
    for index in range(40):
        state, step_metrics = step(state, batch, jax.random.key(index))
        rewards.append(float(step_metrics["reward_mean"]))
    assert np.mean(rewards[:3]) < 0.35
    assert np.mean(rewards[-5:]) > 0.6
    held_out = {"prompts": _prompts(8, rows=64)}
    rows = objective.evaluate(state.params, held_out, jax.random.key(1000))
    assert float(jnp.mean(target_fraction(None, rows.tokens[:, 2:]))) > 0.6
    assert not any(
        leaf.is_deleted() for leaf in jax.tree.leaves(eqx.filter(objective, eqx.is_array))
    )


@pytest.mark.slow
def test_several_clipped_updates_on_one_rollout():
    """Steps on one rollout move the policy away from the sampling policy: the ratio
    leaves 1, tokens start to clip, and the steps still raise the rollout's objective."""
    model = _model(0, sharpen=1.0)  # the standard head: near-uniform first samples
    objective = GRPOObjective(
        model, model, target_fraction, group_size=8, max_new_tokens=4, clip_epsilon=0.1
    )
    optimizer = optax.adam(3e-2)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    batch = _rollout(objective, state.params, {"prompts": _prompts(9, rows=8)}, jax.random.key(0))
    step = jax.jit(lambda s, b, k: train_step(objective, optimizer, s, b, k))
    history = []
    for index in range(6):
        state, step_metrics = step(state, batch, jax.random.key(index))
        history.append({name: float(value) for name, value in step_metrics.items()})
    assert history[0]["clip_fraction"] == 0.0
    assert max(entry["clip_fraction"] for entry in history[1:]) > 0.0
    assert history[-1]["loss"] < history[0]["loss"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda b: b.update(prompts=b["prompts"].at[1, 0].set(VOCAB)),
            r"batch\['prompts'\] holds token ID 6 at row 1, position 0; valid IDs are 0 to 5",
        ),
        (
            lambda b: b.update(completions=b["completions"].at[1, 2, 0].set(-2)),
            r"batch\['completions'\] holds token ID -2 at row 1, group member 2, position 0",
        ),
    ],
)
def test_a_failed_compiled_loss_becomes_the_host_check(change, message):
    objective = _objective()
    batch = _precomputed_batch()
    change(batch)
    with pytest.raises(ValueError, match=message), explain_failure(objective, batch):
        jax.block_until_ready(_loss(objective, objective.init_params(), batch, jax.random.key(0)))
    with pytest.raises(ValueError, match=message):
        objective.check_batch(batch)
    objective.check_batch(_precomputed_batch())
    objective.check_batch({"prompts": _precomputed_batch()["prompts"]})
