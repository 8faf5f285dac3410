"""examples/tensorboard_tracker.py: run as a script, read back with TensorBoard's reader."""

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from dew.tracking import Tracker

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tensorboard_tracker.py"


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_the_example_writes_stage_split_metric_tags_to_one_event_file(tmp_path):
    logdir = tmp_path / "events"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), str(logdir)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "['supervised/train/loss', 'supervised/validation/loss']",
        f"written to {logdir}; view with: tensorboard --logdir {logdir}",
    ]
    (event_file,) = logdir.iterdir()
    assert event_file.name.startswith("events.out.tfevents.")

    events = event_accumulator.EventAccumulator(
        str(logdir), size_guidance=event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE
    )
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == [
        "supervised/train/loss",
        "supervised/validation/loss",
    ]
    train = events.Scalars("supervised/train/loss")
    validation = events.Scalars("supervised/validation/loss")
    assert [event.step for event in train] == [0, 1, 2]
    assert [event.step for event in validation] == [0, 1, 2]
    losses = [event.value for event in validation]
    assert losses[2] < losses[0]  # SGD on a linear target makes progress

    def text(tag):
        (event,) = events.Tensors(tag)
        return tensor_util.make_ndarray(event.tensor_proto).item().decode()

    assert text("params").splitlines()[2:] == [
        "| optimizer/name | sgd |",
        "| optimizer/learning_rate | 0.1 |",
    ]
    assert text("artifacts/notes") == "three epochs of SGD"


def test_the_example_tracker_satisfies_the_tracker_protocol(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tensorboard_tracker_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tracker = module.TensorBoardTracker(tmp_path)
    try:
        assert isinstance(tracker, Tracker)
    finally:
        tracker.close()
