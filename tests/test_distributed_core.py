"""The process primitives under real `jax.distributed` (two, and four, local CPU processes,
one launch each): agree_process_phase, broadcast_json, coordinated prefixes, global batches
and collective_host, with one process failing on purpose: every process raises the same
clear error and none hangs (the launcher's deadline would fail the test)."""

import json

import pytest
from _multiprocess import TESTS, launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[2, 4], ids=["2-processes", "4-processes"])
def ranks(request, tmp_path_factory):
    count = request.param
    out = tmp_path_factory.mktemp(f"core{count}")
    launch(TESTS / "_dist_core_worker.py", count, out, timeout=180)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(count)]


def _same_everywhere(ranks, scenario):
    """The scenario's outcome, checked to be the same on every process."""
    outcomes = [r[scenario] for r in ranks]
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    return outcomes[0]


def test_each_process_knows_its_place(ranks):
    count = len(ranks)
    assert [(r["process_index"], r["process_count"]) for r in ranks] == [
        (rank, count) for rank in range(count)
    ]


def test_agreement_passes_when_every_process_is_fine(ranks):
    assert _same_everywhere(ranks, "agree_ok") == {"value": None}


def test_a_value_error_on_one_process_raises_the_same_value_error_everywhere(ranks):
    assert _same_everywhere(ranks, "agree_value_error") == {
        "error": "ValueError",
        "message": f"checking a batch failed on process 1 of {len(ranks)}: token id 7 is "
        "outside the vocabulary",
    }


def test_an_os_error_is_bad_input_too_and_names_its_path_first(ranks):
    # A path, a file in the way, a folder another run holds: the user's, as a ValueError.
    assert _same_everywhere(ranks, "agree_os_error") == {
        "error": "ValueError",
        "message": f"locking failed on process 0 of {len(ranks)}: runs/x: the run folder is in "
        "use by process 7",
    }


def test_another_error_raises_phase_failed_everywhere(ranks):
    assert _same_everywhere(ranks, "agree_other_error") == {
        "error": "PhaseFailedError",
        "message": f"setup failed on process 0 of {len(ranks)}: RuntimeError: disk full",
    }
    others = ", ".join(str(rank) for rank in range(1, len(ranks)))
    assert _same_everywhere(ranks, "agree_false_everywhere")["message"] == (
        f"both failed on process 0 of {len(ranks)} (and on process {others}): failed"
    )


def test_broadcast_gives_process_zeros_value(ranks):
    assert _same_everywhere(ranks, "broadcast") == {"value": {"trial": 3, "rank": 0}}


def test_coordinated_batches_stop_at_the_shortest_shard(ranks):
    # every process: 2 batches; process 0: 3, the others 1; process 1: none, the others 2
    even = [r["coordinated_even"]["value"] for r in ranks]
    assert even == [
        {"seen": [10.0 * rank, 10.0 * rank + 1], "uneven": False} for rank in range(len(ranks))
    ]
    uneven = [r["coordinated_uneven"]["value"] for r in ranks]
    assert uneven == [{"seen": [10.0 * rank], "uneven": True} for rank in range(len(ranks))]
    empty = [r["coordinated_empty_here"]["value"] for r in ranks]
    assert empty == [{"seen": [], "uneven": True}] * len(ranks)


def test_a_failing_loader_on_one_process_raises_on_every_process(ranks):
    assert _same_everywhere(ranks, "coordinated_loader_fails") == {
        "error": "PhaseFailedError",
        "message": f"reading a validation batch failed on process 1 of {len(ranks)}: "
        "OSError: the shard file vanished",
    }


def test_a_global_batch_joins_the_processes_rows_in_order(ranks):
    value = _same_everywhere(ranks, "global_batch")["value"]
    rows = [
        [100.0 * rank + 3 * row + column for column in range(3)]
        for rank in range(len(ranks))
        for row in range(2)
    ]
    assert value["shape"] == [2 * len(ranks), 3]
    assert value["gathered"] == rows
    assert value["total"] == pytest.approx(2.0 * sum(map(sum, rows)))


def test_process_local_rows_are_joined_in_process_order(ranks):
    # process r holds r + 1 rows of r: the gather pads them to one shape and trims them back
    expected = [[float(rank)] * 2 for rank in range(len(ranks)) for _ in range(rank + 1)]
    assert _same_everywhere(ranks, "local_rows") == {"value": expected}


def test_collective_host_failures_raise_on_every_process(ranks):
    deleted = _same_everywhere(ranks, "deleted_on_one")
    assert deleted["error"] == "ValueError"
    assert deleted["message"].startswith(
        f"collective_host(Images): local conversions failed on process 1 of {len(ranks)}: "
        "field .generated"
    )
    plan = _same_everywhere(ranks, "plan_differs")
    assert plan["error"] == "ValueError"
    others = ", ".join(str(rank) for rank in range(1, len(ranks)))
    assert f"process {others} holds an artifact whose fields" in plan["message"]
    assert _same_everywhere(ranks, "transfer_fails") == {
        "error": "PhaseFailedError",
        "message": "collective_host(Images): transfer of .reference failed on process 1 of "
        f"{len(ranks)}: MemoryError: no room for the reference images",
    }


def test_the_processes_are_still_in_step_after_the_failures(ranks):
    assert _same_everywhere(ranks, "after_failures") == {"value": "still in step"}
    assert ranks[0]["plain_host_on_zero"] == {"value": [1, 2, 2, 3]}
