"""MetricSet: validation, reducing a pass (eager fold, compiled per-batch update, one compiled
scan), key order, empty passes, compile caching, vmap, and a user-written metric."""

import itertools
import re
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew import metrics
from dew.artifacts import Artifact, Images, TokenScores
from dew.metrics import Metric, MetricSet, stack_batches
from dew.metrics._tokens import MeanLoss, Perplexity
from dew.testing import check_metric_laws, token_scores


class MaxLoss(Metric[TokenScores]):
    """A user metric: the largest counted loss of the pass (NaN for an empty pass)."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    name: str = eqx.field(static=True, default="max_loss")

    def init(self):
        return jnp.full((), -jnp.inf, jnp.float32)

    def statistics(self, artifact):
        counted = artifact.weights != 0
        return jnp.max(
            jnp.where(counted, artifact.losses, jnp.full_like(artifact.losses, -jnp.inf))
        )

    def merge(self, accumulated, contribution):
        return jnp.maximum(accumulated, contribution)

    def finalize(self, accumulated):
        return jnp.where(
            jnp.isneginf(accumulated), jnp.full_like(accumulated, jnp.nan), accumulated
        )


class HostMinLoss(Metric[TokenScores]):
    """A user host metric: the smallest counted loss, in a float64 NumPy buffer merged in place."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    host: ClassVar[bool] = True
    name: str = eqx.field(static=True, default="host_min_loss")

    def init(self):
        return np.full((), np.inf)

    def statistics(self, artifact):
        losses = np.asarray(artifact.losses, np.float64)
        counted = np.asarray(artifact.weights) != 0
        return np.min(losses, where=counted, initial=np.inf)

    def merge(self, accumulated, contribution):
        np.minimum(accumulated, contribution, out=accumulated)
        return accumulated

    def finalize(self, accumulated):
        return np.nan if np.isinf(accumulated) else float(accumulated)


TRACES: list[tuple[int, ...]] = []
_TRACED_NAMES = (f"traced_token_count_{i}" for i in itertools.count())


class TracedTokenCount(Metric[TokenScores]):
    """Counts weighted tokens, and records each time JAX traces its statistics."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    name: str = eqx.field(static=True, default="traced_token_count")

    def init(self):
        return metrics.Sum.zero()

    def statistics(self, artifact):
        TRACES.append(artifact.weights.shape)
        return metrics.Sum.of(artifact.weights)

    def merge(self, accumulated, contribution):
        return accumulated.add(contribution)

    def finalize(self, accumulated):
        return accumulated.value()


def _batches(seed: int, count: int = 5, rows: int = 3, positions: int = 8) -> list[TokenScores]:
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        losses = rng.uniform(0.0, 5.0, (rows, positions)).astype(np.float32)
        weights = rng.random((rows, positions)).astype(np.float32)
        weights[rng.random((rows, positions)) < 0.3] = 0.0
        weights[:, 0] = 1.0
        correct = rng.random((rows, positions)) < 0.5
        batches.append(TokenScores(jnp.asarray(losses), jnp.asarray(weights), jnp.asarray(correct)))
    return batches


def _all_metrics() -> tuple[Metric, ...]:
    return (
        metrics.token_accuracy(),
        MaxLoss(),
        metrics.perplexity(),
        metrics.mean_loss(),
    )


def _eager_fold(metric_list, batches) -> dict[str, float]:
    values = {}
    for metric in metric_list:
        state = metric.init()
        for batch in batches:
            state = metric.merge(state, metric(batch))
        values[metric.name] = float(metric.finalize(state))
    return values


def _floats(scores: dict) -> dict[str, float]:
    return {name: float(value) for name, value in scores.items()}


# Validation.


def test_duplicate_metric_names_raise_naming_the_duplicate():
    with pytest.raises(ValueError, match=r"got \['perplexity'\] more than once"):
        MetricSet([metrics.perplexity(), metrics.mean_loss(), Perplexity()])


def test_two_metric_classes_under_one_name_are_duplicates():
    with pytest.raises(ValueError, match=r"got \['mean_loss'\] more than once"):
        MetricSet([metrics.mean_loss(), Perplexity(name="mean_loss")])


def test_renaming_one_of_two_like_metrics_resolves_the_duplicate():
    metric_set = MetricSet([metrics.perplexity(), Perplexity(name="perplexity_again")])
    assert metric_set.names == ("perplexity", "perplexity_again")


@pytest.mark.parametrize("bad", ["perplexity", metrics.perplexity, 3.0])
def test_non_metric_in_a_set_is_rejected(bad):
    # Under the test session's type checker, beartype checks one sampled item of the list,
    # so either it or MetricSet itself rejects the value; both raise a TypeError naming
    # MetricSet. (`rejects` cannot be used: the checker's message for a bad list item does
    # not name the parameter.)
    with pytest.raises(TypeError, match="MetricSet"):
        MetricSet([metrics.mean_loss(), bad])


def test_non_metric_in_a_set_raises_type_error_naming_value_and_type(monkeypatch):
    # With the test session's runtime type checker off, as for a user without one.
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)
    message = "MetricSet takes Metric instances, got 'ppl' of type str."
    with pytest.raises(TypeError, match=re.escape(message)):
        MetricSet([metrics.perplexity(), "ppl"])


@pytest.mark.parametrize("name", ["val/ppl", "Perplexity", "val_ppl/x", "_ppl"])
def test_metric_names_that_are_not_bare_snake_case_raise(name):
    with pytest.raises(ValueError, match=f"metric name {name!r} must be bare snake_case"):
        Perplexity(name=name)
    with pytest.raises(ValueError, match="must be bare snake_case"):
        MaxLoss(name=name)


def test_names_and_on_device_describe_the_set():
    assert MetricSet(_all_metrics()).names == (
        "token_accuracy",
        "max_loss",
        "perplexity",
        "mean_loss",
    )
    assert MetricSet(_all_metrics()).on_device
    assert not MetricSet([metrics.perplexity(), HostMinLoss()]).on_device


# Reducing a pass.


def test_reduce_equals_eager_fold_and_reduce_stacked():
    batches = _batches(seed=0)
    metric_list = _all_metrics()
    metric_set = MetricSet(metric_list)
    expected = _eager_fold(metric_list, batches)

    reduced = _floats(metric_set.reduce(batches))
    stacked = _floats(metric_set.reduce_stacked(stack_batches(batches)))
    # Keys follow the metrics' order, which here is neither alphabetical nor the built-ins'.
    assert list(reduced) == list(stacked) == list(expected) == list(metric_set.names)
    for name, value in expected.items():
        np.testing.assert_allclose(reduced[name], value, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(stacked[name], value, rtol=1e-6, err_msg=name)


def test_reduce_of_a_generator_holds_one_batch_at_a_time():
    batches = _batches(seed=1)
    metric_set = MetricSet(_all_metrics())
    from_list = _floats(metric_set.reduce(batches))
    from_generator = _floats(metric_set.reduce(batch for batch in batches))
    assert from_generator == pytest.approx(from_list, rel=1e-7)


def test_module_level_reduce_is_metric_set_reduce():
    batches = _batches(seed=2)
    metric_list = _all_metrics()
    got = _floats(metrics.reduce(metric_list, batches))
    assert got == pytest.approx(_floats(MetricSet(metric_list).reduce(batches)), rel=1e-7)
    assert got == pytest.approx(_eager_fold(metric_list, batches), rel=1e-6)


def test_update_init_finalize_fold_a_pass_by_hand():
    batches = _batches(seed=3)
    metric_set = MetricSet(_all_metrics())
    state = metric_set.init()
    for batch in batches:
        state = metric_set.update(state, batch)
    by_hand = _floats(metric_set.finalize(state))
    assert by_hand == pytest.approx(_eager_fold(_all_metrics(), batches), rel=1e-6)


def test_reduce_pools_batches_of_different_shapes():
    batches = [*_batches(seed=4, count=2, rows=1, positions=8), *_batches(seed=5, count=2)]
    got = _floats(MetricSet(_all_metrics()).reduce(batches))
    assert got == pytest.approx(_eager_fold(_all_metrics(), batches), rel=1e-6)


def test_result_keys_keep_order_when_host_and_device_metrics_mix():
    metric_list = [metrics.mean_loss(), HostMinLoss(), MaxLoss(), metrics.perplexity()]
    batches = _batches(seed=7)
    scores = MetricSet(metric_list).reduce(batches)
    assert list(scores) == ["mean_loss", "host_min_loss", "max_loss", "perplexity"]
    counted = np.concatenate(
        [np.asarray(b.losses)[np.asarray(b.weights) != 0] for b in batches]
    ).astype(np.float64)
    assert scores["host_min_loss"] == counted.min()
    assert float(scores["max_loss"]) == counted.max()
    assert _floats(scores) == pytest.approx(_eager_fold(metric_list, batches), rel=1e-6)


def test_reduce_stacked_refuses_host_metrics_naming_them():
    metric_set = MetricSet([metrics.perplexity(), HostMinLoss()])
    with pytest.raises(ValueError, match=r"\['host_min_loss'\] are host metrics; use reduce"):
        metric_set.reduce_stacked(stack_batches(_batches(seed=8, count=2)))


def test_empty_pass_gives_nan_for_every_metric():
    metric_list = [*_all_metrics(), HostMinLoss()]
    scores = MetricSet(metric_list).reduce([])
    assert list(scores) == [metric.name for metric in metric_list]
    for name, value in scores.items():
        assert np.isnan(float(value)), name
    assert all(np.isnan(float(v)) for v in metrics.reduce(_all_metrics(), iter(())).values())


def test_empty_metric_set_reduces_to_an_empty_dict():
    assert MetricSet([]).reduce(_batches(seed=9, count=1)) == {}


def test_a_set_of_metrics_reading_different_artifact_types_is_refused():
    with pytest.raises(ValueError, match=r"these metrics read \['Images', 'TokenScores'\]"):
        MetricSet([metrics.perplexity(), metrics.psnr()])


def test_reduce_raises_when_the_pass_holds_another_artifact_type():
    metric_set = MetricSet([metrics.psnr()])
    with pytest.raises(TypeError, match=r"metric 'psnr' reads Images, got TokenScores\."):
        metric_set.reduce(_batches(seed=10, count=1))


def test_stack_batches_adds_a_leading_batch_axis():
    batches = _batches(seed=11, count=4)
    stacked = stack_batches(batches)
    assert isinstance(stacked, TokenScores)
    assert stacked.losses.shape == (4, 3, 8)
    np.testing.assert_array_equal(np.asarray(stacked.correct[2]), np.asarray(batches[2].correct))
    with pytest.raises(ValueError, match="stack_batches needs at least one artifact"):
        stack_batches([])


# Compilation.


def test_second_pass_with_the_same_shapes_does_not_retrace():
    TRACES.clear()
    name = next(_TRACED_NAMES)  # a fresh name is a fresh compilation cache entry
    metric_set = MetricSet([metrics.perplexity(), TracedTokenCount(name=name)])
    first = _batches(seed=12, count=4, rows=2, positions=5)
    second = _batches(seed=13, count=6, rows=2, positions=5)

    reduced = metric_set.reduce(first)
    assert TRACES == [(2, 5)]  # one trace for the whole pass, not one per batch
    again = MetricSet([metrics.perplexity(), TracedTokenCount(name=name)]).reduce(second)
    assert TRACES == [(2, 5)]
    expected = sum(float(np.sum(np.asarray(b.weights, np.float64))) for b in second)
    assert float(again[name]) == pytest.approx(expected, rel=1e-6)
    assert float(reduced["perplexity"]) != float(again["perplexity"])

    metric_set.reduce(_batches(seed=14, count=2, rows=3, positions=5))  # a new shape traces
    assert TRACES == [(2, 5), (3, 5)]


def test_second_stacked_pass_with_the_same_shapes_does_not_retrace():
    TRACES.clear()
    metric_set = MetricSet([TracedTokenCount(name=next(_TRACED_NAMES)), metrics.mean_loss()])
    metric_set.reduce_stacked(stack_batches(_batches(seed=15, count=3, rows=2, positions=7)))
    assert TRACES == [(2, 7)]
    metric_set.reduce_stacked(stack_batches(_batches(seed=16, count=3, rows=2, positions=7)))
    assert TRACES == [(2, 7)]
    metric_set.reduce_stacked(stack_batches(_batches(seed=17, count=5, rows=2, positions=7)))
    assert TRACES == [(2, 7), (2, 7)]  # another number of batches is another scan


# vmap and user metrics.


def test_vmap_of_perplexity_statistics_over_stacked_batches():
    batches = _batches(seed=18, count=4)
    metric = metrics.perplexity()
    per_batch = jax.vmap(metric)(stack_batches(batches))
    state = metric.init()
    for index, batch in enumerate(batches):
        contribution = jax.tree.map(lambda leaf, i=index: leaf[i], per_batch)
        expected = metric(batch)
        for got, want in zip(jax.tree.leaves(contribution), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
        state = metric.merge(state, contribution)
    np.testing.assert_allclose(
        float(metric.finalize(state)), _eager_fold([metric], batches)["perplexity"], rtol=1e-6
    )


def test_user_metric_reduces_inside_a_metric_set():
    batches = _batches(seed=19)
    counted = np.concatenate([np.asarray(b.losses)[np.asarray(b.weights) != 0] for b in batches])
    metric_set = MetricSet(_all_metrics())
    assert float(metric_set.reduce(batches)["max_loss"]) == counted.max()
    assert float(metric_set.reduce_stacked(stack_batches(batches))["max_loss"]) == counted.max()


def test_user_metric_reads_only_its_artifact_type():
    images = Images(jnp.zeros((1, 4, 4, 1), jnp.float32))
    with pytest.raises(TypeError, match=r"metric 'max_loss' reads TokenScores, got Images\."):
        MaxLoss()(images)


def test_user_metric_obeys_the_metric_laws():
    check_metric_laws(MaxLoss(), token_scores(positions=8), max_examples=10)


def test_renamed_builtin_is_a_separate_metric_in_one_pass():
    batches = _batches(seed=20)
    scores = MetricSet([MeanLoss(), MeanLoss(name="mean_loss_again")]).reduce(batches)
    assert float(scores["mean_loss"]) == float(scores["mean_loss_again"])


@pytest.mark.parametrize("chunk", [None, 1, 3, 7, 64])
def test_reduce_stacked_gives_the_same_scores_for_every_chunk_size(chunk):
    batches = _batches(seed=21, count=7)  # 7 batches: chunks of 3 leave a remainder of 1
    metric_set = MetricSet([metrics.perplexity(), metrics.token_accuracy()])
    expected = metric_set.reduce(batches)
    scores = metric_set.reduce_stacked(stack_batches(batches), chunk=chunk)
    for name, value in expected.items():
        np.testing.assert_allclose(float(scores[name]), float(value), rtol=2e-6)


def test_reduce_stacked_refuses_a_bad_chunk():
    with pytest.raises(ValueError, match="chunk must be None or an integer >= 1, got 0"):
        MetricSet([metrics.perplexity()]).reduce_stacked(stack_batches(_batches(seed=22)), chunk=0)


# A set is itself a metric, so sets nest.


def _nested() -> MetricSet:
    return MetricSet(
        [
            metrics.token_accuracy(),
            MetricSet([MaxLoss(), MetricSet([metrics.perplexity()])]),
            MetricSet([]),
            metrics.mean_loss(),
        ]
    )


def test_a_metric_set_is_a_metric_over_the_tuple_of_its_states():
    nested = _nested()
    assert isinstance(nested, Metric)
    assert nested.artifact_type is TokenScores
    assert MetricSet([]).artifact_type is Artifact
    assert not nested.host
    assert MetricSet([MetricSet([HostMinLoss()])]).host
    assert MetricSet([metrics.ssim(), MetricSet([metrics.psnr()])]).scan_chunk == 4
    assert nested.names == MetricSet(_all_metrics()).names  # flattened, in order
    assert len(nested.init()) == 4 and nested.init()[2] == ()
    batch = _batches(seed=30, count=1)[0]
    assert jax.tree.structure(nested(batch)) == jax.tree.structure(nested.init())


def test_a_nested_set_scores_as_the_flat_set_of_its_metrics():
    batches = _batches(seed=31)
    expected = _eager_fold(_all_metrics(), batches)
    nested = _nested()
    state = nested.init()
    for batch in batches:
        state = nested.merge(state, nested(batch))
    for scores in (
        nested.finalize(state),
        nested.reduce(batches),
        nested.reduce_stacked(stack_batches(batches)),
    ):
        assert list(scores) == list(expected)
        assert _floats(scores) == pytest.approx(expected, rel=1e-6)


def test_a_nested_set_mixing_host_and_device_metrics_reduces_each_where_it_runs():
    metric_list = [metrics.mean_loss(), HostMinLoss(), MaxLoss()]
    nested = MetricSet([MetricSet(metric_list[:2]), MetricSet(metric_list[2:])])
    assert not nested.on_device
    device, host = nested.split_by_host()
    assert (device.names, host.names) == (("mean_loss", "max_loss"), ("host_min_loss",))
    batches = _batches(seed=32)
    scores = nested.reduce(batches)
    assert list(scores) == ["mean_loss", "host_min_loss", "max_loss"]
    assert _floats(scores) == pytest.approx(_eager_fold(metric_list, batches), rel=1e-6)
    with pytest.raises(ValueError, match=r"\['host_min_loss'\] are host metrics; use reduce"):
        nested.reduce_stacked(stack_batches(batches))


def test_duplicate_names_across_nested_sets_raise_naming_the_duplicate():
    message = (
        r"got \['perplexity'\] more than once \(a nested set's values are keyed by its "
        r"metrics' own names\); give one of them another name"
    )
    with pytest.raises(ValueError, match=message):
        MetricSet([MetricSet([metrics.perplexity()]), metrics.perplexity()])
    with pytest.raises(ValueError, match=message):
        MetricSet([MetricSet([metrics.perplexity()]), MetricSet([Perplexity()])])


def test_nested_sets_reading_different_artifact_types_are_refused():
    with pytest.raises(ValueError, match=r"these metrics read \['Images', 'TokenScores'\]"):
        MetricSet([MetricSet([metrics.perplexity()]), MetricSet([metrics.psnr()])])


def test_a_nested_set_names_the_metric_that_reads_another_artifact_type():
    nested = MetricSet([MetricSet([metrics.psnr()])])
    with pytest.raises(TypeError, match=r"metric 'psnr' reads Images, got TokenScores\."):
        nested.reduce(_batches(seed=33, count=1))


@settings(max_examples=10, deadline=None, database=None)
@given(passes=st.lists(token_scores(positions=8), max_size=4))
def test_a_nested_set_reduces_any_pass_as_the_flat_set(passes):
    flat = MetricSet(_all_metrics())
    expected = _floats(flat.reduce(passes))
    got = _floats(_nested().reduce(passes))
    assert list(got) == list(expected)
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-6)


def test_a_nested_set_obeys_the_metric_laws():
    # identity, associativity and batch-split invariance, through dew.testing's checker
    check_metric_laws(_nested(), token_scores(positions=8), max_examples=10)


# raise_if: how a finalize refuses statistics that have no value.


def test_raise_if_returns_the_value_or_raises_the_message_eagerly_and_compiled():
    value = jnp.asarray(2.0)
    assert metrics.raise_if(jnp.asarray(False), "no value", value) is value
    with pytest.raises(ValueError, match=r"^no value$"):
        metrics.raise_if(jnp.asarray(True), "no value", value)
    compiled = jax.jit(lambda bad: metrics.raise_if(bad, "no value", value))
    assert float(compiled(jnp.asarray(False))) == 2.0
    with pytest.raises(Exception, match="no value"):
        jax.block_until_ready(compiled(jnp.asarray(True)))
    assert not hasattr(metrics, "check_finalizable")
