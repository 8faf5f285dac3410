"""dew.steps: train_step against a hand-written optax step, EMA, donation, history."""

import pickle
import tracemalloc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.steps import MetricHistory, TrainState, ema_update, eval_step, train_step


@pytest.fixture(scope="module")
def objective():
    model = CausalTransformer(
        vocab_size=4,
        emb_features=8,
        num_layers=1,
        num_heads=2,
        mlp_features=16,
        max_seq_len=8,
        key=jax.random.key(0),
    )
    return LMObjective(model, seq_len=4)


BATCH = {"text": jnp.asarray(np.arange(20, dtype=np.int32).reshape(4, 5) % 4)}


def test_train_step_equals_a_hand_written_optax_step(objective):
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    key = jax.random.key(7)
    next_state, out = jax.jit(lambda s: train_step(objective, optimizer, s, BATCH, key))(state)

    @jax.jit
    def hand_written(params, opt_state):
        (loss, aux), grads = jax.value_and_grad(objective.loss, has_aux=True)(params, BATCH, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), loss, aux

    params = objective.init_params()
    expected, loss, aux = hand_written(params, optimizer.init(params))
    for got, want in zip(
        jax.tree.leaves(next_state.params), jax.tree.leaves(expected), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["loss"], loss, rtol=1e-6)
    np.testing.assert_allclose(out["token_accuracy"], aux["token_accuracy"])
    assert int(next_state.step) == 1
    assert next_state.key is state.key or np.array_equal(
        jax.random.key_data(next_state.key), jax.random.key_data(state.key)
    )


def test_jitted_step_with_donation_does_not_recompile(objective):
    optimizer = optax.sgd(0.1)
    traces = []

    def step(state, batch, key):
        traces.append(1)
        return train_step(objective, optimizer, state, batch, key)

    compiled = jax.jit(step, donate_argnums=0)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    for i in range(4):
        state, _ = compiled(state, BATCH, jax.random.key(i))
    assert int(state.step) == 4
    assert len(traces) == 1


def test_ema_update_is_the_exponential_moving_average():
    ema = {"w": jnp.array([1.0, 2.0]), "n": None}
    params = {"w": jnp.array([3.0, -2.0]), "n": None}
    np.testing.assert_allclose(ema_update(ema, params, 0.9)["w"], [1.2, 1.6], rtol=1e-6)


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_train_step_updates_the_ema_when_asked(objective):
    optimizer = optax.sgd(0.5)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0), ema=True)
    step = jax.jit(
        lambda s: train_step(objective, optimizer, s, BATCH, jax.random.key(1), ema_decay=0.75)
    )  # eager, the grad dispatches op by op
    next_state, _ = step(state)
    for ema, old, new in zip(
        jax.tree.leaves(next_state.ema_params),
        jax.tree.leaves(state.params),
        jax.tree.leaves(next_state.params),
        strict=True,
    ):
        np.testing.assert_allclose(ema, 0.75 * old + 0.25 * new, rtol=1e-6, atol=1e-7)
    scores_live = eval_step(objective, next_state, BATCH, jax.random.key(0))
    scores_ema = eval_step(objective, next_state, BATCH, jax.random.key(0), use_ema=True)
    assert not np.allclose(scores_live.losses, scores_ema.losses)


def test_ema_decay_without_ema_params_raises(objective):
    optimizer = optax.sgd(0.5)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    with pytest.raises(ValueError, match="the state has no ema_params"):
        train_step(objective, optimizer, state, BATCH, jax.random.key(1), ema_decay=0.9)
    with pytest.raises(ValueError, match="needs a state with ema_params"):
        eval_step(objective, state, BATCH, jax.random.key(0), use_ema=True)


def test_donating_the_state_leaves_the_objective_and_the_key_usable(objective):
    optimizer = optax.sgd(0.1)
    key = jax.random.key(0)
    state = TrainState.create(objective, optimizer, key=key, ema=True)
    step = jax.jit(
        lambda s, b, k: train_step(objective, optimizer, s, b, k, ema_decay=0.9), donate_argnums=0
    )
    state, _ = step(state, BATCH, jax.random.key(1))
    objective.loss(objective.init_params(), BATCH, key)  # neither was donated
    assert int(state.step) == 1


def test_optimizer_updates_only_the_trainable_arrays(objective):
    params = objective.init_params()
    leaves = jax.tree.leaves(params)
    assert leaves
    assert all(eqx.is_inexact_array(leaf) for leaf in leaves)


def test_metric_history_is_immutable_and_keyed_by_tag():
    empty = MetricHistory()
    one = empty.with_values({"lm/train/loss": 2.0}, step=5)
    two = one.with_values({"lm/train/loss": 1.0, "lm/validation/perplexity": 3.0}, step=10)
    assert dict(empty) == {}
    assert dict(one) == {"lm/train/loss": ((5, 2.0),)}
    assert dict(two) == {
        "lm/train/loss": ((5, 2.0), (10, 1.0)),
        "lm/validation/perplexity": ((10, 3.0),),
    }
    assert list(two) == ["lm/train/loss", "lm/validation/perplexity"]
    assert one == MetricHistory(dict(one))  # equal by contents
    assert hash(one) == hash(MetricHistory(dict(one)))
    assert one != two and one != empty and one != dict(one)


_VALUES = st.floats(allow_nan=True, allow_infinity=True, width=64)
_SERIES = st.dictionaries(
    st.sampled_from(["lm/train/loss", "lm/validation/perplexity", "x/test/psnr"]),
    st.lists(st.tuples(st.integers(0, 10**6), _VALUES), max_size=4).map(tuple),
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(_SERIES, _SERIES)
def test_metric_histories_are_equal_exactly_when_their_series_are(a, b):
    def same(x, y):  # NaN equals NaN: non-finite values are data
        return (np.isnan(x) and np.isnan(y)) or x == y

    expected = a.keys() == b.keys() and all(
        len(a[t]) == len(b[t])
        and all(s == u and same(x, y) for (s, x), (u, y) in zip(a[t], b[t], strict=True))
        for t in a
    )
    assert (MetricHistory(a) == MetricHistory(b)) == expected
    assert MetricHistory(a) == MetricHistory(dict(a))
    if expected:
        assert hash(MetricHistory(a)) == hash(MetricHistory(b))


def _tuple_copy_append(series, values, step):
    """The definition of an append before issue 27: copy every series, extend the tuples."""
    series = dict(series)
    for tag, value in values.items():
        series[tag] = (*series.get(tag, ()), (int(step), value))
    return series


def _contents(series):
    """What two histories are compared by: tags, int steps, values with NaN as "NaN"."""
    return {
        tag: tuple((int(step), "NaN" if np.isnan(value) else value) for step, value in points)
        for tag, points in series.items()
    }


_TAGS = st.sampled_from(["lm/train/loss", "lm/validation/perplexity", "x/test/psnr"])
_APPENDS = st.lists(
    st.tuples(
        st.integers(0, 10**6),  # which history to append to (modulo those built so far)
        st.dictionaries(_TAGS, st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf")])),
        st.integers(0, 10**6),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_APPENDS)
def test_appends_build_the_history_the_tuple_copy_definition_builds(appends):
    # Any sequence of appends, a history often appended to twice (two branches): each
    # history holds what the old tuple-copy definition holds, its parent never changes,
    # and equality and hashes agree with the old definition's contents.
    histories, references = [MetricHistory()], [{}]
    for parent, values, step in appends:
        index = parent % len(histories)
        before = _contents(histories[index])
        histories.append(histories[index].with_values(values, step))
        references.append(_tuple_copy_append(references[index], values, step))
        assert _contents(histories[index]) == before  # the parent is unchanged
    for history, reference in zip(histories, references, strict=True):
        assert _contents(history) == _contents(reference)
        assert list(history) == list(reference)
        assert history == MetricHistory(reference)
        assert hash(history) == hash(MetricHistory(reference))
    for i, first in enumerate(histories):
        for j, second in enumerate(histories):
            same = _contents(references[i]) == _contents(references[j])
            assert (first == second) == same
            if same:
                assert hash(first) == hash(second)


def test_two_appends_to_one_history_leave_it_and_each_other_alone():
    parent = MetricHistory().with_values({"lm/train/loss": 1.0}, step=1)
    left = parent.with_values({"lm/train/loss": 2.0}, step=2)
    right = parent.with_values({"lm/train/loss": 3.0}, step=2)
    grandchild = left.with_values({"lm/train/loss": 4.0, "lm/validation/loss": 5.0}, step=3)
    assert parent["lm/train/loss"] == ((1, 1.0),)
    assert left["lm/train/loss"] == ((1, 1.0), (2, 2.0))
    assert right["lm/train/loss"] == ((1, 1.0), (2, 3.0))
    assert grandchild["lm/train/loss"] == ((1, 1.0), (2, 2.0), (3, 4.0))
    assert "lm/validation/loss" in grandchild and "lm/validation/loss" not in left
    assert right.with_values({"lm/train/loss": 2.0}, step=3) != grandchild
    assert pickle.loads(pickle.dumps(grandchild)) == grandchild
    assert repr(left) == ("MetricHistory({'lm/train/loss': ((1, 1.0), (2, 2.0))})")


def test_histories_built_by_appends_share_their_points():
    # 200 histories kept alive, each one append after the last, over a 10,000-point
    # series: they share one list of points (the tuple-copy definition held 200 copies
    # of the series, 16 MB, and copied it on every append).
    history = MetricHistory({"lm/train/loss": tuple((step, 0.5) for step in range(10_000))})
    tracemalloc.start()
    try:
        kept = []
        for step in range(10_000, 10_200):
            history = history.with_values({"lm/train/loss": 1.0}, step)
            kept.append(history)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1_000_000, held
    assert len(kept[-1]["lm/train/loss"]) == 10_200 and kept[0]["lm/train/loss"][-1] == (
        10_000,
        1.0,
    )


def test_an_equal_history_does_not_recompile_a_jitted_step():
    traces = []

    @jax.jit
    def step(state):
        traces.append(1)
        return state.step + 1

    def state(history):
        zero = jnp.zeros((), jnp.int32)
        return TrainState(zero, {}, (), jax.random.key(0), None, history)

    history = MetricHistory({"lm/train/loss": ((1, float("nan")),)})
    step(state(history))
    step(state(MetricHistory(dict(history))))
    assert len(traces) == 1


def _odd_objective(seed: int) -> LMObjective:
    """An objective whose parameters have shapes no other test compiles a kernel for."""
    model = CausalTransformer(
        vocab_size=7,
        emb_features=6,
        num_layers=1,
        num_heads=2,
        mlp_features=11,
        max_seq_len=9,
        key=jax.random.key(seed),
    )
    return LMObjective(model, seq_len=4)


def _compilations(caplog, call):
    """`call()`'s result and the number of XLA compilations it ran."""
    caplog.clear()
    with caplog.at_level("WARNING"), jax.log_compiles():
        result = jax.block_until_ready(call())
    return result, sum(record.getMessage().startswith("Compiling ") for record in caplog.records)


def test_create_compiles_one_program_whatever_the_parameter_shapes(caplog):
    objective = _odd_objective(0)
    optimizer = optax.adamw(optax.cosine_decay_schedule(1e-3, 10))  # a new one: no cache hit
    state, compiled = _compilations(
        caplog, lambda: TrainState.create(objective, optimizer, key=jax.random.key(3), ema=True)
    )
    # eagerly: a copy and a zeros_like for each parameter shape, the count, the key...
    assert compiled <= 1
    _, again = _compilations(
        caplog, lambda: TrainState.create(objective, optimizer, key=jax.random.key(4), ema=True)
    )
    assert again == 0
    assert int(state.step) == 0


@pytest.mark.parametrize(
    "optimizer",
    [
        optax.adam(1e-3),
        optax.adamw(optax.cosine_decay_schedule(1e-3, 10), weight_decay=0.1),
        optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9)),
        optax.lion(1e-4),
        optax.adafactor(1e-3),
        optax.rmsprop(1e-3),
    ],
    ids=["adam", "adamw", "clipped-sgd", "lion", "adafactor", "rmsprop"],
)
def test_create_gives_optax_s_own_eager_initial_state(optimizer):
    objective = _odd_objective(1)
    params = objective.init_params()
    key = jax.random.key(5)
    state = TrainState.create(objective, optimizer, key=key, ema=True)
    expected = optimizer.init(params)  # optax itself, eagerly
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(expected), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for copy in (state.params, state.ema_params):
        for got, want in zip(jax.tree.leaves(copy), jax.tree.leaves(params), strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            assert got.unsafe_buffer_pointer() != want.unsafe_buffer_pointer()  # a copy
    np.testing.assert_array_equal(jax.random.key_data(state.key), jax.random.key_data(key))
    assert state.step.dtype == jnp.int32 and int(state.step) == 0


def test_create_initialises_an_optimizer_that_needs_concrete_values_eagerly():
    seen = []

    def init(params):
        seen.append(
            float(jnp.sum(params.stack.token_embedding.weight))
        )  # a host value: cannot be traced
        return optax.EmptyState()

    optimizer = optax.GradientTransformation(init, optax.identity().update)
    objective = _odd_objective(2)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    assert state.opt_state == optax.EmptyState()
    weight = objective.model.stack.token_embedding.weight
    assert seen == [pytest.approx(float(np.sum(np.asarray(weight))))]
