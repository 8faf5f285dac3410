"""`dew sweep --workers N`: N local sweep workers on one ledger (and, with Optuna search, one
SQLite storage in the sweep's folder), started and stopped as `--processes` starts its
processes (decision 0054). The machine has 2 cores: 3 workers share them."""

import os
import signal
import subprocess
import sys
import time

import pytest
from _ledgers import ledger_json
from _tiny_sweep_run import tiny_lm_run

pytestmark = pytest.mark.slow

RATES = [0.1 / 2**index for index in range(9)]


def _files(tmp_path, steps=1):
    run = tiny_lm_run(tmp_path, steps)
    config = tmp_path / "run.toml"
    run.dump_toml(config)
    space = tmp_path / "space.toml"
    space.write_text(f'"optim.learning_rate" = {RATES}\n')
    return config, space


def _dew(tmp_path, *arguments):
    return subprocess.Popen(
        [sys.executable, "-m", "dew.cli", "sweep", *map(str, arguments), "--quiet"],
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _started(tmp_path):
    """The index of every trial a worker started (its run.json is written first)."""
    return sorted(
        int(path.parent.name.removeprefix("trial-"))
        for path in (tmp_path / "runs" / "tiny").glob("trial-*/run.json")
    )


@pytest.mark.parametrize("search", ["grid", "optuna"])
def test_three_workers_finish_a_nine_trial_sweep_with_every_index_once(tmp_path, search):
    if search == "optuna":
        pytest.importorskip("optuna")
    config, space = _files(tmp_path)
    sweep = _dew(tmp_path, config, space, "--trials", 9, "--search", search, "--workers", 3)
    output, errors = sweep.communicate(timeout=900)
    assert sweep.returncode == 0, errors
    assert _started(tmp_path) == list(range(9))  # each index trained once, by one worker
    ledger = ledger_json(tmp_path / "runs" / "tiny" / "ledger.json")
    assert [entry["index"] for entry in ledger["trials"]] == list(range(9))
    assert ledger["running"] == []
    if search == "grid":  # every grid point once, in the grid's order
        assert [entry["overrides"]["optim.learning_rate"] for entry in ledger["trials"]] == RATES
    else:  # one study in the sweep's folder, which Optuna's own client reads
        import optuna

        study = optuna.load_study(
            study_name="tiny", storage=f"sqlite:///{tmp_path / 'runs' / 'tiny' / 'study.db'}"
        )
        complete = [trial for trial in study.trials if trial.state.name == "COMPLETE"]
        assert [trial.number for trial in complete] == list(range(9))
        assert [trial.value for trial in complete] == [e["value"] for e in ledger["trials"]]
    lines = output.splitlines()  # the launcher's summary, once, not each worker's
    summary = [line for line in lines if line.startswith("trial ") and "  score " in line]
    assert [line.split()[1] for line in summary] == [str(index) for index in range(9)]
    best = min(ledger["trials"], key=lambda entry: entry["value"])
    assert lines[-1].startswith(f"best trial {best['index']}  score ")


def test_ctrl_c_stops_every_worker_and_the_same_command_continues(tmp_path):
    config, space = _files(tmp_path, steps=300)
    arguments = [config, space, "--trials", 4, "--search", "grid", "--workers", 2]
    sweep = _dew(tmp_path, *arguments)
    ledger = tmp_path / "runs" / "tiny" / "ledger.json"
    deadline = time.monotonic() + 300
    while not (ledger.exists() and len(ledger_json(ledger)["running"]) == 2):
        assert sweep.poll() is None, sweep.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sweep.send_signal(signal.SIGINT)  # what Ctrl-C sends the launcher
    _, errors = sweep.communicate(timeout=120)
    assert sweep.returncode == 130, errors
    assert errors.strip().endswith("interrupted; run the same command again to resume"), errors
    assert len(ledger_json(ledger)["trials"]) < 4

    sweep = _dew(tmp_path, *arguments)  # the same command: the sweep continues
    _, errors = sweep.communicate(timeout=900)
    assert sweep.returncode == 0, errors
    assert [entry["index"] for entry in ledger_json(ledger)["trials"]] == [0, 1, 2, 3]
    assert ledger_json(ledger)["running"] == []


def test_bad_workers_are_usage_errors(tmp_path):
    config, space = _files(tmp_path)
    for extra, message in [
        (["--workers", 0], "--workers must be >= 1, got 0"),
        (["--workers", 2, "--processes", 2], "--workers starts independent sweep workers"),
    ]:
        sweep = _dew(tmp_path, config, space, "--trials", 2, *extra)
        _, errors = sweep.communicate(timeout=300)
        assert sweep.returncode == 2 and message in errors, errors
