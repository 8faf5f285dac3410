"""The `dew` command's start-up: `dew --help`, `dew --version`, `dew runs` and `dew config
show` in fresh processes, against the floors a user cannot go below.

Every side is one fresh process started with `subprocess.run`, timed wall clock from the
start to its exit (the time a user waits at the prompt), output to a pipe that is read whole:

- floors: `python -c pass` (the interpreter's own start), `python -c "import json,
  argparse"` (what any argparse command that prints JSON imports), and a plain reader of the
  same run folders (`plain reader`: walk the folder for `scalars.jsonl`, parse every line
  with `json.loads`, keep each tag's last value, print one line a run), in the same process
  count as `dew runs`;
- dew: the `dew` console script (the one beside this interpreter, else `python -m
  dew.cli`) with `--help`, `--version`, `runs FOLDER` on 1, 10 and 100 run folders and on a
  sweep's folder (its ledger and the sweep's journal of 8 trials), `config show` (the default
  `tiny_lm`) and `config show tiny_classifier --set optim.learning_rate=0.5`; and `python -c
  "import dew"`, which every subprocess test and tracker worker pays;
- for scale: `python -c "import jax"`.

The run folders are written once, before timing, by dew's own `LocalTracker` as `dew train`
leaves them: run.json, a journal of 200 logged steps of three metrics, the fit's start and
end records. Which dew is measured is the one `import dew` finds: run with
`PYTHONPATH=<checkout>/src` to measure another checkout (issue 27's "before" is main's).

Timing: one untimed warm-up of every side (the page cache), then `--rounds` rounds; each
round runs every side once, in an order that reverses every round. When the load average is
above 2 every process is pinned to CPU 1 (`taskset -c 1`), sides alike. The table shows per
side the median, the spread (lowest and highest round), the ratio to `python -c pass` and,
for `dew runs`, to the plain reader of the same folders, and the median CPU time (user and
system) the process used, which a loaded machine changes far less than the wall time; then
the target (`dew --help` and
`dew runs` on one folder under 0.5 s on an idle 2-core machine) and whether this run meets it.
Asserts nothing and exits 0.

Run: `python benchmarks/cli_startup.py` (7 rounds; about 40 s on 2 cores at load 4 with
this branch, several minutes on a checkout whose command imports JAX), `--quick` (1 round,
1 and 10 folders), `--rounds R`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_S = 0.5
PLAIN_READER = """
import json, pathlib, sys
for journal in sorted(pathlib.Path(sys.argv[1]).rglob("scalars.jsonl")):
    last = {}
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        for tag, value in entry.get("values", {}).items():
            last[tag] = value
    print(journal.parent.name, *(f"{tag}={value}" for tag, value in sorted(last.items())))
"""


def _write_runs(root: pathlib.Path, count: int) -> pathlib.Path:
    """`count` run folders under `root/runs-<count>`, as `dew train` leaves them."""
    from dew.telemetry.records import FitEnded, FitStarted, RunRecord
    from dew.tracking import LocalTracker

    folder = root / f"runs-{count}"
    for index in range(count):
        with LocalTracker(folder / f"run-{index}") as tracker:
            record = RunRecord(
                model={"name": "causal_transformer"},
                data={"name": "token_windows"},
                optim={"optimizer": "adam", "learning_rate": 10.0 ** -(1 + index % 4)},
                trainer={"name": f"run-{index}", "steps": 200},
            )
            tracker.log_artifact("run_record", record)
            tracker.log_params({"config": {"optim": {"learning_rate": 10.0 ** -(1 + index % 4)}}})
            tracker.log_artifact("fit_started", FitStarted("train", 0, 200), step=0)
            for step in range(200):
                loss = 3.0 / (1 + step) + index * 1e-3
                tracker.log_metrics(
                    {"lm/train/loss": loss, "lm/train/accuracy": 1 - loss / 4, "lm/train/lr": 0.01},
                    step=step,
                )
            tracker.log_metrics({"lm/validation/loss": 0.1 + index * 1e-3}, step=199)
            tracker.log_artifact("fit_ended", FitEnded("completed", 200), step=200)
    return folder


def _write_sweep(root: pathlib.Path, trials: int = 8) -> pathlib.Path:
    """A sweep's folder under `root/sweeps`: its ledger (the first format's `ledger.json`,
    which every later dew reads) and the sweep's own journal of `trials` finished trials."""
    import json

    from dew.telemetry.records import TrialFinished
    from dew.tracking import LocalTracker

    folder = root / "sweeps" / "rate"
    folder.mkdir(parents=True)
    space = {"optim.learning_rate": {"kind": "choice", "values": [0.1, 0.01]}}
    ledger = {"version": 1, "space": space, "search": "grid", "config": {}, "trials": []}
    (folder / "ledger.json").write_text(json.dumps({**ledger, "direction": "minimize"}))
    with LocalTracker(folder / "sweep") as tracker:
        for index in range(trials):
            value = 1.0 / (1 + index)
            tracker.log_metrics({"sweep/validation/value": value}, step=index)
            point = {"optim.learning_rate": 10.0 ** -(1 + index % 4)}
            trial = TrialFinished(trial=index, overrides=point, value=value)
            tracker.log_artifact("trial_finished", trial, step=index)
    return folder.parent


def _dew_command() -> list[str]:
    script = pathlib.Path(sys.executable).with_name("dew")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dew.cli"]


def _sides(root: pathlib.Path, sizes: tuple[int, ...]) -> list[tuple[str, list[str]]]:
    python, dew = [sys.executable], _dew_command()
    sides = [
        ("python -c pass", [*python, "-c", "pass"]),
        ("python -c 'import json, argparse'", [*python, "-c", "import json, argparse"]),
        ("python -c 'import dew'", [*python, "-c", "import dew"]),
        ("dew --help", [*dew, "--help"]),
        ("dew --version", [*dew, "--version"]),
        ("dew config show", [*dew, "config", "show"]),
        (
            "dew config show --set",
            [*dew, "config", "show", "tiny_classifier", "--set", "optim.learning_rate=0.5"],
        ),
        ("dew runs over a sweep", [*dew, "runs", str(root / "sweeps")]),
    ]
    for size in sizes:
        folder = str(root / f"runs-{size}")
        sides.append((f"plain reader, {size} runs", [*python, "-c", PLAIN_READER, folder]))
        sides.append((f"dew runs, {size} runs", [*dew, "runs", folder]))
    sides.append(("python -c 'import jax'", [*python, "-c", "import jax"]))
    return sides


def _time(command: list[str], pin: bool) -> tuple[float, float]:
    """The wall time of `command` and the CPU time (user and system) it used."""
    command = ["taskset", "-c", "1", *command] if pin else command
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    cpu = done.ru_utime - used.ru_utime + done.ru_stime - used.ru_stime
    return elapsed, cpu


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 1 and 10 run folders")
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    rounds = 1 if options.quick else options.rounds
    sizes = (1, 10) if options.quick else (1, 10, 100)
    load = os.getloadavg()
    pin = load[0] > 2 and shutil.which("taskset") is not None and os.cpu_count() > 1

    import dew

    print(f"dew {dew.__version__} from {pathlib.Path(dew.__file__).parent}")
    print(
        f"python {platform.python_version()}, jax {_version('jax')}, "
        f"equinox {_version('equinox')}, optax {_version('optax')}"
    )
    print(f"{os.cpu_count()} CPU cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{rounds} rounds; every process pinned to CPU 1: {'yes' if pin else 'no'}")
    with tempfile.TemporaryDirectory() as temporary:
        root = pathlib.Path(temporary)
        for size in sizes:
            _write_runs(root, size)
        _write_sweep(root)
        sides = _sides(root, sizes)
        times: dict[str, list[float]] = {label: [] for label, _ in sides}
        cpu: dict[str, list[float]] = {label: [] for label, _ in sides}
        for _, command in sides:  # warm-up: the page cache, compiled bytecode
            _time(command, pin)
        for index in range(rounds):
            for label, command in sides if index % 2 == 0 else reversed(sides):
                wall, used = _time(command, pin)
                times[label].append(wall)
                cpu[label].append(used)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    floor = statistics.median(times["python -c pass"])
    print(
        f"{'side':36} {'median s':>9} {'spread s':>15} {'x pass':>8} {'x reader':>9} {'CPU s':>7}"
    )
    for label, _ in sides:
        median = statistics.median(times[label])
        spread = f"{min(times[label]):.3f}-{max(times[label]):.3f}"
        reader = ""
        if label.startswith("dew runs,"):
            size = label.split(", ")[1]
            reader = f"{median / statistics.median(times[f'plain reader, {size}']):.1f}"
        used = statistics.median(cpu[label])
        print(
            f"{label:36} {median:9.3f} {spread:>15} {median / floor:8.1f} {reader:>9} {used:7.3f}"
        )
    print(f"\ntarget: dew --help and dew runs on one folder under {TARGET_S} s, idle 2 cores")
    for label in ("dew --help", "dew runs, 1 runs"):
        median = statistics.median(times[label])
        verdict = "met" if median < TARGET_S else "not met"
        print(f"  {label}: {median:.3f} s, {verdict} at this load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
