"""`Trainer.fit` under real `jax.distributed` (two local CPU processes): equal params on
every process and equal to one process on the concatenated batches (replicated, sharded
params, fused steps), tracking, previews and printing on process zero only, validation
events with a host metric computed on process zero alone and the prefix counts printed, a
first-batch row mismatch raising the same error everywhere, and resume after a
multi-process checkpoint.
Two launches: `main` (every scenario) and `resume` (continues `main`'s checkpoint)."""

import json

import _dist_train_worker as worker
import jax
import numpy as np
import pytest
from _multiprocess import TESTS, launch

from dew import metrics
from dew.data import Dataset, tokens

pytestmark = pytest.mark.slow

WORKER = TESTS / "_dist_train_worker.py"


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dist-train")
    np.save(folder / "tokens.npy", worker.token_ids())
    return folder


@pytest.fixture(scope="module")
def main(out):
    outputs = [text for _, text in launch(WORKER, 2, out, ["main"], timeout=180)]
    ranks = [json.loads((out / f"main-rank{rank}.json").read_text()) for rank in range(2)]
    return ranks, outputs


@pytest.fixture(scope="module")
def resumed(main, out):
    outputs = [text for _, text in launch(WORKER, 2, out, ["resume"], timeout=180)]
    ranks = [json.loads((out / f"resume-rank{rank}.json").read_text()) for rank in range(2)]
    return ranks, outputs


@pytest.fixture(scope="module")
def reference():
    """One process trained on the concatenated batches (process 0's rows, then process 1's)."""
    val = [
        {"text": np.concatenate([batch["text"] for batch in batches])}
        for batches in zip(worker.val_batches(0), worker.val_batches(1), strict=True)
    ]
    data = Dataset(
        train=lambda partition: worker.concatenated_batches(2), val=lambda partition: iter(val)
    )
    state = worker.trainer().fit(
        data,
        worker.STEPS,
        log_every=3,
        eval_every=3,
        metrics=[metrics.perplexity()],
        progress=False,
    )
    return [np.asarray(leaf) for leaf in jax.tree.leaves(state.params)], state


def params(out, scenario, rank):
    with np.load(out / f"{scenario}-rank{rank}.npz") as saved:
        return [saved[name] for name in saved.files if name != "step"], int(saved["step"])


SCENARIOS = ["replicated", "sharded", "fused"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_trained_params_are_bitwise_equal_on_every_process(main, out, scenario):
    (zero, step0), (one, step1) = params(out, scenario, 0), params(out, scenario, 1)
    assert step0 == step1 == worker.STEPS
    assert len(zero) == len(one) > 0
    for a, b in zip(zero, one, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_params_equal_one_process_on_the_concatenated_batches(main, out, reference, scenario):
    expected, _ = reference
    trained, _ = params(out, scenario, 0)
    assert len(trained) == len(expected)
    moved = False
    initial = [np.asarray(leaf) for leaf in jax.tree.leaves(worker.objective().init_params())]
    for got, want, start in zip(trained, expected, initial, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        moved = moved or not np.allclose(want, start, rtol=0, atol=1e-4)
    assert moved  # the comparison is not between two untrained models


def test_the_loss_every_process_reads_is_the_global_batchs(main, reference):
    ranks, _ = main
    _, state = reference
    assert ranks[0]["history"] == ranks[1]["history"]
    for tag, series in state.metric_history.items():
        got = ranks[0]["history"][tag]
        assert [step for step, _ in got] == [step for step, _ in series] == [3, 6]
        np.testing.assert_allclose([v for _, v in got], [v for _, v in series], rtol=1e-5)


def test_validation_scores_the_global_batches_with_host_metrics_on_process_zero(main, out):
    ranks, outputs = main
    history = ranks[0]["history"]
    perplexity = [value for _, value in history["lm/validation/perplexity"]]
    host_loss = [value for _, value in history["lm/validation/host_mean_loss"]]
    # the host metric (NumPy, process zero) and the device metric agree on the same rows
    np.testing.assert_allclose(np.exp(host_loss), perplexity, rtol=1e-5)
    assert [p.name for p in sorted(out.glob("host_updates_rank*"))] == ["host_updates_rank0.txt"]
    # process zero's host metric saw both processes' rows: 2 batches x 2 events of 8 rows
    assert (out / "host_updates_rank0.txt").read_text().split() == ["8"] * 4
    counts = "evaluation/coordinated_batches 2  evaluation/records 16  evaluation/uneven_shards"
    assert outputs[0].count(f"{counts} False  event key ") == 2
    assert "evaluation/" not in outputs[1]


def test_uneven_validation_shards_are_reported_and_early_stopping_stops_every_process(main):
    ranks, outputs = main
    assert "evaluation/uneven_shards True  event key " in outputs[0]
    assert ranks[0]["uneven_history"] == ranks[1]["uneven_history"]
    assert [step for step, _ in ranks[0]["uneven_history"]["lm/validation/perplexity"]] == [1, 2]
    assert ranks[0]["stopped_at"] == ranks[1]["stopped_at"] == 2


def test_a_bad_batch_or_a_failing_loader_on_one_process_raises_on_every_process(main):
    ranks, _ = main
    token = [r["bad_token"] for r in ranks]
    assert token[0] == token[1]
    assert token[0]["error"] == "ValueError"
    assert token[0]["message"].startswith(
        "reading the training batch of step 2 failed on process 1 of 2: "
    )
    assert "token ID 99" in token[0]["message"]
    loader = [r["bad_loader"] for r in ranks]
    assert (
        loader[0]
        == loader[1]
        == {
            "error": "PhaseFailedError",
            "message": "reading the training batch of step 2 failed on process 0 of 2: "
            "OSError: the shard file vanished",
        }
    )


def test_a_non_finite_loss_raises_the_same_error_on_every_process(main):
    ranks, _ = main
    outcomes = [r["nonfinite"] for r in ranks]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["error"] == "NonFiniteTrainingError"
    assert outcomes[0]["message"].startswith("training loss is nan at step 2 (finite at step 1")


def test_a_user_param_sharding_keeps_the_params_sharded(main):
    ranks, _ = main
    assert ranks[0]["sharded_leaves"] == ranks[1]["sharded_leaves"] > 0


def test_one_compiled_step_serves_every_step(main):
    ranks, _ = main
    for rank in ranks:  # the step's outputs keep the placed shardings: no recompilation
        assert rank["step_compilations"] == rank["sharded_step_compilations"] == 1


def test_only_process_zero_writes_tracking_output_and_prints(main, out):
    ranks, outputs = main
    assert ranks[1]["calls_on_other_process"] == []  # its tracker was dropped, never called
    journal = [
        json.loads(line) for line in (out / "local" / "scalars.jsonl").read_text().splitlines()
    ]
    assert [entry["step"] for entry in journal] == [3, 3, 6, 6]
    records = [
        json.loads(line)["name"]
        for line in (out / "local" / "records.jsonl").read_text().splitlines()
    ]
    previews = "lm/validation/samples"
    assert records == ["fit_started", previews, previews, "fit_ended"]  # previews at 3, 6
    assert len(list((out / "tb").iterdir())) == 1  # one event file
    assert "step 3  lm/train/loss" in outputs[0]
    assert "lm/train/loss" not in outputs[1]


def test_user_event_sinks_run_on_every_process(main):
    ranks, _ = main
    expected = [["step_end", 3], ["validation_end", 3], ["step_end", 6], ["validation_end", 6]]
    assert ranks[0]["events"] == ranks[1]["events"] == expected


def test_a_first_batch_row_mismatch_raises_the_same_error_on_every_process(main):
    ranks, _ = main
    outcomes = [r["row_mismatch"] for r in ranks]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["error"] == "ValueError"
    assert "process 0: 4 rows, process 1: 2 rows" in outcomes[0]["message"]


def test_steps_past_the_batches_agreed_at_once_train_as_one_process(main, out):
    """Every process draws the batches of 8 steps ahead and agrees on them in one exchange
    (decision 0088), later blocks as many steps as `_AHEAD_BYTES` of batches (decision
    0090), never past the fit's last step: a fit crossing those blocks, one step and four
    steps per call, trains as one process on the concatenated batches."""
    for rank in main[0]:  # 5 steps; then steps 6-13, 14-23, 24-30
        assert rank["long_blocks"] == [5, 8, worker.LATER_BLOCK, 7]
    data = Dataset(train=lambda partition: worker.concatenated_batches(2))
    state = worker.trainer().fit(data, 5, log_every=5, progress=False)
    state = worker.trainer().fit(
        data, worker.LONG_STEPS, log_every=4, steps_per_call=4, state=state, progress=False
    )
    (zero, step0), (one, _) = params(out, "long", 0), params(out, "long", 1)
    assert step0 == worker.LONG_STEPS
    for got, other, want in zip(zero, one, jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(got, other)
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)


def test_a_bad_batch_drawn_ahead_raises_on_every_process_naming_its_step(main):
    """A bad batch drawn in a block ahead raises when its step comes, as checking step by
    step would: the steps before it run on every process (decision 0090)."""
    ranks, _ = main
    for rank in ranks:
        assert rank["late_rows_steps"] == list(range(1, 10))  # step 10's rows differ
        assert rank["late_token_steps"] == list(range(1, 11))  # step 11 holds token 77
    rows = [r["late_rows"] for r in ranks]
    assert rows[0] == rows[1]
    assert rows[0]["error"] == "ValueError"
    assert rows[0]["message"].startswith(
        "the processes' training batches of step 10 differ in rows (process 0: 4 rows, "
        "process 1: 2 rows)"
    )
    token = [r["late_token"] for r in ranks]
    assert token[0] == token[1]
    assert token[0]["message"].startswith(
        "reading the training batch of step 11 failed on process 1 of 2: "
    )
    assert "token ID 77" in token[0]["message"]


def test_a_multi_process_checkpoint_resumes_as_in_one_process(main, resumed, out):
    ranks, outputs = resumed
    assert main[0][0]["checkpointed_step"] == worker.CHECKPOINT_AT
    assert f"resuming at step {worker.CHECKPOINT_AT}" in outputs[0]
    assert "resuming" not in outputs[1]
    uninterrupted, _ = params(out, "replicated", 0)
    for rank in range(2):
        got, step = params(out, "resumed", rank)
        assert step == worker.STEPS
        for a, b in zip(got, uninterrupted, strict=True):
            assert a.tobytes() == b.tobytes()  # the same steps on the same batches
    history = ranks[0]["history"]
    assert ranks[1]["history"] == history
    assert [step for step, _ in history["lm/train/loss"]] == [2, 4, 6]
    for step in (2, 4, 6):  # one copy of the JSON item, written by process zero
        assert sorted(p.name for p in (out / "checkpoints" / str(step) / "extra").iterdir()) == [
            "commit_success.txt",
            "metadata",
        ]


def test_a_token_file_trains_on_the_same_global_batches_as_one_process(main, out):
    """dew.data.tokens read by step: two processes of ROWS rows train as one process of
    2 * ROWS rows (the global batch of each step is one order's, sliced per process)."""
    data = tokens(
        out / "tokens.npy", seq_len=8, batch=2 * worker.ROWS, vocab_size=8, seed=worker.TOKEN_SEED
    )
    state = worker.trainer().fit(data, worker.STEPS, log_every=3, progress=False)
    expected = [np.asarray(leaf) for leaf in jax.tree.leaves(state.params)]
    (zero, step0), (one, step1) = params(out, "tokens", 0), params(out, "tokens", 1)
    assert step0 == step1 == worker.STEPS
    for a, b in zip(zero, one, strict=True):
        assert a.tobytes() == b.tobytes()
    initial = [np.asarray(leaf) for leaf in jax.tree.leaves(worker.objective().init_params())]
    moved = False
    for got, want, start in zip(zero, expected, initial, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        moved = moved or not np.allclose(want, start, rtol=0, atol=1e-4)
    assert moved


def test_processes_reading_different_orders_raise_the_same_error(main):
    ranks, _ = main
    outcomes = [r["order_mismatch"] for r in ranks]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["error"] == "ValueError"
    assert outcomes[0]["message"].startswith(
        "the processes' step-indexed training data differ (fingerprints of the rows, seed and "
        "batch: process 0: "
    )
