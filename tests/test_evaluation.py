"""dew.evaluate and dew.data: one pass, its scores and counts, determinism, bad input."""

import itertools
import traceback

import equinox as eqx
import jax
import numpy as np
import pytest
from _builders import tiny_lm_objective
from _checks import rejects

from dew import evaluate, metrics
from dew.artifacts import TokenScores
from dew.data import Dataset, Partition
from dew.evaluation import scoring_key
from dew.metrics import MetricSet
from dew.objectives.base import MissingBatchKeyError
from dew.objectives.lm import LMObjective


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective()


def _batches(seed, sizes=(8, 8, 3)):
    rng = np.random.default_rng(seed)
    return [{"text": rng.integers(0, 4, (rows, 9)).astype(np.int32)} for rows in sizes]


def test_scores_are_the_metrics_reduced_over_every_batch(objective):
    params = objective.init_params()
    batches = _batches(0)
    key = jax.random.key(5)
    chosen = [metrics.perplexity(), metrics.token_accuracy(), metrics.mean_loss()]
    result = evaluate(objective, params, batches, metrics=chosen, key=key, step=7)
    # One compilation, not the eager ops at two batch shapes.
    scored = jax.jit(lambda params, batch, key: objective.evaluate(params, batch, key))
    artifacts = [
        scored(params, batch, scoring_key(key, index)) for index, batch in enumerate(batches)
    ]
    expected = MetricSet(chosen).reduce(artifacts)
    assert list(result.scores) == ["perplexity", "token_accuracy", "mean_loss"]
    for name, value in expected.items():
        np.testing.assert_allclose(result.scores[name], float(value), rtol=1e-6)
    assert (result.coordinated_batches, result.records, result.uneven_shards, result.step) == (
        3,
        19,
        False,
        7,
    )
    np.testing.assert_allclose(
        np.log(result.scores["perplexity"]), result.scores["mean_loss"], rtol=1e-5
    )


class _HostCount(metrics.Metric[TokenScores]):
    """A host metric: the counted targets of the pass, in a float64 NumPy scalar."""

    artifact_type = TokenScores
    host = True
    name: str = eqx.field(static=True, default="host_counted")

    def init(self):
        return np.zeros(())

    def statistics(self, artifact):
        return np.asarray(np.sum(np.asarray(artifact.weights, np.float64)))

    def merge(self, accumulated, contribution):
        return accumulated + contribution

    def finalize(self, accumulated):
        return float(accumulated)


def test_a_metric_set_goes_where_a_metric_goes_and_scores_as_the_flat_set(objective):
    params, key, batches = objective.init_params(), jax.random.key(6), _batches(2)
    flat = [metrics.perplexity(), _HostCount(), metrics.token_accuracy(), metrics.mean_loss()]
    expected = evaluate(objective, params, batches, metrics=flat, key=key).scores
    assert list(expected) == ["perplexity", "host_counted", "token_accuracy", "mean_loss"]
    assert expected["host_counted"] == 19 * 8
    for chosen in (
        (MetricSet(flat),),
        (MetricSet(flat[:2]), MetricSet([MetricSet(flat[2:3]), flat[3]])),
        (flat[0], MetricSet([flat[1], MetricSet([]), MetricSet(flat[2:])])),
    ):
        result = evaluate(objective, params, batches, metrics=chosen, key=key)
        assert result.scores == expected
        assert (result.coordinated_batches, result.records) == (3, 19)


def test_a_dataset_split_is_read_through_its_partition(objective):
    seen = []
    batches = _batches(1)

    def val(partition):
        seen.append(partition)
        return iter(batches)

    data = Dataset(train=lambda partition: itertools.repeat(batches[0]), val=val)
    result = evaluate(
        objective,
        objective.init_params(),
        data.val,
        metrics=[metrics.perplexity()],
        key=jax.random.key(0),
    )
    assert seen == [Partition(0, 1)]
    assert result.coordinated_batches == 3


def test_the_same_inputs_give_the_same_scores(objective):
    params = objective.init_params()
    run = lambda: evaluate(  # noqa: E731
        objective, params, _batches(2), metrics=[metrics.perplexity()], key=jax.random.key(1)
    )
    assert run() == run()


def test_an_empty_pass_returns_no_scores(objective):
    result = evaluate(
        objective,
        objective.init_params(),
        [],
        metrics=[metrics.perplexity()],
        key=jax.random.key(0),
    )
    assert result.scores == {}
    assert (result.coordinated_batches, result.records) == (0, 0)


class _Unscorable(LMObjective):
    def evaluate(self, params, batch, key):
        raise AssertionError("scoring ran although no metric asked for it")


def test_without_metrics_the_scoring_work_is_skipped(objective):
    silent = _Unscorable(objective.model, seq_len=8)
    result = evaluate(silent, silent.init_params(), _batches(3), metrics=(), key=jax.random.key(0))
    assert result.scores == {}
    assert (result.coordinated_batches, result.records) == (3, 19)


def test_a_pass_with_no_counted_target_raises(objective):
    padded = LMObjective(objective.model, seq_len=8, pad_id=0)
    batches = [{"text": np.zeros((2, 9), np.int32)}]
    with pytest.raises(ValueError, match="'perplexity': the pass has token positions but no"):
        evaluate(
            padded,
            padded.init_params(),
            batches,
            metrics=[metrics.perplexity()],
            key=jax.random.key(0),
        )


def test_a_validation_batch_without_the_objectives_keys_fails_before_compiling(objective):
    batches = [{"tokens": batch["text"]} for batch in _batches(2)]
    with pytest.raises(MissingBatchKeyError) as caught:
        evaluate(
            objective,
            objective.init_params(),
            batches,
            metrics=[metrics.perplexity()],
            key=jax.random.key(0),
        )
    assert str(caught.value) == "LMObjective reads batch key 'text', but the batch has 'tokens'."
    assert not getattr(caught.value, "__notes__", ())  # raised on the host, not in a trace


def test_duplicate_metric_names_in_a_pass_raise(objective):
    with pytest.raises(ValueError, match="metric names must be unique within a pass"):
        evaluate(
            objective,
            objective.init_params(),
            _batches(4),
            metrics=[metrics.perplexity(), metrics.perplexity()],
            key=jax.random.key(0),
        )


def test_the_objective_returns_token_scores_for_the_metrics(objective):
    artifact = objective.evaluate(objective.init_params(), _batches(5)[0], jax.random.key(0))
    assert isinstance(artifact, TokenScores)


@pytest.mark.parametrize(
    ("kwargs", "error", "message", "parameter"),
    [
        ({"train": [1, 2]}, TypeError, "Dataset.train must be a callable of a Partition", "train"),
        ({"val": "batches"}, TypeError, "Dataset.val must be a callable", "val"),
        ({"records": 0}, ValueError, "Dataset.records must be None or an integer >= 1", "records"),
        ({"batch": 2.5}, ValueError, "Dataset.batch must be None or an integer >= 1", "batch"),
        (
            {"classes": ["a", "b"]},
            TypeError,
            "Dataset.classes must be a non-empty tuple",
            "classes",
        ),
        ({"classes": ()}, TypeError, "Dataset.classes must be a non-empty tuple", "classes"),
        ({"classes": ("a", "b", "a")}, ValueError, "Dataset.classes names 'a' twice", "classes"),
    ],
)
def test_bad_datasets_raise(kwargs, error, message, parameter):
    fields = {"train": lambda partition: iter([])} | kwargs
    with rejects(error, message, parameter=parameter):
        Dataset(**fields)


def test_bad_partitions_raise():
    with pytest.raises(ValueError, match="Partition needs 0 <= index < count, got index 2"):
        Partition(2, 2)
    assert Partition.current() == Partition(0, 1)


def test_scalar_metadata_in_a_batch_adds_no_rows(objective):
    batches = [{"epoch": 3, "text": rows["text"]} for rows in _batches(6)]
    result = evaluate(
        objective, objective.init_params(), batches, metrics=(), key=jax.random.key(0)
    )
    assert result.records == 19


def test_out_of_vocabulary_ids_raise_the_host_check_not_jax_noise(objective):
    batches = _batches(3)
    batches[1]["text"][2, 6] = 9
    with pytest.raises(ValueError, match="token ID 9") as caught:
        evaluate(
            objective,
            objective.init_params(),
            batches,
            metrics=[metrics.perplexity()],
            key=jax.random.key(0),
        )
    assert str(caught.value) == (
        "LMObjective: batch['text'] holds token ID 9 at row 2, position 6; "
        "valid IDs are 0 to 3 (vocab_size=4)."
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    shown = "".join(traceback.format_exception(caught.value))
    for noise in ("EquinoxRuntimeError", "JaxRuntimeError", "CpuCallback", "filter_jit"):
        assert noise not in shown, shown
