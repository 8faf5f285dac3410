"""A run folder through the real `dew` command: one run at a time (its lock), a failed first
attempt corrected, checks before anything is written, no writes through a link."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from _builders import write_config

from dew.cli import main
from dew.config import RunConfig
from dew.tracking import read_journal


def _write_config(tmp_path, **trainer):
    cadence = {"steps": 8, "log_every": 2, "eval_every": 4, "checkpoint_every": 4}
    path, _ = write_config(tmp_path, **(cadence | trainer))
    return path


def _command(*arguments):
    return [sys.executable, "-m", "dew.cli", *map(str, arguments)]


def _environment():
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _start(*arguments, cwd):
    return subprocess.Popen(
        _command(*arguments),
        cwd=cwd,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_fit(folder, process, timeout=240):
    """Until the run in `folder` has started its fit (it holds the folder then)."""
    deadline = time.monotonic() + timeout
    records = folder / "records.jsonl"
    while not (records.exists() and "fit_started" in records.read_text()):
        if process.poll() is not None:
            pytest.fail(f"the run ended before its fit started:\n{process.communicate()}")
        assert time.monotonic() < deadline, "the run never started its fit"
        time.sleep(0.1)


@pytest.mark.slow  # two `dew train` processes, about 15 s
def test_a_second_dew_train_on_a_folder_in_use_is_refused_naming_the_first(tmp_path):
    path = _write_config(tmp_path)
    folder = tmp_path / "runs" / "tiny"
    first = _start("train", path, "--quiet", cwd=tmp_path)
    try:
        _wait_for_fit(folder, first)
        os.kill(first.pid, signal.SIGSTOP)  # it holds the folder while the second tries
        try:
            second = subprocess.run(
                _command("train", path, "--quiet"),
                cwd=tmp_path,
                env=_environment(),
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    assert second.returncode == 2, second.stderr
    assert second.stderr.splitlines() == [
        f"dew train: {folder}: the run folder is in use by process {first.pid}, which holds its "
        "lock run.lock; wait for that run to end (or stop it), or train under another "
        "trainer.name"
    ]
    # One writer: each (tag, step) logged once, one run record, one fit.
    lines = [json.loads(line) for line in (folder / "scalars.jsonl").read_text().splitlines()]
    logged = [(tag, line["step"]) for line in lines for tag in line["values"]]
    assert len(logged) == len(set(logged)) > 0
    kinds = [record.type for _, _, record in read_journal(folder).records]
    assert [kinds.count(kind) for kind in ("run_record", "fit_started", "fit_ended")] == [1, 1, 1]


@pytest.mark.slow  # two `dew train` processes, about 12 s
def test_a_killed_run_leaves_its_folder_to_the_next(tmp_path):
    path = _write_config(tmp_path, steps=100_000, log_every=1000, checkpoint_every=None)
    folder = tmp_path / "runs" / "tiny"
    first = _start("train", path, "--quiet", cwd=tmp_path)
    try:
        _wait_for_fit(folder, first)
        assert (folder / "run.lock").read_text() == f"{first.pid}\n"
    finally:
        first.kill()
        first.communicate()
    second = subprocess.run(
        _command("train", path, "--steps", "2", "--quiet"),
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr
    assert "step 2  " in second.stdout


@pytest.mark.slow  # two fits in this process, about 8 s
def test_a_failed_first_attempt_does_not_pin_its_configuration(tmp_path, capsys):
    path = _write_config(tmp_path)
    folder = tmp_path / "runs" / "tiny"
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    store = f"sqlite:///{blocker}/mlflow.db"
    first = ["train", str(path), "--set", "optim.learning_rate=0.02", "--quiet"]
    assert main([*first, "--tracker", "mlflow", "--mlflow-uri", store]) == 2
    assert capsys.readouterr().err.startswith(f"dew train: MLflow cannot open the store {store!r}")
    assert RunConfig.from_run_record(folder).optim.learning_rate == 0.02  # recorded, no step
    assert main(["train", str(path)]) == 0  # the corrected configuration (0.01)
    said = [line for line in capsys.readouterr().out.splitlines() if "starts over" in line]
    assert said == [
        f"{folder}: its run.json recorded another configuration (sections that differ: optim) "
        "and the run never completed a step, so it starts over with this one (the old record "
        "is now run.json.previous)"
    ]
    assert RunConfig.from_run_record(folder).optim.learning_rate == 0.01
    assert json.loads((folder / "run.json.previous").read_text())["optim"]["learning_rate"] == 0.02


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ['optim.optimizer="adamm"'],
            "no optimizer is registered as 'adamm'; registered: 'adafactor', 'adam', 'adamw', "
            "'lion', 'rmsprop', 'sgd'.",
        ),
        (
            ['data={name="shapes"}', "objective.kwargs.seq_len=8"],
            "the data's first training batch does not fit the 'lm' objective: LMObjective "
            "reads batch key 'text', but the batch has 'images', 'labels'.",
        ),
    ],
)
def test_a_bad_configuration_fails_before_anything_is_written(tmp_path, capsys, settings, message):
    path = _write_config(tmp_path)
    overrides = [part for setting in settings for part in ("--set", setting)]
    assert main(["train", str(path), *overrides, "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"dew train: {message}"]
    assert not (tmp_path / "runs").exists()


def test_a_link_where_dew_writes_is_one_line_and_nothing_is_written_outside(tmp_path, capsys):
    path = _write_config(tmp_path)
    folder = tmp_path / "runs" / "tiny"
    folder.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder / "scalars.jsonl").symlink_to(outside / "scalars.jsonl")
    assert main(["train", str(path), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"dew train: {folder / 'scalars.jsonl'}: is a symbolic link (to "
        f"{outside / 'scalars.jsonl'}), and dew never writes through a link; remove the link "
        "(nothing was written through it)"
    ]
    assert list(outside.iterdir()) == []
