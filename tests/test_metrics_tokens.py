"""Token metrics (perplexity, mean loss, token accuracy) against float64 NumPy references,
their empty and degenerate passes, their errors, and a pass of 10**8 tokens."""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import metrics
from dew.artifacts import Clips, Images, Representations, TokenRows, TokenScores
from dew.metrics._tokens import MeanLoss, Perplexity, TokenAccuracy
from dew.testing import check_metric_laws, token_scores

NO_TARGET = "the pass has token positions but no counted target"
TOKEN_METRICS = {
    "perplexity": metrics.perplexity,
    "mean_loss": metrics.mean_loss,
    "token_accuracy": metrics.token_accuracy,
}
LOSS_METRICS = {"perplexity": metrics.perplexity, "mean_loss": metrics.mean_loss}


def _scores(losses, weights, correct=None) -> TokenScores:
    return TokenScores(
        jnp.asarray(np.asarray(losses, np.float32)),
        jnp.asarray(np.asarray(weights, np.float32)),
        None if correct is None else jnp.asarray(np.asarray(correct, np.bool_)),
    )


def _random_batches(seed: int, weight_kind: str) -> list[TokenScores]:
    """Batches of unequal row counts, with losses in [0, 6) nats and zero, 0/1 or
    fractional weights."""
    rng = np.random.default_rng(seed)
    batches = []
    for rows in (4, 1, 3, 4):
        losses = rng.uniform(0.0, 6.0, (rows, 16))
        if weight_kind == "binary":
            weights = (rng.random((rows, 16)) < 0.7).astype(np.float64)
        else:
            weights = rng.random((rows, 16))
            weights[rng.random((rows, 16)) < 0.3] = 0.0
        weights[0, 0] = 1.0
        correct = rng.random((rows, 16)) < 0.6
        batches.append(_scores(losses, weights, correct))
    return batches


def _pooled(batches: list[TokenScores], field: str = "losses") -> float:
    """sum(w * x) / sum(w) over every position of the pass, in float64 NumPy."""
    values = np.concatenate([np.asarray(getattr(b, field), np.float64).ravel() for b in batches])
    weights = np.concatenate([np.asarray(b.weights, np.float64).ravel() for b in batches])
    counted = weights != 0
    return float(np.sum(values[counted] * weights[counted]) / np.sum(weights))


def _fold(metric, batches):
    """The eager fold of a pass: init, merge each batch's statistics, finalize."""
    state = metric.init()
    for batch in batches:
        state = metric.merge(state, metric(batch))
    return metric.finalize(state)


# Against float64 references.


@pytest.mark.parametrize("weight_kind", ["binary", "fractional"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_perplexity_is_exp_of_pooled_weighted_mean_loss(seed, weight_kind):
    batches = _random_batches(seed, weight_kind)
    expected = np.exp(_pooled(batches))
    np.testing.assert_allclose(float(_fold(metrics.perplexity(), batches)), expected, rtol=1e-5)


@pytest.mark.parametrize("weight_kind", ["binary", "fractional"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mean_loss_is_pooled_weighted_mean_loss(seed, weight_kind):
    batches = _random_batches(seed, weight_kind)
    expected = _pooled(batches)
    np.testing.assert_allclose(float(_fold(metrics.mean_loss(), batches)), expected, rtol=1e-5)


@pytest.mark.parametrize("weight_kind", ["binary", "fractional"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_accuracy_is_pooled_weighted_mean_of_correct(seed, weight_kind):
    batches = _random_batches(seed, weight_kind)
    expected = _pooled(batches, "correct")
    assert 0.3 < expected < 0.9
    np.testing.assert_allclose(float(_fold(metrics.token_accuracy(), batches)), expected, rtol=1e-5)


def test_mean_loss_is_log_perplexity():
    batches = _random_batches(7, "fractional")
    perplexity = float(_fold(metrics.perplexity(), batches))
    mean_loss = float(_fold(metrics.mean_loss(), batches))
    np.testing.assert_allclose(np.log(perplexity), mean_loss, rtol=1e-6)


def test_token_metrics_match_reference_on_a_hand_computed_batch():
    losses = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    weights = [[1.0, 0.5, 0.0], [0.0, 0.25, 1.0]]
    correct = [[True, False, True], [True, True, False]]
    batch = [_scores(losses, weights, correct)]
    # sum(w * l) = 1 + 1 + 1.25 + 6 = 9.25, sum(w) = 2.75; correct weight = 1 + 0.25.
    assert float(_fold(metrics.mean_loss(), batch)) == pytest.approx(9.25 / 2.75, rel=1e-6)
    assert float(_fold(metrics.perplexity(), batch)) == pytest.approx(np.exp(9.25 / 2.75), 1e-6)
    assert float(_fold(metrics.token_accuracy(), batch)) == pytest.approx(1.25 / 2.75, rel=1e-6)


def test_perplexity_pools_tokens_rather_than_averaging_batch_averages():
    # One batch of one token with loss 4, one batch of four tokens with loss 0.
    batches = [_scores([[4.0]], [[1.0]]), _scores([[0.0, 0.0, 0.0, 0.0]], [[1.0] * 4])]
    pooled = np.exp(_pooled(batches))
    assert pooled == pytest.approx(np.exp(0.8))
    mean_of_batch_means = np.exp((4.0 + 0.0) / 2)
    mean_of_batch_perplexities = (np.exp(4.0) + np.exp(0.0)) / 2
    assert not np.isclose(pooled, mean_of_batch_means, rtol=0.1)
    assert not np.isclose(pooled, mean_of_batch_perplexities, rtol=0.1)

    got = float(_fold(metrics.perplexity(), batches))
    np.testing.assert_allclose(got, pooled, rtol=1e-6)
    via_set = metrics.reduce([metrics.perplexity()], batches)["perplexity"]
    np.testing.assert_allclose(float(via_set), pooled, rtol=1e-6)


def test_token_accuracy_pools_tokens_rather_than_averaging_batch_accuracies():
    batches = [
        _scores([[0.0]], [[1.0]], [[True]]),
        _scores([[0.0] * 4], [[1.0] * 4], [[False] * 4]),
    ]
    np.testing.assert_allclose(float(_fold(metrics.token_accuracy(), batches)), 0.2, rtol=1e-6)


# Empty and degenerate passes.


@pytest.mark.parametrize("name", list(TOKEN_METRICS))
def test_empty_pass_finalizes_to_nan(name):
    metric = TOKEN_METRICS[name]()
    assert np.isnan(float(metric.finalize(metric.init())))
    assert np.isnan(float(jax.jit(metric.finalize)(metric.init())))


@pytest.mark.parametrize("name", list(LOSS_METRICS))
def test_pass_with_every_weight_zero_raises_eagerly(name):
    metric = LOSS_METRICS[name]()
    padding = _scores([[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]])
    state = metric.merge(metric.merge(metric.init(), metric(padding)), metric(padding))
    with pytest.raises(ValueError, match=f"metric '{name}': {NO_TARGET}"):
        metric.finalize(state)


@pytest.mark.parametrize("jit", [jax.jit, eqx.filter_jit], ids=["jax.jit", "eqx.filter_jit"])
@pytest.mark.parametrize("name", list(LOSS_METRICS))
def test_pass_with_every_weight_zero_raises_when_the_compiled_function_runs(name, jit):
    metric = LOSS_METRICS[name]()

    def whole_pass(scores):
        return metric.finalize(metric.merge(metric.init(), metric(scores)))

    compiled = jit(whole_pass)
    counted = _scores([[1.0, 2.0]], [[1.0, 0.0]])
    padding = _scores([[1.0, 2.0]], [[0.0, 0.0]])
    assert np.isfinite(float(compiled(counted)))  # the same compiled function, a good pass
    with pytest.raises(Exception) as caught:  # noqa: PT011 - JAX's runtime error type varies
        jax.block_until_ready(compiled(padding))
    assert NO_TARGET in str(caught.value)
    assert f"metric '{name}'" in str(caught.value)


def test_pass_with_every_weight_zero_raises_inside_a_compiled_scan():
    padding = _scores([[1.0, 2.0, 3.0]], [[0.0, 0.0, 0.0]])
    metric_set = metrics.MetricSet([metrics.perplexity()])
    with pytest.raises(Exception) as caught:  # noqa: PT011 - JAX's runtime error type varies
        metric_set.reduce_stacked(metrics.stack_batches([padding, padding]))
    assert NO_TARGET in str(caught.value)


@pytest.mark.parametrize("name", list(LOSS_METRICS))
def test_all_padding_batch_within_a_counted_pass_changes_nothing(name):
    metric = LOSS_METRICS[name]()
    counted = _scores([[1.0, 2.0]], [[1.0, 1.0]])
    padding = _scores([[7.0, 9.0]], [[0.0, 0.0]])
    alone = float(_fold(metric, [counted]))
    assert float(_fold(metric, [padding, counted, padding])) == pytest.approx(alone, rel=1e-6)


def test_token_accuracy_of_a_pass_without_counted_targets_raises_like_perplexity():
    metric = metrics.token_accuracy()
    padding = _scores([[1.0, 2.0]], [[0.0, 0.0]], [[True, True]])
    with pytest.raises(ValueError, match="'token_accuracy': the pass has token positions but no"):
        _fold(metric, [padding])
    assert np.isnan(float(metric.finalize(metric.init())))


# NaN losses at padding positions, and non-finite values at counted positions.


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", list(LOSS_METRICS))
def test_non_finite_loss_at_zero_weight_position_does_not_poison_the_pass(name, bad):
    metric = LOSS_METRICS[name]()
    batch = _scores([[bad, 1.0, bad], [2.0, bad, 3.0]], [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    expected = 2.0 if name == "mean_loss" else np.exp(2.0)
    assert float(_fold(metric, [batch])) == pytest.approx(expected, rel=1e-6)
    compiled = jax.jit(lambda scores: metric.finalize(metric(scores)))
    assert float(compiled(batch)) == pytest.approx(expected, rel=1e-6)


def test_nan_loss_at_zero_weight_does_not_poison_accuracy_either():
    batch = _scores([[np.nan, 1.0]], [[0.0, 1.0]], [[False, True]])
    assert float(_fold(metrics.token_accuracy(), [batch])) == 1.0


def test_nan_loss_at_a_counted_position_is_reported_as_nan_not_raised():
    batch = _scores([[np.nan, 1.0]], [[1.0, 1.0]])
    assert np.isnan(float(_fold(metrics.perplexity(), [batch])))
    assert np.isnan(float(_fold(metrics.mean_loss(), [batch])))


# Errors for bad input.


def test_token_accuracy_without_correct_raises():
    scores = _scores([[1.0, 2.0]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match=r"metric 'token_accuracy' needs TokenScores\.correct"):
        metrics.token_accuracy()(scores)


WRONG_ARTIFACTS = {
    "Images": lambda: Images(jnp.zeros((1, 4, 4, 1), jnp.float32)),
    "Clips": lambda: Clips(jnp.zeros((1, 1, 4, 4, 1), jnp.float32)),
    "Representations": lambda: Representations(jnp.zeros((2, 3), jnp.float32)),
    "TokenRows": lambda: TokenRows(jnp.zeros((2, 3), jnp.int32)),
}


@pytest.mark.parametrize("artifact", list(WRONG_ARTIFACTS))
@pytest.mark.parametrize("name", list(TOKEN_METRICS))
def test_reading_the_wrong_artifact_type_names_both_types(name, artifact):
    metric = TOKEN_METRICS[name]()
    message = f"metric '{name}' reads TokenScores, got {artifact}."
    with pytest.raises(TypeError, match=message):
        metric(WRONG_ARTIFACTS[artifact]())


def test_renamed_metric_reports_its_own_name():
    metric = Perplexity(name="heldout_perplexity")
    assert metric.name == "heldout_perplexity"
    with pytest.raises(TypeError, match="metric 'heldout_perplexity' reads TokenScores"):
        metric(WRONG_ARTIFACTS["Images"]())
    padding = _scores([[1.0]], [[0.0]])
    with pytest.raises(ValueError, match=f"metric 'heldout_perplexity': {NO_TARGET}"):
        metric.finalize(metric(padding))


@pytest.mark.parametrize("kind", [Perplexity, MeanLoss, TokenAccuracy])
@pytest.mark.parametrize("name", ["val/ppl", "Perplexity", "", "1st", "mean-loss", "ppl "])
def test_metric_name_must_be_bare_snake_case(kind, name):
    with pytest.raises(ValueError, match="must be bare snake_case"):
        kind(name=name)


def test_factories_use_the_bare_names():
    assert [factory().name for factory in TOKEN_METRICS.values()] == list(TOKEN_METRICS)


# Laws.


@pytest.mark.parametrize("name", list(TOKEN_METRICS))
def test_token_metric_obeys_the_metric_laws(name):
    check_metric_laws(TOKEN_METRICS[name](), token_scores(), max_examples=10)


# Long passes: 10**8 weighted tokens in one compiled scan.

BATCH_SHAPE = (100, 1000)  # 100_000 tokens a batch


def _scan_state(metric, make_batch, num_batches: int):
    """The metric's statistics over `num_batches` batches, in one compiled lax.scan."""

    def step(state, index):
        return metric.merge(state, metric(make_batch(index))), None

    @jax.jit
    def run():
        state, _ = jax.lax.scan(step, metric.init(), jnp.arange(num_batches))
        return state

    return run()


def _sequential_float32_sum(value: np.float32, count: int) -> np.float32:
    """A plain float32 running sum of `count` copies of `value`, one token at a time."""
    chunk = 10**6
    block = np.full(chunk + 1, value, np.float32)
    total = np.float32(0.0)
    for _ in range(count // chunk):
        block[0] = total
        after = np.add.accumulate(block)[-1]
        if after == total:  # saturated: every further addition rounds away
            break
        total = after
    return total


def _constant_batch(index, loss: float) -> TokenScores:
    del index
    return TokenScores(jnp.full(BATCH_SHAPE, loss, jnp.float32), jnp.ones(BATCH_SHAPE, jnp.float32))


def test_constant_loss_over_10_to_the_8_tokens_matches_float64():
    num_batches = 1000
    tokens = num_batches * BATCH_SHAPE[0] * BATCH_SHAPE[1]
    assert tokens == 10**8
    metric = metrics.perplexity()
    state = _scan_state(metric, functools.partial(_constant_batch, loss=0.1), num_batches)

    loss32 = np.float32(0.1)
    exact_mean = float(loss32)  # every token carries the same float32 loss, weight 1
    expected = np.exp(exact_mean)
    assert float(state.weight.hi) + float(state.weight.lo) == tokens  # counts past 2**24
    total = float(state.loss.hi) + float(state.loss.lo)
    np.testing.assert_allclose(total, tokens * exact_mean, rtol=1e-7)
    np.testing.assert_allclose(float(metric.finalize(state)), expected, rtol=1e-6)
    np.testing.assert_allclose(float(metrics.mean_loss().finalize(state)), exact_mean, rtol=1e-6)

    # The same pass as a plain float32 running sum is badly off: its loss total stalls
    # near 2**21 and its token count at 2**24.
    naive_loss = _sequential_float32_sum(loss32, tokens)
    naive_weight = _sequential_float32_sum(np.float32(1.0), tokens)
    assert naive_weight == 2**24
    naive = np.exp(float(naive_loss) / float(naive_weight))
    assert abs(naive / expected - 1) > 1e-3


def _fmix32(h):
    """MurmurHash3's 32-bit finalizer; the same uint32 arithmetic in NumPy and in JAX."""
    uint32 = np.uint32
    h = h ^ (h >> uint32(16))
    h = h * uint32(0x85EBCA6B)
    h = h ^ (h >> uint32(13))
    h = h * uint32(0xC2B2AE35)
    return h ^ (h >> uint32(16))


def _hashed_tokens(positions, xp):
    """Losses in [0, 4) nats and weights in [0, 1), from a hash of each token's position in
    the pass; a quarter of the positions are padding (weight 0, loss NaN). Every step is
    exact in float32, so NumPy and JAX build the same values."""
    uint32 = np.uint32
    loss_bits = _fmix32(positions ^ uint32(0x01234567))
    weight_bits = _fmix32(positions ^ uint32(0x089ABCDE))
    losses = (loss_bits >> uint32(8)).astype(xp.float32) * xp.float32(2.0**-22)
    weights = (weight_bits >> uint32(8)).astype(xp.float32) * xp.float32(2.0**-24)
    padding = (weight_bits & uint32(3)) == 0
    weights = xp.where(padding, xp.float32(0.0), weights)
    losses = xp.where(padding, xp.float32(np.nan), losses)
    return losses, weights


def _hashed_batch(index) -> TokenScores:
    size = BATCH_SHAPE[0] * BATCH_SHAPE[1]
    start = index.astype(jnp.uint32) * jnp.uint32(size)
    positions = start + jnp.arange(size, dtype=jnp.uint32).reshape(BATCH_SHAPE)
    losses, weights = _hashed_tokens(positions, jnp)
    return TokenScores(losses, weights)


@pytest.mark.slow
def test_random_weighted_pass_of_2_times_10_to_the_7_tokens_matches_float64():
    num_batches = 200
    perplexity, mean_loss = metrics.perplexity(), metrics.mean_loss()
    state = _scan_state(perplexity, _hashed_batch, num_batches)

    # The float64 reference rebuilds the same float32 values in NumPy, 20 batches at a time.
    loss_total, weight_total = 0.0, 0.0
    chunk = 20 * BATCH_SHAPE[0] * BATCH_SHAPE[1]
    for start in range(0, num_batches * BATCH_SHAPE[0] * BATCH_SHAPE[1], chunk):
        positions = np.arange(start, start + chunk, dtype=np.uint32)
        losses, weights = _hashed_tokens(positions, np)
        assert np.any(weights == 0) and np.all(np.isnan(losses[weights == 0]))
        losses = np.where(weights != 0, losses, np.float32(0.0)).astype(np.float64)
        weights = weights.astype(np.float64)
        loss_total += float(np.dot(losses, weights))
        weight_total += float(np.sum(weights))
    expected_mean = loss_total / weight_total
    assert 1.9 < expected_mean < 2.1

    np.testing.assert_allclose(
        float(state.weight.hi) + float(state.weight.lo), weight_total, rtol=1e-9
    )
    np.testing.assert_allclose(float(state.loss.hi) + float(state.loss.lo), loss_total, rtol=1e-9)
    np.testing.assert_allclose(float(perplexity.finalize(state)), np.exp(expected_mean), rtol=1e-6)
    np.testing.assert_allclose(float(mean_loss.finalize(state)), expected_mean, rtol=1e-6)


@pytest.mark.parametrize("name", list(TOKEN_METRICS))
def test_a_non_empty_pass_finalizes_eagerly_under_debug_nans(name):
    # Users debugging NaNs turn debug_nans on: the NaN of an empty pass must never be
    # built for a pass that is not empty, eagerly or compiled.
    metric = TOKEN_METRICS[name]()
    batch = _scores([[0.5, 1.5, 2.0]], [[1.0, 0.0, 2.0]], [[True, False, True]])
    with jax.debug_nans(True):
        state = metric.merge(metric.init(), metric(batch))
        eager = float(metric.finalize(state))
        compiled = float(jax.jit(metric.finalize)(state))
    assert math.isfinite(eager) and compiled == pytest.approx(eager, rel=1e-6)
    assert math.isnan(float(metric.finalize(metric.init())))  # debug_nans off: NaN is data
