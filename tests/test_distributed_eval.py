"""Evaluation under real `jax.distributed` (two local CPU processes, one launch): device
metrics over the global batch equal one process's on the joined batches, the coordinated
prefix and its counts, host metrics on process zero only, FID over both processes'
images, bad input and failing host metrics raising the same error on every process, and
previews gathered for process zero. The one-process references are computed here, from
the worker's own builders."""

import hashlib
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dist_eval_worker import (
    SEQ,
    ImagesObjective,
    LargestLoss,
    builtin_previews,
    features,
    image_shard,
    joined,
    labelled_shard,
    lm_metrics,
    lm_objective,
    text_shard,
)
from _multiprocess import TESTS, launch

from dew import evaluate, metrics
from dew._pass import preview_on_process_zero, run_pass
from dew.metrics import MetricSet
from dew.metrics._fid import FID
from dew.objectives.lm import LMObjective

pytestmark = pytest.mark.slow

KEY = jax.random.key(3)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    launch(TESTS / "_dist_eval_worker.py", 2, out, timeout=240)
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    arrays = [dict(np.load(out / f"rank{rank}.npz")) for rank in range(2)]
    return out, ranks, arrays


@pytest.fixture(scope="module")
def ranks(launched):
    return launched[1]


def same_everywhere(ranks, scenario):
    outcomes = [r[scenario] for r in ranks]
    assert outcomes[0] == outcomes[1] or _nan_equal(outcomes[0], outcomes[1]), outcomes
    return outcomes[0]


def _nan_equal(a, b):
    return json.dumps(a) == json.dumps(b)


def lm_reference(batches, extra=()):
    objective = lm_objective()
    return evaluate(
        objective,
        objective.init_params(),
        batches,
        metrics=[*lm_metrics(), *extra],
        key=KEY,
    )


def assert_scores(got, reference):
    assert sorted(got) == sorted(reference)
    for name, value in reference.items():
        assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_device_metrics_over_two_processes_equal_one_process_on_the_joined_batches(ranks):
    result = same_everywhere(ranks, "even")["value"]
    reference = lm_reference(joined([text_shard(0, 2), text_shard(1, 2)]))
    assert_scores(result["scores"], reference.scores)
    assert (result["coordinated_batches"], result["records"], result["uneven_shards"]) == (
        2,
        16,
        False,
    )
    assert reference.records == 16


def test_split_invariant_metrics_accumulate_on_each_device_with_no_collective_per_batch(ranks):
    # decision 0089: each device merges its own rows' statistics, the devices' accumulators
    # are merged once at the end; the scores are one process's on the joined batches (above)
    per_device = same_everywhere(ranks, "collectives")["value"]
    assert per_device["devices"] == 2
    assert sum(per_device[kind] for kind in per_device if kind != "devices") == 0, per_device
    # a device metric that declares no split invariance: one replicated accumulator, whose
    # statistics the compiled call reduces over both processes' rows
    mixed = same_everywhere(ranks, "collectives_mixed")["value"]
    assert mixed["devices"] == 0
    assert mixed["all-gather"] + mixed["all-reduce"] > 0, mixed
    result = same_everywhere(ranks, "mixed")["value"]
    batches = joined([text_shard(0, 3, seed=3), text_shard(1, 3, seed=3)])
    assert_scores(result["scores"], lm_reference(batches, (LargestLoss(),)).scores)


def test_uneven_shards_consume_the_shortest_prefix_and_say_so(ranks):
    result = same_everywhere(ranks, "uneven")["value"]
    prefix = joined([text_shard(0, 3), text_shard(1, 2)])  # the two coordinated batches
    assert_scores(result["scores"], lm_reference(prefix).scores)
    # process 0's third batch would have changed the scores had it entered them
    with_rest = lm_reference([*prefix, text_shard(0, 3)[2]])
    assert result["scores"]["perplexity"] != pytest.approx(with_rest.scores["perplexity"])
    assert (result["coordinated_batches"], result["records"], result["uneven_shards"]) == (
        2,
        16,
        True,
    )


@pytest.mark.parametrize(
    ("name", "counts", "coordinated", "uneven"),
    [("block", (8, 8), 8, False), ("block_and_one", (8, 9), 8, True), ("long", (12, 10), 10, True)],
)
def test_the_coordinated_prefix_is_the_same_past_a_block_of_agreed_batches(
    ranks, name, counts, coordinated, uneven
):
    """The processes read ahead and agree on blocks of 8 batches (decision 0088): the prefix
    they score is still the shortest shard's, whatever the block boundaries."""
    result = same_everywhere(ranks, f"uneven_{name}")["value"]
    shards = [text_shard(rank, count, seed=1) for rank, count in enumerate(counts)]
    assert_scores(result["scores"], lm_reference(joined(shards)).scores)
    assert (result["coordinated_batches"], result["records"], result["uneven_shards"]) == (
        coordinated,
        coordinated * 8,
        uneven,
    )


def test_failures_in_a_later_block_raise_on_every_process_naming_the_batch(ranks):
    bad = same_everywhere(ranks, "bad_batch_late")
    assert bad["error"] == "ValueError"
    assert bad["message"].startswith("checking validation batch 9 failed on process 1 of 2: ")
    assert "holds token ID 10 at row 0, position 1" in bad["message"]
    layout = same_everywhere(ranks, "layout_late")
    assert layout["error"] == "ValueError"
    assert layout["message"].startswith("validation batch 8 differs between the processes")
    assert f"process 1: ['text'] (8, {SEQ + 1}) int32" in layout["message"]
    assert same_everywhere(ranks, "read_fails_late") == {
        "error": "ValueError",
        "message": "reading a validation batch failed on process 1 of 2: the loader lost its "
        "file after 9 batches",
    }


def test_records_come_from_the_global_batch_and_scalar_metadata_adds_none(ranks):
    result = same_everywhere(ranks, "metadata")["value"]
    assert (result["coordinated_batches"], result["records"]) == (2, 16)
    assert_scores(result["scores"], same_everywhere(ranks, "even")["value"]["scores"])


def test_an_empty_coordinated_pass_returns_no_metric_values(ranks):
    assert same_everywhere(ranks, "empty") == {
        "value": {"scores": {}, "coordinated_batches": 0, "records": 0, "uneven_shards": True}
    }


def test_the_conditioning_identity_is_that_of_one_process_reading_the_global_batches(ranks):
    got = same_everywhere(ranks, "conditioning")["value"]
    batches = joined([labelled_shard(0), labelled_shard(1)])
    objective = lm_objective()
    result = run_pass(
        objective,
        objective.init_params(),
        batches,
        MetricSet(lm_metrics()),
        KEY,
        conditioning=lambda batch: batch["labels"],
    )
    labels = np.concatenate([batch["labels"] for batch in batches]).astype("<i8")
    assert got == result.conditioning_sha256 == hashlib.sha256(labels.tobytes()).hexdigest()


def test_host_metrics_run_on_process_zero_only_and_every_process_gets_their_values(launched):
    out, ranks, _ = launched
    result = same_everywhere(ranks, "host")["value"]
    # process zero updated the host metric once per batch, on the gathered NumPy artifact
    # of both processes' rows; process one never did
    assert (out / "host_updates_rank0.txt").read_text().splitlines() == ["ndarray 8"] * 2
    assert not (out / "host_updates_rank1.txt").exists()
    scores = result["scores"]
    reference = lm_reference(joined([text_shard(0, 2), text_shard(1, 2)]))
    assert scores["host_mean_loss"] == pytest.approx(reference.scores["mean_loss"], rel=1e-5)
    assert math.isnan(scores["nan"])
    assert scores["inf"] == math.inf and scores["minus_inf"] == -math.inf


def test_a_bad_batch_on_one_process_raises_the_same_value_error_on_every_process(ranks):
    outcome = same_everywhere(ranks, "bad_batch")
    assert outcome["error"] == "ValueError"
    assert outcome["message"].startswith("checking validation batch 1 failed on process 1 of 2: ")
    assert "holds token ID 9 at row 2, position 3" in outcome["message"]


def test_a_shard_failing_to_open_on_one_process_raises_on_every_process(ranks):
    assert same_everywhere(ranks, "shard_fails_to_open") == {
        "error": "ValueError",
        "message": "reading a validation batch failed on process 1 of 2: shard 1 of the "
        "validation split is missing",
    }


def test_batches_of_different_row_counts_raise_on_every_process(ranks):
    outcome = same_everywhere(ranks, "layout")
    assert outcome["error"] == "ValueError"
    assert (
        f"process 0: ['text'] (2, {SEQ + 1}) int32; process 1: ['text'] (4, {SEQ + 1}) int32"
        in outcome["message"]
    )


def test_a_pass_with_no_counted_target_raises_on_every_process(ranks):
    outcome = same_everywhere(ranks, "no_target")
    objective = LMObjective(lm_objective().model, seq_len=SEQ, pad_id=0)
    with pytest.raises(ValueError, match="no counted target") as raised:
        evaluate(
            objective,
            objective.init_params(),
            [{"text": np.zeros((8, SEQ + 1), np.int32)}],
            metrics=[metrics.perplexity()],
            key=KEY,
        )
    assert outcome == {"error": "ValueError", "message": str(raised.value)}


def test_a_host_metric_failing_on_process_zero_raises_on_every_process(ranks):
    assert same_everywhere(ranks, "host_fails_init") == {
        "error": "PhaseFailedError",
        "message": "starting the host metrics on process 0 failed on process 0 of 2: "
        "RuntimeError: the host metric's weights are missing",
    }
    update = same_everywhere(ranks, "host_fails_update")
    assert update == {
        "error": "PhaseFailedError",
        "message": "host metrics on process 0, batch 0 failed on process 0 of 2: "
        "RuntimeError: the host metric's kernel crashed",
    }
    finalize = same_everywhere(ranks, "host_fails_finalize")
    assert finalize == {
        "error": "ValueError",
        "message": "finalizing the host metrics on process 0 failed on process 0 of 2: "
        "constant cannot finalize this pass",
    }
    missing = same_everywhere(ranks, "fid_no_reference")
    assert missing["error"] == "ValueError"
    assert "the batch has no reference images" in missing["message"]
    # and the processes go on together afterwards
    assert same_everywhere(ranks, "after_failures") == same_everywhere(ranks, "even")


def test_fid_over_two_processes_equals_one_process_on_the_joined_images(ranks):
    result = same_everywhere(ranks, "fid")["value"]
    objective = ImagesObjective()
    reference = evaluate(
        objective,
        objective.init_params(),
        joined([image_shard(0, 2), image_shard(1, 2)]),
        metrics=[FID(features), metrics.psnr()],
        key=KEY,
    )
    assert result["scores"]["fid"] == pytest.approx(reference.scores["fid"], rel=1e-9)
    assert result["scores"]["psnr"] == pytest.approx(reference.scores["psnr"], rel=1e-5)
    assert (result["coordinated_batches"], result["records"]) == (2, 12)


def one_process_preview(objective, params, batches, metric_list):
    result = run_pass(
        objective, params, batches, MetricSet(metric_list), KEY, keep_first_artifact=True
    )
    return preview_on_process_zero(
        objective, params, result.first_batch, jax.random.fold_in(KEY, 11), result.first_artifact
    )


def test_a_preview_reaches_process_zero_alone_as_one_process_previews_it(launched):
    _, ranks, arrays = launched
    assert [r["lm_preview"] for r in ranks] == [{"value": True}, {"value": False}]
    assert "preview_tokens" not in arrays[1]
    objective = lm_objective()
    expected = one_process_preview(
        objective,
        objective.init_params(),
        joined([text_shard(0, 2), text_shard(1, 2)]),
        [metrics.perplexity()],
    )
    # six rows: process 0's four and process 1's first two
    np.testing.assert_array_equal(arrays[0]["preview_tokens"], np.asarray(expected.tokens))
    np.testing.assert_array_equal(arrays[0]["preview_mask"], np.asarray(expected.mask))
    assert [r["images_preview"] for r in ranks] == [{"value": True}, {"value": False}]
    images = ImagesObjective()
    scored = one_process_preview(
        images, images.init_params(), joined([image_shard(0, 1), image_shard(1, 1)]), []
    )
    np.testing.assert_allclose(arrays[0]["preview_generated"], np.asarray(scored.generated))


@pytest.mark.parametrize("name", ["diffusion", "masked_diffusion", "dpo"])
def test_built_in_previews_run_over_both_processes_as_one_process_runs_them(launched, name):
    _, ranks, arrays = launched
    assert [r[f"preview_{name}"] for r in ranks] == [{"value": True}, {"value": False}]
    objective, params, shard = builtin_previews()[name]
    first = jax.tree.map(jnp.asarray, joined([[shard(0)], [shard(1)]])[0])
    expected = one_process_preview(objective, params, [first], [])
    fields = {field: value for field, value in vars(expected).items() if hasattr(value, "shape")}
    assert sorted(f"{name}.{field}" for field in fields) == sorted(
        key for key in arrays[0] if key.startswith(f"{name}.")
    )
    assert not any(key.startswith(f"{name}.") for key in arrays[1])
    for field, value in fields.items():
        np.testing.assert_allclose(
            arrays[0][f"{name}.{field}"], np.asarray(value), rtol=1e-5, atol=1e-6, err_msg=field
        )


def test_every_process_keeps_the_first_artifact_when_one_asks_for_it(ranks):
    assert same_everywhere(ranks, "keep_on_zero_only") == {"value": [8, SEQ]}


def test_a_preview_failing_on_one_process_raises_on_every_process(ranks):
    assert same_everywhere(ranks, "preview_fails") == {
        "error": "ValueError",
        "message": "preview generation failed on process 1 of 2: no preview on process 1",
    }
