"""The run lifecycle through the real `dew` command: extend a run, the final evaluation,
Ctrl-C and resume."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from _builders import write_config
from _ledgers import ledger_json

from dew.cli import main
from dew.config import RunConfig
from dew.tracking import read_journal

HERE = pathlib.Path(__file__).parent


def _write_config(tmp_path, **trainer):
    cadence = {"steps": 4, "log_every": 2, "eval_every": 100, "checkpoint_every": None}
    path, _ = write_config(tmp_path, **(cadence | trainer))
    return path


def _environment():
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _dew(*arguments, cwd):
    return subprocess.run(
        [sys.executable, "-m", "dew.cli", *map(str, arguments)],
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _saved_leaves(folder, step):
    """A run's checkpoint at `step`, restored by orbax as saved (no template)."""
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(folder / "checkpoints" / str(step) / "state")
    return [np.asarray(leaf) for leaf in jax.tree.leaves(restored)]


def _starts(folder):
    journal = read_journal(folder)
    return [(r.start_step, r.steps) for _, _, r in journal.records if r.type == "fit_started"]


@pytest.mark.slow
def test_dew_train_with_a_larger_steps_extends_the_finished_run(tmp_path, capsys):
    path = _write_config(tmp_path)
    folder = tmp_path / "runs" / "tiny"
    assert main(["train", str(path), "--quiet"]) == 0
    run_json = (folder / "run.json").read_bytes()
    extended = _dew("train", path, "--steps", 8, cwd=tmp_path)  # the real command
    assert extended.returncode == 0, extended.stderr
    assert f"resuming at step 4 from {folder / 'checkpoints'}" in extended.stdout
    assert "step 2 " not in extended.stdout  # no step of the first fit trained again
    assert _starts(folder) == [(0, 4), (4, 8)]
    journal = read_journal(folder)
    assert [step for step, _ in journal.scalars["lm/train/loss"]] == [2, 4, 6, 8]
    notes = [value for name, _, value in journal.artifacts if name == "step_budget"]
    assert notes == [{"from_step": 4, "steps": 8, "previous_steps": 4}]
    assert (folder / "run.json").read_bytes() == run_json  # the first record, as written
    capsys.readouterr()

    # A smaller total is refused naming both numbers; another trainer change as before.
    assert main(["train", str(path), "--steps", "6", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "is at step 8 (its latest checkpoint), past trainer.steps=6" in error
    assert main(["train", str(path), "--steps", "8", "--set", "trainer.log_every=4"]) == 2
    assert "sections that differ: trainer" in capsys.readouterr().err
    assert _starts(folder) == [(0, 4), (4, 8)]  # neither refused command started a fit

    # The configuration read back from the folder is the extended run's: its TOML trains
    # (resumes at its last step) rather than being refused as a smaller total.
    assert RunConfig.load(folder).trainer.steps == 8
    assert main(["config", "show", str(folder)]) == 0
    shown = tmp_path / "shown.toml"
    shown.write_text(capsys.readouterr().out)
    assert main(["train", str(shown), "--quiet"]) == 0, capsys.readouterr().err
    assert _starts(folder) == [(0, 4), (4, 8), (8, 8)]


@pytest.mark.slow
def test_a_short_run_ends_with_validation_scores_that_runs_and_sweep_see(tmp_path, capsys):
    path = _write_config(tmp_path)  # steps=4, eval_every=100: the cadence never comes
    assert main(["train", str(path), "--quiet"]) == 0
    journal = read_journal(tmp_path / "runs" / "tiny")
    assert [step for step, _ in journal.scalars["lm/validation/perplexity"]] == [4]
    capsys.readouterr()
    assert main(["runs", str(tmp_path / "runs"), "--json"]) == 0
    [row] = [row for row in json.loads(capsys.readouterr().out) if row["run"] == "tiny"]
    perplexity = row["metrics"]["lm/validation/perplexity"]
    assert (
        perplexity["step"] == 4
        and perplexity["value"] == journal.scalars["lm/validation/perplexity"][-1][1]
    )
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.01]\n')
    assert (
        main(
            [
                "sweep",
                str(path),
                str(space),
                "--name",
                "sw",
                "--steps",
                "2",
                "--trials",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    ledger = ledger_json(tmp_path / "runs" / "sw" / "ledger.json")
    [trial] = ledger["trials"]
    run = read_journal(tmp_path / "runs" / "sw" / f"trial-{trial['index']}")
    [(step, value)] = run.scalars["lm/validation/perplexity"]
    assert step == 2 and trial["value"] == value  # the trial's score: its final evaluation


def _interrupt(command, cwd, ready):
    """Start `command`, wait until `ready()`, send SIGINT; its exit status and stderr."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while not ready():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run never got ready"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, errors = process.communicate(timeout=120)
    return process.returncode, errors


@pytest.mark.slow
def test_ctrl_c_saves_the_step_and_the_same_command_resumes_bitwise(tmp_path):
    path = _write_config(tmp_path, steps=1_000_000, log_every=5, eval_every=None)
    folder = tmp_path / "runs" / "tiny"
    command = [sys.executable, "-m", "dew.cli", "train", str(path), "--quiet"]
    line = re.compile(
        r"dew train: interrupted at step (\d+); the same command resumes from step (\d+)\n"
    )

    def logged_past(step, fits):
        def ready():
            journal = folder / "scalars.jsonl"
            if not journal.exists() or len(_starts(folder)) < fits:
                return False
            lines = journal.read_text().splitlines()
            return bool(lines) and json.loads(lines[-1])["step"] >= step

        return ready

    status, errors = _interrupt(command, tmp_path, logged_past(10, 1))
    assert status == 130, errors
    match = line.fullmatch(errors)  # the one line: no traceback
    assert match is not None, errors
    stopped = int(match[1])
    assert stopped >= 10 and int(match[2]) == stopped
    assert max(int(p.name) for p in (folder / "checkpoints").iterdir()) == stopped
    ended = [r for _, _, r in read_journal(folder).records if r.type == "fit_ended"]
    assert [(r.status, r.step) for r in ended] == [("interrupted", stopped)]

    # The same command resumes from that step; stopped again, it saves again.
    status, errors = _interrupt(command, tmp_path, logged_past(stopped + 10, 2))
    assert status == 130, errors
    match = line.fullmatch(errors)
    assert match is not None, errors
    again = int(match[1])
    assert _starts(folder) == [(0, 1_000_000), (stopped, 1_000_000)]
    # Bitwise what an uninterrupted run to that step ends with (a constant learning rate).
    # (in this process: the reference is not about the command, only its params)
    assert main(["train", str(path), "--name", "whole", "--steps", str(again), "--quiet"]) == 0
    resumed = _saved_leaves(folder, again)
    whole = _saved_leaves(tmp_path / "runs" / "whole", again)
    assert len(resumed) == len(whole) > 0
    assert all(np.array_equal(a, b) for a, b in zip(resumed, whole, strict=True))


@pytest.mark.slow
def test_ctrl_c_inside_orbax_wait_is_dews_one_line(tmp_path):
    """Ctrl-C while the main thread waits for a save in orbax's threads: dew's line only
    (orbax logged the interrupt with its traceback through absl before dew's line)."""
    path = _write_config(tmp_path, steps=1_000, log_every=2, eval_every=None, checkpoint_every=2)
    marker = tmp_path / "waiting"
    worker = [sys.executable, str(HERE / "_slow_save_worker.py"), str(marker)]

    def waiting():
        if not marker.exists():
            return False
        time.sleep(0.5)  # past the marker, into orbax's join
        return True

    status, errors = _interrupt([*worker, "train", str(path), "--quiet"], tmp_path, waiting)
    assert status == 130, errors
    assert re.fullmatch(r"dew train: interrupted at step \d+; the same command [^\n]*\n", errors), (
        errors
    )


@pytest.mark.slow
def test_ctrl_c_during_the_first_compilation_says_so_at_once(tmp_path):
    # The built-in tiny_lm with four (unrolled) blocks compiles its step for seconds.
    command = [sys.executable, "-m", "dew.cli", "train", "--checkpoint-dir", str(tmp_path)]
    command += ["--steps", "4", "--set", "model.kwargs.num_layers=4", "--quiet"]
    process = subprocess.Popen(
        command,
        env=_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = []  # (when, line) of each line on standard error

    def read():
        for line in process.stderr:
            said.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read)
    reader.start()
    records = tmp_path / "quickstart" / "records.jsonl"
    deadline = time.monotonic() + 180
    while not (records.exists() and "fit_started" in records.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, said
        time.sleep(0.02)
    time.sleep(0.2)  # past the first batch's draw: in the first step's compilation
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) == 130
    reader.join()
    lines = [line for _, line in said]
    assert lines[0] == "interrupting after compilation...", lines
    assert said[0][0] - sent < 2.0  # at once, not once the compilation is over
    assert lines[1:] == ["dew train: interrupted at step 1; the same command resumes from step 1"]
