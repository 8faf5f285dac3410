"""dew.objectives.sampling: `generate` with the key/value cache against decoding by full
recomputation, its sampling filters against a NumPy reference, ragged prompts, stop
tokens, keys and bad input."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dew._checks import failed_check
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import Generation, generate
from dew.objectives.sampling import filter_logits, sample_continuations

VOCAB = 7
MAX_SEQ = 12
# Most tests share these prompts and settings, so generate compiles once for all of them.
PROMPTS = [[3, 1, 4], [1], [5, 2, 6, 5, 3]]
STEPS = 4


def _model(seed: int = 0, *, layers: int = 1, sharpen: float = 6.0) -> CausalTransformer:
    """A small model whose sharpened head gives each position a clear argmax."""
    model = CausalTransformer(
        vocab_size=VOCAB,
        emb_features=16,
        num_layers=layers,
        num_heads=2,
        mlp_features=24,
        max_seq_len=MAX_SEQ,
        key=jax.random.key(seed),
    )
    return eqx.tree_at(lambda m: m.stack.head.weight, model, model.stack.head.weight * sharpen)


@eqx.filter_jit
def _full_logits(model, buffer):
    return jax.vmap(model)(buffer)


def _greedy_by_recomputation(model, prompts, steps):
    """Greedy decoding without a cache: the whole sequence through the model for every new
    token (in a buffer of `MAX_SEQ` positions; the causal mask hides what is not written)."""
    rows = []
    for prompt in prompts:
        buffer = np.zeros(MAX_SEQ, np.int32)
        buffer[: len(prompt)] = prompt
        for position in range(len(prompt), len(prompt) + steps):
            logits = _full_logits(model, jnp.asarray(buffer)[None])[0]
            buffer[position] = int(np.argmax(np.asarray(logits[position - 1])))
        rows.append(buffer[len(prompt) : len(prompt) + steps])
    return np.stack(rows)


def _filtered_reference(logits, temperature, top_k, top_p):
    """The distribution `filter_logits` defines, in float64 NumPy: temperature, then the
    `top_k` largest (ties with the k-th kept), then the smallest most likely set whose
    probability reaches `top_p` (ties with its last member kept). Also returns how far the
    cumulative probabilities the nucleus compares with `top_p` lie from it: float32
    rounding decides a comparison closer than about 1e-6."""
    z = np.asarray(logits, np.float64) / temperature
    keep = np.ones(z.shape, bool)
    margin = np.inf
    if top_k is not None and top_k < z.size:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    if top_p is not None and top_p < 1:
        ordered = np.sort(np.where(keep, z, -np.inf))[::-1]
        probabilities = np.exp(ordered - ordered[0])
        probabilities /= probabilities.sum()
        before = np.concatenate([[0.0], np.cumsum(probabilities)[:-1]])
        margin = np.min(np.abs(before - top_p))
        keep &= z >= ordered[np.sum(before < top_p) - 1]
    weights = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    return weights / weights.sum(), margin


# Greedy decoding with the cache is greedy decoding by recomputation.
def test_greedy_generation_is_greedy_decoding_by_full_recomputation():
    model = _model(0)
    out = generate(model, PROMPTS, max_new_tokens=STEPS, key=jax.random.key(0), temperature=0.0)
    assert isinstance(out, Generation)
    assert out.tokens.shape == (3, STEPS) and out.tokens.dtype == jnp.int32
    np.testing.assert_array_equal(out.lengths, [STEPS] * 3)
    expected = _greedy_by_recomputation(model, PROMPTS, STEPS)
    assert len(np.unique(expected)) > 2  # the rows do not just repeat one token
    np.testing.assert_array_equal(out.tokens, expected)


@pytest.mark.slow  # about 20 s: compilations per model structure and new-token count
@settings(max_examples=10)
@given(
    st.sampled_from([1, 2]),  # layers
    st.sampled_from([3, 7]),  # new tokens
    st.lists(st.integers(1, 5), min_size=1, max_size=3),  # prompt lengths
    st.integers(0, 2**16),
)
def test_greedy_generation_is_greedy_decoding_by_full_recomputation_for_any_sizes(
    layers, steps, lengths, seed
):
    model = _model(layers, layers=layers)
    rng = np.random.default_rng(seed)
    prompts = np.full((len(lengths), 5), -1, np.int32)  # -1: padding generate never reads
    for row, length in enumerate(lengths):
        prompts[row, :length] = rng.integers(0, VOCAB, length)
    out = generate(
        model,
        prompts,
        prompt_lengths=np.array(lengths, np.int32),
        max_new_tokens=steps,
        key=jax.random.key(seed),
        temperature=0.0,
    )
    rows = [prompts[row, :length] for row, length in enumerate(lengths)]
    np.testing.assert_array_equal(out.tokens, _greedy_by_recomputation(model, rows, steps))


# The sampling filters against NumPy.
@settings(max_examples=40)
@given(
    st.sampled_from([2, 5, 9]).flatmap(
        lambda vocab: st.lists(st.integers(-8, 8), min_size=vocab, max_size=vocab)
    ),
    st.sampled_from([0.5, 1.0, 2.0]),
    st.one_of(st.none(), st.integers(1, 10)),
    st.one_of(st.none(), st.floats(0.05, 1.0)),
)
def test_filter_logits_keeps_the_distribution_a_numpy_reference_keeps(
    halves, temperature, top_k, top_p
):
    """Logits on a grid of halves (exact ties, exact division by these temperatures)."""
    logits = np.asarray(halves, np.float32) / 2
    expected, margin = _filtered_reference(logits, temperature, top_k, top_p)
    assume(margin > 1e-5)
    filtered = filter_logits(
        jnp.asarray(logits)[None], temperature=temperature, top_k=top_k, top_p=top_p
    )[0]
    np.testing.assert_array_equal(np.isfinite(filtered), expected > 0)
    np.testing.assert_allclose(jax.nn.softmax(filtered), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [
        (1.0, 4, 0.8),
        pytest.param(1.0, None, None, marks=pytest.mark.slow),  # about 5 s each
        pytest.param(0.7, 3, None, marks=pytest.mark.slow),
        pytest.param(1.3, None, 0.6, marks=pytest.mark.slow),
    ],
)
def test_sampled_first_tokens_follow_the_filtered_distribution(temperature, top_k, top_p):
    """3000 rows of one prompt, one token each: the frequencies against the NumPy
    reference's distribution over the model's logits (a chi-square test), and never a
    token the filters removed."""
    from scipy import stats  # here, not at collection

    model = _model(2, sharpen=1.5)
    prompt = np.array([2, 5, 1], np.int32)
    rows = 3000
    out = generate(
        model,
        np.tile(prompt, (rows, 1)),
        max_new_tokens=1,
        key=jax.random.key(7),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    logits = np.asarray(model(jnp.asarray(prompt))[-1])
    expected, margin = _filtered_reference(logits, temperature, top_k, top_p)
    assert margin > 1e-3
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=VOCAB)
    assert counts[expected == 0].sum() == 0
    kept = expected > 0
    assert kept.sum() >= 2
    test = stats.chisquare(counts[kept], rows * expected[kept])
    assert test.pvalue > 1e-3, (counts, rows * expected)


@pytest.mark.slow  # about 5 s
def test_top_k_one_and_a_tiny_top_p_decode_greedily():
    model = _model(3)
    greedy = generate(model, PROMPTS, max_new_tokens=STEPS, key=jax.random.key(0), temperature=0)
    for filters in ({"top_k": 1}, {"top_p": 1e-6}):
        sampled = generate(model, PROMPTS, max_new_tokens=STEPS, key=jax.random.key(4), **filters)
        np.testing.assert_array_equal(sampled.tokens, greedy.tokens)


# Ragged prompts, keys and rows.
@pytest.mark.slow  # about 15 s: a compilation per prompt length
def test_a_batch_of_ragged_prompts_is_each_prompt_alone():
    """Greedy and sampled: a row's tokens depend on its prompt and its key alone. With one
    key, row i draws from `split(key, rows)[i]`; with one key per row, from its own."""
    model = _model(4, sharpen=2.0)
    key = jax.random.key(11)
    together = generate(model, PROMPTS, key=key, max_new_tokens=STEPS)
    by_row = generate(model, PROMPTS, key=jax.random.split(key, 3), max_new_tokens=STEPS)
    np.testing.assert_array_equal(together.tokens, by_row.tokens)
    greedy = generate(model, PROMPTS, key=key, max_new_tokens=STEPS, temperature=0.0)
    for row, prompt in enumerate(PROMPTS):
        keys = jax.random.split(key, 3)[row : row + 1]
        alone = generate(model, [prompt], key=keys, max_new_tokens=STEPS)
        np.testing.assert_array_equal(alone.tokens[0], together.tokens[row])
        alone = generate(model, [prompt], key=keys, max_new_tokens=STEPS, temperature=0.0)
        np.testing.assert_array_equal(alone.tokens[0], greedy.tokens[row])


@pytest.mark.slow  # about 5 s
def test_more_rows_or_more_tokens_extend_the_same_draws():
    """`split(key, n)[i]` does not depend on `n`: the first rows of a larger batch and the
    first tokens of a longer generation are what the smaller call draws."""
    model = _model(5, sharpen=2.0)
    prompts = np.array([[1, 2, 3], [4, 5, 6], [0, 1, 0]], np.int32)
    key = jax.random.key(3)
    longer = generate(model, prompts, max_new_tokens=6, key=key)
    np.testing.assert_array_equal(
        generate(model, prompts[:2], max_new_tokens=3, key=key).tokens, longer.tokens[:2, :3]
    )


def test_sample_continuations_returns_the_prompts_and_what_generate_draws():
    model = _model(6, sharpen=2.0)
    prompts = jnp.array([[1, 2, 3, 4, 5], [4, 5, 6, 0, 1], [2, 2, 2, 2, 2]], jnp.int32)
    key = jax.random.key(8)
    rows = sample_continuations(model, prompts, key, max_new_tokens=STEPS)
    generated = generate(model, prompts, max_new_tokens=STEPS, key=key)
    np.testing.assert_array_equal(rows, jnp.concatenate([prompts, generated.tokens], axis=1))


def test_generate_runs_inside_jit_with_the_model_as_an_argument():
    model = _model(7, sharpen=2.0)
    prompts = jnp.array([[1, 2, 3, 0, 0], [4, 0, 0, 0, 0], [1, 2, 3, 4, 5]], jnp.int32)
    lengths = jnp.array([3, 1, 5], jnp.int32)
    key = jax.random.key(9)

    @jax.jit
    def sample(model, prompts, lengths, key):
        return generate(model, prompts, prompt_lengths=lengths, max_new_tokens=STEPS, key=key)

    inside = sample(model, prompts, lengths, key)
    outside = generate(model, prompts, prompt_lengths=lengths, max_new_tokens=STEPS, key=key)
    np.testing.assert_array_equal(inside.tokens, outside.tokens)
    np.testing.assert_array_equal(inside.lengths, outside.lengths)


# Stop tokens.
def test_a_row_stops_at_its_stop_token_and_pads_with_it():
    """Generating with `eos_id` is generating without it, cut after the first `eos_id` of
    each row and padded with it; a row that never emits it runs to `max_new_tokens`."""
    model = _model(8, sharpen=2.0)
    key = jax.random.key(2)
    free = np.asarray(generate(model, PROMPTS, max_new_tokens=STEPS, key=key).tokens)
    eos = int(free[0, 1])
    stopped = generate(model, PROMPTS, max_new_tokens=STEPS, key=key, eos_id=eos)
    lengths = []
    for row in range(3):
        hits = np.flatnonzero(free[row] == eos)
        length = hits[0] + 1 if hits.size else STEPS
        lengths.append(length)
        assert int(stopped.lengths[row]) == length
        np.testing.assert_array_equal(stopped.tokens[row, :length], free[row, :length])
        np.testing.assert_array_equal(stopped.tokens[row, length:], eos)
        np.testing.assert_array_equal(stopped.mask[row], np.arange(STEPS) < length)
    assert min(lengths) <= 2 and max(lengths) == STEPS, (free, eos)  # one stops, one does not


# Bad input.
def test_a_prompt_plus_new_tokens_beyond_max_seq_len_raises_naming_both():
    model = _model()
    with pytest.raises(
        ValueError,
        match=r"prompts of 5 tokens plus max_new_tokens=8 need 13 positions, more than the "
        r"model's max_seq_len 12 \(its learned positions end there\); .* at most 7 new tokens",
    ):
        generate(model, [[1, 2, 3, 4, 5], [1]], max_new_tokens=8, key=jax.random.key(0))


@pytest.mark.parametrize(
    ("prompts", "kwargs", "parameter", "message"),
    [
        ([[1, 9]], {}, "prompts", r"prompts holds token ID 9 at row 0, position 1; valid IDs"),
        ([[1], []], {}, "prompts", r"prompt 1 is empty"),
        ([1, 2, 3], {}, "prompts", r"prompt 0 is 1 \(one prompt is \[prompt\]\)"),
        ([], {}, "prompts", r"prompts must be a list of prompts"),
        ([[1.5, 2.0]], {}, "prompts", r"prompt 0 must hold integer token IDs"),
        (np.ones((2, 3), np.float32), {}, "prompts", r"must hold integer token IDs, got dtype"),
        (
            np.ones((2, 3), np.int32),
            {"prompt_lengths": np.array([3, 0])},
            "prompt_lengths",
            r"prompt_lengths must lie between 1 and the prompts' width 3, got 0 in row 1",
        ),
        (
            np.ones((2, 3), np.int32),
            {"prompt_lengths": np.array([3])},
            "prompt_lengths",
            r"prompt_lengths must be an integer array shaped \(2,\)",
        ),
        ([[1]], {"prompt_lengths": np.array([1])}, "prompt_lengths", r"goes with a \(rows"),
        ([[1]], {"max_new_tokens": 0}, "max_new_tokens", r"max_new_tokens must be an integer >="),
        ([[1]], {"temperature": -1.0}, "temperature", r"temperature must be >= 0"),
        ([[1]], {"top_k": 0}, "top_k", r"top_k must be None or an integer >= 1, got 0"),
        ([[1]], {"top_p": 0.0}, "top_p", r"top_p must be None or a real in \(0, 1\], got 0.0"),
        ([[1]], {"eos_id": 7}, "eos_id", r"eos_id must be None or an integer between 0 and 6"),
        ([[1], [2]], {"key": jax.random.split(jax.random.key(0), 3)}, "key", r"shape \(2,\)"),
    ],
)
def test_bad_arguments_raise_one_clear_error(prompts, kwargs, parameter, message):
    arguments = {"max_new_tokens": 2, "key": jax.random.key(0)} | kwargs
    with rejects(ValueError, message, parameter=parameter):
        generate(_model(), prompts, **arguments)


def test_traced_bad_prompts_fail_the_compiled_call():
    """Under a caller's `jax.jit` the checks are `eqx.error_if`: the call fails with the
    host check's message (what `dew._checks.failed_check` reads back as a `ValueError`)."""
    model = _model()
    sample = jax.jit(
        lambda model, prompts, lengths: generate(
            model, prompts, prompt_lengths=lengths, max_new_tokens=STEPS, key=jax.random.key(0)
        )
    )
    prompts = np.array([[3, 1, 4, 0, 0], [1, 0, 0, 0, 0], [5, 2, 6, 5, 3]], np.int32)
    for bad, lengths, message in (
        (prompts, [3, 6, 5], "prompt_lengths must lie between 1 and the prompts' width 5"),
        (prompts + 3, [3, 1, 5], r"prompts holds token IDs outside \[0, 7\)"),
    ):
        with pytest.raises(Exception, match=message) as caught:
            jax.block_until_ready(sample(model, bad, np.array(lengths, np.int32)))
        assert re.search(message, str(failed_check(caught.value)))
    # Padding outside the vocabulary is never read, so it passes.
    padded = np.where(np.arange(5)[None, :] < np.array([[3], [1], [5]]), prompts, 99)
    np.testing.assert_array_equal(
        sample(model, padded, np.array([3, 1, 5], np.int32)).tokens,
        sample(model, prompts, np.array([3, 1, 5], np.int32)).tokens,
    )
