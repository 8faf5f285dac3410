"""Decision 0089 on 4 devices of one process: the global-array pass `jax.distributed` uses keeps
an accumulator on each device when every device metric declares `split_invariant`, with no
collective in its compiled call per batch, and scores what one device scores on the same
batches; an artifact whose rows the devices cannot split evenly, and a metric that does not
declare the property, take the one-accumulator way to the same scores."""

import jax
import pytest
from _dist_eval_worker import LargestLoss, lm_metrics, lm_objective
from _multiprocess import run_on_devices
from _per_device_worker import ExtraRow, batches

from dew import evaluate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("per_device") / "results.json"
    return run_on_devices("_per_device_worker.py", 4, out)


def _reference(objective, extra=()):
    return evaluate(
        objective,
        objective.init_params(),
        batches(),
        metrics=[*lm_metrics(), *extra],
        key=jax.random.key(3),
    ).scores


@pytest.mark.parametrize(
    ("case", "devices", "collectives"),
    [("even", 4, False), ("extra_row", 4, True), ("mixed", 0, True)],
)
def test_a_pass_over_four_devices_scores_what_one_device_scores(
    four_devices, case, devices, collectives
):
    result = four_devices[case]
    assert result["devices"] == devices
    assert (result["collectives"] > 0) == collectives, result
    lm = lm_objective()
    objective = ExtraRow(lm) if case == "extra_row" else lm
    reference = _reference(objective, (LargestLoss(),) if case == "mixed" else ())
    assert sorted(result["scores"]) == sorted(reference)
    for name, value in reference.items():
        assert result["scores"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
