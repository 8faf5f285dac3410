"""Reading journals back: `read_journal` against a streaming floor, and `dew runs` against a
plain reader of the same files, at several sizes (issue 27, item 3; decision 0046).

Targets: `read_journal` within 1.3x of the streaming floor in time and in peak memory;
`dew runs` over 200 run folders under 2 s. The script measures; it asserts nothing and
exits 0.

Groups, and what each side runs:

- `read_journal`, at 1e4, 1e5 and 1e6 journal lines (three tags a line, one in 50 values
  non-finite, one resume boundary in the middle whose steps are logged again): each
  measurement is a fresh Python process that imports what it needs, then times one call
  with `time.perf_counter` and reports its peak memory as its peak resident memory
  (`VmHWM`) less its resident memory just before the call (the imports' are not counted;
  `ru_maxrss` would count the parent's, which a child inherits across `fork` and `exec`).
  - `dew`: `dew.tracking.read_journal(folder)`, the `dew` on `PYTHONPATH`;
  - `dew (before)`: the same call on the code at `--before SRC` (e.g. main's `src`);
  - `floor`: a plain loop over the file's lines, `json.loads` each, reducing into a dict of
    per-tag dicts by step (the last value per step stands), then lists of `(step, value)`
    pairs: the same `scalars` result, with no checks and no records.
- `dew runs`, over 1, 200 and 2,000 run folders (each the journal of a 2,000-step fit logged
  every 10 steps, three tags, its records and parameters, as `LocalTracker` writes them, so
  with its `summary.json`): each measurement is the command as a user runs it in a fresh
  process (`from dew.cli import main; main(["runs", ROOT])`, what `python -m dew.cli` and
  the `dew` script do), its output to /dev/null, timed from outside end to end; the process
  also reports its time after its imports (`after imports`: the import cost is another
  item's, issue 27 item 4). The peer, `plain reader`, is a fresh Python
  process that, for every `scalars.jsonl` under the root, streams it keeping each tag's
  value at its greatest step, reads `records.jsonl` and `params.json`, and prints one line a
  run: what a user would write without dew.

Sides alternate round by round (the order reverses every round). When the load average is
above 2, every process is pinned to one core (`taskset -c 1`). The tables show the median
and spread (min-max) per side, and the ratios against the floor/peer.

Run: `python benchmarks/journal_read.py --before /work/main/src` (a few minutes at load 10),
`--quick` (1e4 lines and 1 and 20 folders, one round: seconds), `--only read_journal` or
`--only runs` for one group.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TAGS = ("lm/train/loss", "lm/validation/perplexity", "lm/validation/psnr")

_READ = r"""
import json, os, sys, time
folder, side = sys.argv[1], sys.argv[2]
if side == "floor":
    NON_FINITE = {"NaN": float("nan"), "+Inf": float("inf"), "-Inf": float("-inf")}
    def read(folder):
        by_step = {}
        with open(os.path.join(folder, "scalars.jsonl"), "rb") as journal:
            for line in journal:
                entry = json.loads(line)
                step = entry["step"]
                for tag, value in entry["values"].items():
                    by_step.setdefault(tag, {})[step] = float(NON_FINITE.get(value, value))
        return {tag: list(series.items()) for tag, series in by_step.items()}
else:
    from dew.tracking import read_journal
    def read(folder):
        return read_journal(folder).scalars
def status(key):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(key):
                return int(line.split()[1])
before = status("VmRSS:")
start = time.perf_counter()
scalars = read(folder)
elapsed = time.perf_counter() - start
peak = status("VmHWM:") - before
print(json.dumps({"s": elapsed, "peak_kib": peak, "points": sum(map(len, scalars.values()))}))
"""

_PLAIN_RUNS = r"""
import json, os, pathlib, sys
NON_FINITE = {"NaN": float("nan"), "+Inf": float("inf"), "-Inf": float("-inf")}
root = pathlib.Path(sys.argv[1])
for journal in sorted(root.rglob("scalars.jsonl")):
    folder = journal.parent
    last = {}
    with open(journal, "rb") as lines:
        for line in lines:
            entry = json.loads(line)
            for tag, value in entry["values"].items():
                if tag not in last or entry["step"] >= last[tag][0]:
                    last[tag] = (entry["step"], float(NON_FINITE.get(value, value)))
    status = "-"
    with open(folder / "records.jsonl", "rb") as lines:
        for line in lines:
            record = json.loads(line).get("record", {})
            if record.get("type") == "fit_ended":
                status = record["status"]
    params = json.loads((folder / "params.json").read_text())
    cells = [str(folder.relative_to(root)), status, *map(str, params.values())]
    print("  ".join(cells + [f"{value:g}" for _, value in last.values()]))
"""


_DEW_RUNS = r"""
import json, sys, time
start = time.perf_counter()
from dew.cli import main  # what `python -m dew.cli` and the `dew` script import
imported = time.perf_counter()
try:
    main(["runs", *sys.argv[1:]])
except SystemExit:
    pass
sys.stderr.write(json.dumps({"import": imported - start, "rest": time.perf_counter() - imported}))
"""


def _pin() -> list[str]:
    return ["taskset", "-c", "1"] if os.getloadavg()[0] > 2 and shutil.which("taskset") else []


def _env(src: str | None) -> dict[str, str]:
    environment = dict(os.environ)
    if src is not None:
        environment["PYTHONPATH"] = src
    return environment


def _write_journal(folder: pathlib.Path, lines: int) -> None:
    """A journal of `lines` lines as a resumed fit leaves it: a boundary in the middle."""
    folder.mkdir(parents=True)
    with open(folder / "scalars.jsonl", "w") as journal:
        half = lines // 2
        for index in range(lines):
            step = index if index < half else index - half // 2  # logged again after resuming
            if index == half:
                journal.write(json.dumps({"step": step, "values": {}, "resume": True}) + "\n")
                continue
            values = {
                tag: ("NaN" if (index + k) % 50 == 0 else 1.0 / (index + k + 1))
                for k, tag in enumerate(TAGS)
            }
            journal.write(json.dumps({"step": step, "values": values}) + "\n")
    (folder / "records.jsonl").write_text("")


def _write_runs(root: pathlib.Path, count: int, template: pathlib.Path) -> None:
    root.mkdir(parents=True)
    for index in range(count):
        folder = root / f"run-{index:04d}"
        shutil.copytree(template, folder)
        params = json.loads((folder / "params.json").read_text())
        params["config/optim/learning_rate"] = 10 ** -(1 + index % 4)
        (folder / "params.json").write_text(json.dumps(params))


def _template(path: pathlib.Path, src: str | None) -> None:
    """One run folder written by `LocalTracker` (of the `dew` on `PYTHONPATH`)."""
    code = r"""
import sys
from dew.telemetry.records import FitEnded, FitStarted
from dew.tracking import LocalTracker
with LocalTracker(sys.argv[1]) as tracker:
    tracker.log_params({"config": {"optim": {"learning_rate": 0.1}, "model": {"name": "mlp"}}})
    tracker.log_artifact("fit_started", FitStarted("lm", 0, 2000), step=0)
    for step in range(0, 2000, 10):
        values = {t: 1.0 / (step + k + 1) for k, t in enumerate(sys.argv[2:])}
        tracker.log_metrics(values, step=step)
    tracker.log_artifact("fit_ended", FitEnded(status="completed", step=2000), step=2000)
"""
    subprocess.run([sys.executable, "-c", code, str(path), *TAGS], check=True, env=_env(src))


def _time(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The command's wall time from outside, and (for dew) its time after its imports."""
    start = time.perf_counter()
    done = subprocess.run(
        command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    elapsed = time.perf_counter() - start
    inner = json.loads(done.stderr) if done.stderr.startswith(b"{") else {"rest": elapsed}
    return elapsed, inner["rest"]


def _spread(values: list[float], scale: float = 1.0) -> str:
    low, high = min(values) * scale, max(values) * scale
    return f"{statistics.median(values) * scale:9.3f}  ({low:.3f}-{high:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: seconds")
    parser.add_argument("--before", help="the src folder of the code to compare (main's)")
    parser.add_argument("--only", choices=["read_journal", "runs"], help="one group alone")
    parser.add_argument("--lines", type=int, action="append", help="journal sizes (repeatable)")
    parser.add_argument("--rounds", type=int, help="rounds per size, in place of the defaults")
    args = parser.parse_args()
    pin = _pin()
    src_now = os.environ.get("PYTHONPATH")
    import dew

    print("# journal_read: read_journal vs a streaming floor; dew runs vs a plain reader")
    print(f"python {platform.python_version()}, dew from {pathlib.Path(dew.__file__).parent}")
    print(f"before: {args.before or '(not measured)'}")
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()}, pinned: {bool(pin)}")
    sizes = [10_000] if args.quick else [10_000, 100_000, 1_000_000]
    sizes = [] if args.only == "runs" else (args.lines or sizes)
    rounds = {10_000: 1 if args.quick else 5, 100_000: 3, 1_000_000: 2}
    sides: dict[str, str | None] = {"floor": src_now, "dew": src_now}
    if args.before:
        sides["dew (before)"] = args.before
    with tempfile.TemporaryDirectory() as directory:
        base = pathlib.Path(directory)
        print("\n## read_journal: seconds per call and peak MiB, median (min-max)")
        print(
            f"{'lines':>9}  {'side':<13} {'seconds':>28} {'peak MiB':>9} {'time x':>7} {'mem x':>6}"
        )
        for size in sizes:
            folder = base / f"journal-{size}"
            _write_journal(folder, size)
            results: dict[str, list[dict]] = {side: [] for side in sides}
            for round_ in range(args.rounds or rounds.get(size, 1)):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    command = [*pin, sys.executable, "-c", _READ, str(folder), side]
                    output = subprocess.run(
                        command, check=True, capture_output=True, text=True, env=_env(sides[side])
                    ).stdout
                    results[side].append(json.loads(output))
            floor_s = statistics.median(r["s"] for r in results["floor"])
            floor_m = statistics.median(r["peak_kib"] for r in results["floor"])
            for side, rows in results.items():
                seconds = [r["s"] for r in rows]
                peak = statistics.median(r["peak_kib"] for r in rows) / 1024
                ratio_s = statistics.median(seconds) / floor_s
                ratio_m = statistics.median(r["peak_kib"] for r in rows) / max(floor_m, 1)
                ratios = f"{ratio_s:7.2f} {ratio_m:6.2f}"
                print(f"{size:>9}  {side:<13} {_spread(seconds)} {peak:9.1f} {ratios}")
            shutil.rmtree(folder)
        print("target: dew within 1.3x of the floor in time and in memory")

        print("\n## dew runs: seconds end to end, median (min-max)")
        template = base / "template"
        _template(template, src_now)
        counts = [1, 20] if args.quick else [1, 200, 2000]
        counts = [] if args.only == "read_journal" else counts
        commands = {
            "plain reader": ([sys.executable, "-c", _PLAIN_RUNS], src_now),
            **{
                side: ([sys.executable, "-c", _DEW_RUNS], src)
                for side, src in sides.items()
                if side != "floor"
            },
        }
        header = (
            f"{'folders':>7}  {'side':<13} {'seconds':>28} {'after imports':>28} {'x plain':>8}"
        )
        print(header)
        for count in counts:
            root = base / f"runs-{count}"
            _write_runs(root, count, template)
            times: dict[str, list[tuple[float, float]]] = {side: [] for side in commands}
            runs = args.rounds or (1 if args.quick else (2 if count >= 2000 else 3))
            for round_ in range(runs):
                order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
                for side in order:
                    command, src = commands[side]
                    times[side].append(_time([*pin, *command, str(root)], _env(src)))
            plain = statistics.median(outer for outer, _ in times["plain reader"])
            for side, pairs in times.items():
                outer = [pair[0] for pair in pairs]
                inner = [pair[1] for pair in pairs]
                ratio = statistics.median(outer) / plain
                print(f"{count:>7}  {side:<13} {_spread(outer)} {_spread(inner)} {ratio:8.2f}")
            shutil.rmtree(root)
        print("target: dew runs on 200 folders under 2 s")


if __name__ == "__main__":
    main()
