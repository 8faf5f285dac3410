"""Multi-process runs through the `dew` command and the sweep driver, with real
`jax.distributed` processes on one machine: the sweep's broadcast of process zero's trials
(one launch of tests/_dist_cli_sweep_worker.py), and `dew train/eval/sweep --processes 2`."""

import json
import pathlib

import pytest
from _multiprocess import launch

pytestmark = pytest.mark.slow

TESTS = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep-driver")
    launch(TESTS / "_dist_cli_sweep_worker.py", 2, out, timeout=180)
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    return out, ranks


def test_every_process_trains_process_zero_s_trials_in_order(driver):
    _, (zero, one) = driver
    names = [f"grid/trial-{index}" for index in range(3)]
    assert (
        zero["grid_trained"]
        == one["grid_trained"]
        == [[name, rate] for name, rate in zip(names, (0.1, 0.2, 0.3), strict=True)]
    )
    # Every process returns process zero's trials, with process zero's scores.
    expected = [
        [index, {"optim.learning_rate": rate}, rate * 10]
        for index, rate in enumerate((0.1, 0.2, 0.3))
    ]
    assert zero["grid"] == one["grid"] == {"value": expected}
    # Only process zero reports to its tracker.
    assert [step for step, _ in zero["grid_reported"]] == [0, 1, 2]
    assert one["grid_reported"] == []


def test_only_process_zero_owns_the_ledger(driver):
    out, _ = driver
    ledger = json.loads((out / "rank0" / "grid" / "ledger.json").read_text())
    assert [entry["index"] for entry in ledger["trials"]] == [0, 1, 2]
    assert [entry["value"] for entry in ledger["trials"]] == [1.0, 2.0, 3.0]
    assert ledger["running"] == []
    assert not (out / "rank1").exists()  # process 1 wrote no ledger, no lock file


def test_process_zero_s_search_decides_the_points(driver):
    _, (zero, one) = driver
    assert zero["random_trained"] == one["random_trained"]
    assert len(zero["random_trained"]) == 3
    assert zero["random"] == one["random"]
    assert [trial[0] for trial in zero["random"]["value"]] == [0, 1, 2]


def test_a_trial_failing_on_one_process_raises_on_every_process(driver):
    _, (zero, one) = driver
    message = "training trial 1 failed on process 1 of 2: process 1 cannot train grid/trial-1"
    assert zero["failing"] == one["failing"] == {"error": "ValueError", "message": message}
    assert zero["failing_trained"] == one["failing_trained"]
    assert [name for name, _ in zero["failing_trained"]] == ["grid/trial-0", "grid/trial-1"]


def test_a_rerun_retrains_the_cut_off_trial_first(driver):
    out, (zero, one) = driver
    assert [name for name, _ in zero["resumed_trained"]] == ["grid/trial-1", "grid/trial-2"]
    assert zero["resumed_trained"] == one["resumed_trained"]
    assert zero["resumed"] == one["resumed"]
    assert [trial[0] for trial in zero["resumed"]["value"]] == [0, 1, 2]
    ledger = json.loads((out / "rank0" / "failing" / "ledger.json").read_text())
    assert ledger["running"] == []
