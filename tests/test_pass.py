"""dew._pass: one compiled call per batch scores it and merges every device metric."""

import dataclasses
import hashlib
import itertools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import Trainer, evaluate, metrics
from dew._domains import evaluation_key
from dew._pass import (
    PassResult,
    _Reducer,
    _update_for,
    preview_on_process_zero,
    run_pass,
    scoring_key,
)
from dew.artifacts import TokenScores
from dew.data import Dataset
from dew.metrics import Metric, MetricSet
from dew.metrics._base import MeanState
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective

CALLS = {"statistics": 0, "host": 0}


class CountingMean(Metric[TokenScores]):
    """The mean token loss, counting how often its statistics are built (traced or eager)."""

    name: str = "counted_loss"
    artifact_type: ClassVar[type] = TokenScores

    def init(self):
        return MeanState.zero()

    def statistics(self, artifact):
        CALLS["statistics"] += 1
        return MeanState.of(artifact.losses, artifact.weights)

    def merge(self, accumulated, contribution):
        return accumulated.merge(contribution)

    def finalize(self, accumulated):
        return accumulated.mean()


class HostWeightedLoss(Metric[TokenScores]):
    """A host metric: float64 NumPy sums merged on the host, seeing concrete arrays."""

    name: str = "host_loss"
    artifact_type: ClassVar[type] = TokenScores
    host: ClassVar[bool] = True

    def init(self):
        return np.zeros(2, np.float64)

    def statistics(self, artifact):
        assert not isinstance(artifact.losses, jax.core.Tracer)
        CALLS["host"] += 1
        losses = np.asarray(artifact.losses, np.float64)
        weights = np.asarray(artifact.weights, np.float64)
        return np.array([(losses * weights).sum(), weights.sum()])

    def merge(self, accumulated, contribution):
        return accumulated + contribution

    def finalize(self, accumulated):
        return accumulated[0] / accumulated[1] if accumulated[1] else float("nan")


@pytest.fixture(scope="module")
def objective():
    model = CausalTransformer(
        vocab_size=5,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        mlp_features=32,
        max_seq_len=16,
        key=jax.random.key(0),
    )
    return LMObjective(model, seq_len=8)


def _batches(seed, count=5, rows=4):
    rng = np.random.default_rng(seed)
    return [{"text": rng.integers(0, 5, (rows, 9)).astype(np.int32)} for _ in range(count)]


def _reference_mean_loss(objective, params, batches, key):
    """The token-weighted mean loss in float64 NumPy from each batch's own scoring."""
    total = weight = 0.0
    for index, batch in enumerate(batches):
        scores = objective.evaluate(params, batch, scoring_key(key, index))
        losses, weights = np.asarray(scores.losses, np.float64), np.asarray(scores.weights)
        total, weight = total + (losses * weights).sum(), weight + weights.sum()
    return total / weight


def test_a_pass_builds_metric_statistics_once_not_once_per_batch(objective):
    params, key = objective.init_params(), jax.random.key(0)
    batches = _batches(1, count=6)
    CALLS["statistics"] = 0
    first = evaluate(objective, params, batches, metrics=[CountingMean()], key=key)
    assert CALLS["statistics"] == 1  # traced once into the compiled call, never run eagerly
    second = evaluate(objective, params, _batches(2, count=6), metrics=[CountingMean()], key=key)
    assert CALLS["statistics"] == 1  # a second pass of the same structure reuses the call
    reference = _reference_mean_loss(objective, params, batches, key)
    np.testing.assert_allclose(first.scores["counted_loss"], reference, rtol=1e-6)
    assert second.scores["counted_loss"] != first.scores["counted_loss"]


def test_run_pass_returns_a_typed_result_with_the_first_artifact_on_request(objective):
    params, key = objective.init_params(), jax.random.key(3)
    batches = _batches(4, count=3)
    result = run_pass(
        objective, params, batches, MetricSet([metrics.mean_loss()]), key, keep_first_artifact=True
    )
    assert isinstance(result, PassResult)
    assert (result.batches, result.records, result.uneven_shards) == (3, 12, False)
    assert result.first_batch is batches[0]
    expected = objective.evaluate(params, batches[0], scoring_key(key, 0))
    # The pass is compiled, `evaluate` here eager: equal up to float32 rounding.
    np.testing.assert_allclose(result.first_artifact.losses, expected.losses, rtol=1e-6)
    without = run_pass(objective, params, batches, MetricSet([metrics.mean_loss()]), key)
    assert without.first_artifact is None
    assert without.scores == result.scores


def test_in_one_process_the_trainers_preview_is_the_objectives_own(objective):
    params, key = objective.init_params(), jax.random.key(5)
    batch = _batches(6, count=1)[0]
    shown = preview_on_process_zero(objective, params, batch, key)
    expected = objective.preview(params, batch, key)
    np.testing.assert_array_equal(np.asarray(shown.tokens), np.asarray(expected.tokens))


def test_a_pass_without_metrics_scores_nothing_but_counts(objective):
    result = run_pass(
        objective, objective.init_params(), _batches(5), MetricSet([]), jax.random.key(0)
    )
    assert (result.scores, result.batches, result.records, result.first_artifact) == (
        {},
        5,
        20,
        None,
    )
    empty = run_pass(
        objective, objective.init_params(), [], MetricSet([metrics.perplexity()]), jax.random.key(0)
    )
    assert (empty.scores, empty.batches, empty.first_batch) == ({}, 0, None)


def test_host_metrics_merge_on_the_host_beside_device_metrics(objective):
    params, key = objective.init_params(), jax.random.key(6)
    batches = _batches(7, count=4)
    CALLS["host"] = 0
    result = evaluate(
        objective, params, batches, metrics=[metrics.mean_loss(), HostWeightedLoss()], key=key
    )
    assert CALLS["host"] == 4  # once per batch, eagerly, on concrete arrays
    assert list(result.scores) == ["mean_loss", "host_loss"]
    reference = _reference_mean_loss(objective, params, batches, key)
    np.testing.assert_allclose(result.scores["host_loss"], reference, rtol=1e-6)
    np.testing.assert_allclose(result.scores["mean_loss"], reference, rtol=1e-6)


def test_the_accumulator_is_donated_to_each_compiled_call(objective):
    reducer = _Reducer(
        objective, objective.init_params(), MetricSet([metrics.perplexity()]), jax.random.key(0)
    )
    before = list(reducer.accumulator)
    reducer.add(_batches(8, count=1)[0], 0, keep=False)
    assert all(leaf.is_deleted() for leaf in before)
    assert not any(leaf.is_deleted() for leaf in reducer.accumulator)


def test_a_new_objective_of_the_same_structure_shares_the_compiled_call(objective):
    params, key = objective.init_params(), jax.random.key(0)
    evaluate(objective, params, _batches(9), metrics=[CountingMean()], key=key)
    CALLS["statistics"] = 0
    twin = eqx.tree_at(lambda o: o.model, objective, objective.model)  # a new, equal object
    assert twin is not objective
    evaluate(twin, params, _batches(9), metrics=[CountingMean()], key=key)
    assert CALLS["statistics"] == 0


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_trainer_validation_events_reuse_one_compiled_pass():
    model = CausalTransformer(
        vocab_size=5,
        emb_features=8,
        num_layers=1,
        num_heads=2,
        mlp_features=16,
        max_seq_len=16,
        key=jax.random.key(0),
    )
    objective = LMObjective(model, seq_len=8)  # a structure no other test compiled
    batches = _batches(10, count=3)
    data = Dataset(train=lambda _: itertools.repeat(batches[0]), val=lambda _: batches)
    CALLS["statistics"] = 0
    trainer = Trainer(objective, optax.sgd(0.1), jax.random.key(1))
    state = trainer.fit(
        data, 4, log_every=2, eval_every=1, metrics=[CountingMean()], progress=False
    )
    assert CALLS["statistics"] == 1  # four validation events, one trace
    history = state.metric_history["lm/validation/counted_loss"]
    assert [step for step, _ in history] == [1, 2, 3, 4]
    key = evaluation_key(jax.random.key(1), 4)  # the event key of step 4
    reference = _reference_mean_loss(objective, state.params, batches, key)
    np.testing.assert_allclose(history[-1][1], reference, rtol=1e-6)


class CountingChecks(LMObjective):
    """An LM objective counting its host-side batch checks."""

    def check_batch(self, batch):
        CALLS["checks"] = CALLS.get("checks", 0) + 1
        super().check_batch(batch)


def test_host_batches_are_checked_on_the_host_and_scored_without_the_traced_check(objective):
    counting = CountingChecks(objective.model, seq_len=8)
    params, key = counting.init_params(), jax.random.key(0)
    batches = _batches(11, count=3)
    CALLS["checks"] = 0
    result = evaluate(counting, params, batches, metrics=[metrics.mean_loss()], key=key)
    assert CALLS["checks"] == 3
    np.testing.assert_allclose(
        result.scores["mean_loss"], _reference_mean_loss(counting, params, batches, key), rtol=1e-6
    )
    spec = _Reducer(counting, params, MetricSet([metrics.mean_loss()]), key).spec
    traced = jax.make_jaxpr(_update_for(counting)[0](spec).__wrapped__)
    host = jax.make_jaxpr(
        _update_for(counting)[0](dataclasses.replace(spec, checked_on_host=True)).__wrapped__
    )
    arguments = _Reducer(counting, params, MetricSet([metrics.mean_loss()]), key)
    call = (
        arguments.accumulator,
        batches[0],
        0,
        key,
        arguments.params,
        arguments.objective_leaves,
        arguments.metric_leaves,
    )
    assert "callback" in str(traced(*call)) and "callback" not in str(host(*call))


def test_a_bad_id_is_named_for_host_and_device_batches_alike(objective):
    params, key = objective.init_params(), jax.random.key(0)
    bad = _batches(12, count=2)
    bad[1]["text"][2, 4] = 9
    message = r"batch\['text'\] holds token ID 9 at row 2, position 4; valid IDs are 0 to 4"
    with pytest.raises(ValueError, match=message):
        evaluate(objective, params, bad, metrics=[metrics.perplexity()], key=key)
    on_device = [{"text": jnp.asarray(batch["text"])} for batch in bad]
    with pytest.raises(ValueError, match=message) as caught:
        evaluate(objective, params, on_device, metrics=[metrics.perplexity()], key=key)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_passes_of_one_objective_and_metric_set_share_one_plan(objective, monkeypatch):
    from dew import _pass

    built = []
    original = _pass._Plan.__init__

    def counting(self, *args):
        built.append(1)
        original(self, *args)

    monkeypatch.setattr(_pass._Plan, "__init__", counting)
    params = objective.init_params()
    perplexity = MetricSet([metrics.perplexity()])
    key = jax.random.key(0)
    first = [run_pass(objective, params, _batches(s), perplexity, key) for s in (1, 2)]
    assert len(built) == 1 and first[0].scores != first[1].scores
    again = run_pass(objective, params, _batches(1), perplexity, jax.random.key(0))
    assert again.scores == first[0].scores  # a reused plan starts from an empty accumulator


def test_passes_over_new_metric_sets_of_the_same_metrics_share_one_plan(objective, monkeypatch):
    # `dew.evaluate` builds a `MetricSet` of its metrics on every call, and so does each fit:
    # the plan is found by the metrics' identities, not the set's (before: one plan a pass).
    from dew import _pass

    built = []
    original = _pass._Plan.__init__

    def counting(self, *args):
        built.append(1)
        original(self, *args)

    monkeypatch.setattr(_pass._Plan, "__init__", counting)
    params = objective.init_params()
    chosen = [metrics.perplexity(), metrics.token_accuracy()]
    key = jax.random.key(0)
    scores = [
        evaluate(objective, params, _batches(1), metrics=chosen, key=key).scores for _ in range(3)
    ]
    assert len(built) == 1 and scores[0] == scores[1] == scores[2]
    # other metric objects (equal ones too) are another set: a plan of their own
    other = evaluate(objective, params, _batches(1), metrics=[metrics.perplexity()], key=key)
    assert len(built) == 2 and other.scores["perplexity"] == scores[0]["perplexity"]


def test_a_plan_is_forgotten_with_its_metrics(objective):
    # A plan (its compiled calls) lives while its objective and metrics do: one process
    # that evaluates with new metric objects again and again does not keep every plan.
    import gc
    import weakref

    from dew._pass import _reducer

    params = objective.init_params()
    chosen = [metrics.perplexity(), metrics.token_accuracy()]
    evaluate(objective, params, _batches(1), metrics=chosen, key=jax.random.key(0))
    device, _ = _reducer._split(MetricSet(chosen))
    plan = weakref.ref(_reducer._plan_for(objective, device, jax.tree.structure(params)))
    gc.collect()
    assert plan() is not None  # the metrics live: the plan is found again
    remembered = len(_reducer._plans._entries)
    for _ in range(3):  # new metric objects, each call
        fresh = [metrics.perplexity()]
        evaluate(objective, params, _batches(1), metrics=fresh, key=jax.random.key(0))
    del fresh
    gc.collect()
    assert len(_reducer._plans._entries) <= remembered  # the three plans are gone
    del chosen, device
    gc.collect()
    assert plan() is None


def test_a_check_that_surfaces_only_at_the_final_fetch_is_still_a_value_error(monkeypatch):
    """On an asynchronous backend a failed traced check may raise only where the pass fetches
    its result, after the failing batch's call returned: the pass re-checks its last batch,
    and otherwise raises the check's own traced message, never JAX's runtime text."""
    message = "LMObjective: batch['text'] holds token IDs outside [0, 4); traced."
    failing = jax.jit(lambda x: eqx.error_if(x, x > 0, message))
    original = _Reducer.finalize

    def finalize_poisoned(self):
        values = original(self)
        return {name: failing(jnp.ones(())) + value for name, value in values.items()}

    monkeypatch.setattr(_Reducer, "finalize", finalize_poisoned)
    model = CausalTransformer(4, 16, 1, 2, 32, 16, key=jax.random.key(0))
    objective = LMObjective(model, seq_len=8)
    clean = {"text": jnp.zeros((2, 9), jnp.int32)}
    params, key, scored = objective.init_params(), jax.random.key(0), [metrics.perplexity()]
    with pytest.raises(ValueError, match=r"outside \[0, 4\); traced") as caught:
        evaluate(objective, params, [clean], metrics=scored, key=key)
    assert str(caught.value) == message
    bad = {"text": jnp.full((2, 9), 7, jnp.int32)}  # the last batch explains itself
    with pytest.raises(ValueError, match=r"holds token ID 7 at row 0, position 0"):
        evaluate(objective, params, [clean, bad], metrics=scored, key=key)


# -- the identity of a pass's conditioning data ----------------------------------------------


def test_run_pass_identifies_the_conditioning_values_of_every_row(objective):
    params = objective.init_params()
    labels = [np.array([3, 0, 7], np.int64), np.array([1, 1, 4], np.int32), np.array([9, 5, 6])]

    def batches(groups):
        return [{"text": np.zeros((len(rows), 9), np.int32), "labels": rows} for rows in groups]

    def digest(groups, conditioning=lambda batch: batch["labels"], metric_set=None):
        metric_set = MetricSet(()) if metric_set is None else metric_set
        result = run_pass(
            objective,
            params,
            batches(groups),
            metric_set,
            jax.random.key(0),
            conditioning=conditioning,
        )
        return result.conditioning_sha256

    # every row's label in pass order, as little-endian int64, whatever the batches' dtypes
    whole = np.concatenate([rows.astype("<i8") for rows in labels])
    expected = hashlib.sha256(whole.tobytes()).hexdigest()
    assert digest(labels) == expected
    assert digest([np.concatenate(labels[:2]), labels[2]]) == expected  # however batched
    assert digest(labels, metric_set=MetricSet((metrics.mean_loss(),))) == expected
    assert digest(labels[::-1]) != expected  # the order of the rows is part of it
    assert digest(labels, conditioning=None) is None
    assert digest(labels, conditioning=lambda batch: None) is None
    with pytest.raises(ValueError, match=r"conditioning values must be integers .* float32"):
        digest(labels, conditioning=lambda batch: batch["text"].astype(np.float32))


@jax.tree_util.register_pytree_node_class
class _CountedFlattens:
    """A pytree node holding one array that counts how often it is flattened."""

    flattened = 0

    def __init__(self, weight):
        self.weight = weight

    def tree_flatten(self):
        type(self).flattened += 1
        return (self.weight,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


class _CountedModel(eqx.Module):
    counted: _CountedFlattens

    def __call__(self, x):
        return x @ self.counted.weight


def test_a_pass_flattens_the_objective_a_fixed_number_of_times_not_once_per_batch():
    # The host checks of each batch once looked up methods on the objective, and Equinox
    # flattens the whole objective (its model) to bind each one: a per-batch cost that grew
    # with the model. Now the flattens of a pass do not depend on how many batches it has.
    from dew.objectives.supervised import SupervisedObjective

    rng = np.random.default_rng(0)
    objective = SupervisedObjective(
        _CountedModel(_CountedFlattens(jnp.ones((3, 1)))),
        lambda model, x, y, w, key, training: jnp.mean((jax.vmap(model)(x) - y) ** 2),
    )
    params, key = objective.init_params(), jax.random.key(0)

    def flattens(count):
        batches = [
            {"inputs": rng.standard_normal((4, 3), np.float32), "targets": np.zeros((4, 1))}
            for _ in range(count)
        ]
        before = _CountedFlattens.flattened
        result = evaluate(objective, params, batches, metrics=[metrics.loss()], key=key)
        assert result.coordinated_batches == count
        return _CountedFlattens.flattened - before

    flattens(2)  # compiled here
    assert flattens(8) == flattens(2)
