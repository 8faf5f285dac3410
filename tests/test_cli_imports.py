"""The `dew` command imports only what the chosen command needs: `--help`, `--version`,
`dew runs`, `dew config show` and `dew plot` compute nothing, and never import JAX, Equinox,
Optax or Orbax (issue 27: `dew --help` took longer than `import jax`)."""

import json
import math
import os
import subprocess
import sys

import pytest

from dew.telemetry.records import FitEnded, FitStarted, RunRecord, TrialFinished
from dew.tracking import LocalTracker

JAX_FAMILY = ("jax", "jaxlib", "equinox", "optax", "orbax")

# Runs the command as the console script does, in a fresh interpreter, then reports its exit
# status and which of JAX_FAMILY it imported (as top-level packages of sys.modules).
PROGRAM = """
import json, sys
from dew.cli import main
report, argv = sys.argv[1], sys.argv[2:]
try:
    code = main(argv)
except SystemExit as leaving:
    code = leaving.code
loaded = sorted({{name.partition(".")[0] for name in sys.modules}} & set({banned!r}))
with open(report, "w") as file:
    json.dump({{"code": code, "loaded": loaded}}, file)
"""


def _run_folders(root):
    """A trained run's folder under `runs` and a sweep's under `sweeps`, as `dew train` and
    `dew sweep` leave them (run.json, a journal of metrics and records, the sweep's ledger),
    no training."""
    with LocalTracker(root / "runs" / "lm") as tracker:
        record = RunRecord(
            model={"name": "causal_transformer"}, data={}, optim={}, trainer={"name": "lm"}
        )
        tracker.log_artifact("run_record", record)
        tracker.log_params({"config": {"optim": {"learning_rate": 0.01}}})
        tracker.log_artifact("fit_started", FitStarted("train", 0, 4), step=0)
        for step, loss in enumerate([2.0, 1.5, 1.25]):
            tracker.log_metrics({"lm/train/loss": loss}, step=step)
        tracker.log_artifact("fit_ended", FitEnded("completed", 3), step=3)
    sweep = root / "sweeps" / "s"
    sweep.mkdir(parents=True)
    space = {"optim.learning_rate": {"kind": "choice", "values": [0.1, 0.01]}}
    ledger = {"version": 1, "space": space, "search": "grid", "config": {}, "trials": []}
    (sweep / "ledger.json").write_text(json.dumps({**ledger, "direction": "minimize"}))
    with LocalTracker(sweep / "sweep") as tracker:
        for index, value in enumerate([0.5, math.nan]):
            tracker.log_metrics({"sweep/validation/value": value}, step=index)
            point = {"optim.learning_rate": 10.0 ** -(index + 1)}
            trial = TrialFinished(trial=index, overrides=point, value=value)
            tracker.log_artifact("trial_finished", trial, step=index)
    return root / "runs"


def _dew(tmp_path, *argv):
    """`dew *argv` in a fresh interpreter: its exit status, output, and the JAX family
    packages it imported."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(banned=JAX_FAMILY), str(report), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(report.read_text())
    return outcome["code"], result.stdout, outcome["loaded"]


@pytest.mark.parametrize(
    ("argv", "printed"),
    [
        (["--help"], "usage: dew"),
        (["--version"], "dew "),
        (["runs", "runs"], "1.2500"),
        (["runs", "sweeps"], "s/sweep"),
        (["config", "show"], "[trainer]"),
        (["config", "show", "tiny_classifier", "--set", "optim.learning_rate=0.5"], "0.5"),
    ],
    ids=["help", "version", "runs", "runs-of-a-sweep", "config-show", "config-show-set"],
)
def test_a_command_that_computes_nothing_imports_no_jax(tmp_path, argv, printed):
    _run_folders(tmp_path)
    code, output, loaded = _dew(tmp_path, *argv)
    assert code == 0 and printed in output, output
    assert loaded == [], f"dew {' '.join(argv)} imported {', '.join(loaded)}"


@pytest.mark.slow  # Matplotlib's import: 2-10 s
def test_dew_plot_imports_no_jax(tmp_path):
    pytest.importorskip("matplotlib")
    folder = _run_folders(tmp_path) / "lm"
    code, output, loaded = _dew(tmp_path, "plot", str(folder))
    assert code == 0 and output.startswith("1 plots in"), output
    assert loaded == [], f"dew plot imported {', '.join(loaded)}"


@pytest.mark.slow  # JAX's import, about 5 s
def test_the_check_sees_jax_when_a_command_imports_it(tmp_path):
    """The same check on a command that computes (`dew eval` builds the run's model) finds
    JAX: an empty list above is the command's doing, not a blind check."""
    folder = _run_folders(tmp_path) / "lm"
    code, _, loaded = _dew(tmp_path, "eval", str(folder))
    assert code == 2
    assert "jax" in loaded
