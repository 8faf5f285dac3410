"""The process primitives under real `jax.distributed` (two local CPU processes, one
launch): agree_process_phase, broadcast_json, coordinated prefixes, global batches and
collective_host, with one process failing on purpose: every process raises the same
clear error and none hangs (the launcher's deadline would fail the test)."""

import json

import pytest
from _multiprocess import TESTS, launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("core")
    launch(TESTS / "_dist_core_worker.py", 2, out, timeout=180)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_each_process_knows_its_place(ranks):
    assert [(r["process_index"], r["process_count"]) for r in ranks] == [(0, 2), (1, 2)]


def test_agreement_passes_when_every_process_is_fine(ranks):
    assert [r["agree_ok"] for r in ranks] == [{"value": None}] * 2


def test_a_value_error_on_one_process_raises_the_same_value_error_everywhere(ranks):
    outcomes = [r["agree_value_error"] for r in ranks]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["error"] == "ValueError"
    assert outcomes[0]["message"] == (
        "checking a batch failed on process 1 of 2: token id 7 is outside the vocabulary"
    )


def test_another_error_raises_phase_failed_everywhere(ranks):
    outcomes = [r["agree_other_error"] for r in ranks]
    assert (
        outcomes[0]
        == outcomes[1]
        == {
            "error": "PhaseFailedError",
            "message": "setup failed on process 0 of 2: RuntimeError: disk full",
        }
    )
    both = ranks[0]["agree_false_everywhere"]
    assert both["message"] == "both failed on process 0 of 2 (and on process 1): failed"


def test_broadcast_gives_process_zeros_value(ranks):
    assert [r["broadcast"] for r in ranks] == [{"value": {"trial": 3, "rank": 0}}] * 2


def test_coordinated_batches_stop_at_the_shortest_shard(ranks):
    even = [r["coordinated_even"]["value"] for r in ranks]
    assert even == [{"seen": [0.0, 1.0], "uneven": False}, {"seen": [10.0, 11.0], "uneven": False}]
    uneven = [r["coordinated_uneven"]["value"] for r in ranks]
    assert uneven == [{"seen": [0.0], "uneven": True}, {"seen": [10.0], "uneven": True}]
    empty = [r["coordinated_empty_here"]["value"] for r in ranks]
    assert empty == [{"seen": [], "uneven": True}, {"seen": [], "uneven": True}]


def test_a_failing_loader_on_one_process_raises_on_both(ranks):
    outcomes = [r["coordinated_loader_fails"] for r in ranks]
    assert (
        outcomes[0]
        == outcomes[1]
        == {
            "error": "PhaseFailedError",
            "message": "reading a validation batch failed on process 1 of 2: "
            "OSError: the shard file vanished",
        }
    )


def test_a_global_batch_joins_the_processes_rows_in_order(ranks):
    values = [r["global_batch"]["value"] for r in ranks]
    assert values[0] == values[1]
    assert values[0]["shape"] == [4, 3]
    rows = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [100.0, 101.0, 102.0], [103.0, 104.0, 105.0]]
    assert values[0]["gathered"] == rows
    assert values[0]["total"] == pytest.approx(2.0 * sum(map(sum, rows)))


def test_process_local_rows_are_joined_in_process_order(ranks):
    assert [r["local_rows"] for r in ranks] == [{"value": [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]}] * 2


def test_collective_host_failures_raise_on_every_process(ranks):
    deleted = [r["deleted_on_one"] for r in ranks]
    assert deleted[0] == deleted[1]
    assert deleted[0]["error"] == "ValueError"
    assert deleted[0]["message"].startswith(
        "collective_host(Images): local conversions failed on process 1 of 2: field .generated"
    )
    plan = [r["plan_differs"] for r in ranks]
    assert plan[0] == plan[1] and plan[0]["error"] == "ValueError"
    assert "process 1 holds an artifact whose fields" in plan[0]["message"]
    transfer = [r["transfer_fails"] for r in ranks]
    assert (
        transfer[0]
        == transfer[1]
        == {
            "error": "PhaseFailedError",
            "message": "collective_host(Images): transfer of .reference failed on process 1 of 2: "
            "MemoryError: no room for the reference images",
        }
    )


def test_the_processes_are_still_in_step_after_the_failures(ranks):
    assert [r["after_failures"] for r in ranks] == [{"value": "still in step"}] * 2
    assert ranks[0]["plain_host_on_zero"] == {"value": [1, 2, 2, 3]}
