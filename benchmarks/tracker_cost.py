"""The cost of one tracker report of six scalars: dew's trackers against their bare peers.

Design target (DESIGN.md, "Performance targets"): per report of six scalars, the local journal
costs <= 1.5x the bare JSONL line + flush, TensorBoard <= 1.3x the bare `EventFileWriter`
event, and MLflow <= 1.1x the bare `log_batch` on the same store. This script measures those
ratios side by side in one run; it asserts nothing and always exits 0.

One report is six Python-float scalars under six tags at one step (what `TrackerEventSink`
hands a tracker after converting device scalars). Every side receives the same value dicts,
built before any timing, at its own increasing steps.

Groups, and what each side runs per report:

- `local journal`: dew `LocalTracker.log_metrics(values, step=s)` against a bare
  `json.dumps({"step": s, "values": values})` + `write(line + "\\n")` + `flush()` to a text
  file opened in append mode, which is what the journal stores and when it flushes.
- `tensorboard`: dew `TensorBoardTracker.log_metrics` (one event of six scalar summaries,
  handed to TensorBoard's `EventFileWriter` and flushed before it returns) against
  - `EventFileWriter + flush`: the same event built with TensorBoard's compat protos
    (`Event(wall_time=time.time(), step=s, summary=Summary(value=[six simple_value
    Summary.Value]))`), `add_event`, then `flush()`. dew flushes every report, so this is the
    like-for-like peer that the target's ratio is read against;
  - `EventFileWriter, no flush`: the same without the per-event flush; the writer's thread
    writes in the background and one `flush()` at the end of each round is timed with it;
  - tensorboardX `SummaryWriter.add_scalar` x6 (one event per scalar, as tensorboardX
    writes them), with its default background flushing (one `flush()` at the end of each
    round, timed) and, separately, with a `flush()` after every report.
- `mlflow (file store)` and `mlflow (sqlite)`: dew `MLflowTracker.log_metrics` against
  `MlflowClient.log_batch(run_id, metrics=[six Metric(tag, value, timestamp_ms, step)],
  synchronous=True)`, the `Metric` objects built in the loop as any caller builds them, on
  the same store (same URI, so the same cached store object) and in the same experiment, into
  a run of its own. Each store lives in its own temporary folder; experiments and runs are
  created before timing. MLflow 3.16+ refuses a file store unless MLFLOW_ALLOW_FILE_STORE is
  true when the store is built; dew sets it around each of its calls, the bare client is built
  with it set and logs without it (MLflow checks it once, when it builds the store).

Timing: each side first makes `--warmup` reports (excluded: they open files, write plugin
metadata, create metric rows). Then, round by round, every side makes the round's reports under
one `time.perf_counter` interval, process CPU time read alongside, with garbage collection
paused (as `timeit` does; a collection runs before each interval, and the objects of the
imports and set-up are frozen out of it). The order of the sides reverses every round, so that
drift and ordering cancel. Rounds x reports per side: local journal 41 x 1,000, TensorBoard
9 x 1,000, MLflow file store 11 x 1,000, MLflow SQLite 8 x 125 (1,000 reports per side in all:
a SQLite report costs 5 to 25 ms here, so rounds of 1,000 would not fit the time budget).

The table shows, per side, the median and best round's wall ms per report and the median CPU
ms per report; and dew / side four ways: the ratio of the medians (read against the target),
the median of the per-round paired ratios, the ratio of the best rounds, and the ratio of the
CPU medians. On a shared machine the paired, best and CPU ratios are the steadier ones.

Run: `python benchmarks/tracker_cost.py` (full, about 1.5 minutes on 2 cores, most of it
the SQLite store), `--quick` (100 reports, 1 round, seconds plus MLflow's SQLite set-up), `--only
GROUP` (repeatable) for one group. TensorBoard, tensorboardX and MLflow are optional: a missing
one is reported and its sides are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import logging
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dew.naming import Split, metric_tag

# Built by dew.naming, as TrackerEventSink builds them (a tag spelled by hand drifts: this
# list once said `val`, which no tracker takes).
TAGS = tuple(
    metric_tag("supervised", split, metric)
    for split, metric in (
        (Split.TRAIN, "loss"),
        (Split.TRAIN, "grad_norm"),
        (Split.TRAIN, "learning_rate"),
        (Split.VALIDATION, "loss"),
        (Split.VALIDATION, "accuracy"),
        (Split.VALIDATION, "psnr"),
    )
)
SEED = 20261130

# DESIGN.md "Performance targets": dew / peer, per report of six scalars.
TARGETS = {"local": 1.5, "tensorboard": 1.3, "mlflow": 1.1}
# DESIGN.md reference figures (2-core CPU), median ms per report, for the peers.
DESIGN_REFERENCE = {
    "jsonl": 0.009,
    "efw": 0.070,
    "tbx": 0.49,
    "mlflow-file": 0.51,
    "mlflow-sqlite": 5.0,
}
# The user guide's figures for dew's own trackers (i9-12900K), ms per report.
GUIDE_REFERENCE = {"local": 0.005, "tensorboard": 0.033, "mlflow-file": 0.26}

Report = Callable[[dict[str, float], int], None]


@dataclass
class Side:
    """One way of making a report, timed against the others of its group."""

    label: str
    report: Report
    finish: Callable[[], None] = lambda: None  # timed at the end of each round
    reference: str = ""
    wall: list[float] = field(default_factory=list)  # seconds per round
    cpu: list[float] = field(default_factory=list)  # process CPU seconds (all threads) per round
    step: int = 0

    def run(self, batch: list[dict[str, float]]) -> None:
        report, step = self.report, self.step
        gc.collect()
        gc.disable()
        try:
            cpu = time.process_time()
            start = time.perf_counter()
            for values in batch:
                report(values, step)
                step += 1
            self.finish()
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
        finally:
            gc.enable()
        self.step = step
        self.wall.append(elapsed)
        self.cpu.append(cpu)


@dataclass
class Group:
    """dew's side (first) and its peers; `peer` names the peer the target is read against."""

    title: str
    target_key: str
    sides: list[Side]
    peer: str
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    """One group to time: its name, rounds, reports per round, and how to set it up."""

    name: str
    rounds: int
    reports: int
    build: Callable[[contextlib.ExitStack], Group]


def values_for(count: int, rng: random.Random) -> list[dict[str, float]]:
    return [{tag: rng.uniform(-10.0, 10.0) for tag in TAGS} for _ in range(count)]


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "n/a"


def header(args: argparse.Namespace, plans: list[Plan], folder: str) -> None:
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    print("tracker cost: one report of six scalars, dew vs bare peers (DESIGN.md targets)")
    print(f"  machine:  {cpu_model()}, {cores} CPUs ({usable} usable), {platform.platform()}")
    print(f"  python:   {sys.version.split()[0]} ({platform.python_implementation()})")
    packages = ("dew-ml", "tensorboard", "tensorboardX", "mlflow", "protobuf", "SQLAlchemy")
    print("  packages: " + ", ".join(f"{name} {version(name)}" for name in packages))
    print(f"  temp dir: {folder}")
    print(f"  load avg: {load_average()} (1, 5, 15 min)")
    plan = ", ".join(f"{p.name} {p.rounds} x {p.reports}" for p in plans)
    print(f"  timing:   rounds x reports per side: {plan}; {args.warmup} warm-up reports per side")
    print()


def measure(group: Group, plan: Plan, warmup: int, rng: random.Random) -> None:
    gc.collect()
    gc.freeze()  # what the imports and set-up built stays out of the per-round collections
    warm = values_for(warmup, rng)
    for side in group.sides:
        for values in warm:
            side.report(values, side.step)
            side.step += 1
        side.finish()
    for index in range(plan.rounds):
        batch = values_for(plan.reports, rng)
        order = group.sides if index % 2 == 0 else group.sides[::-1]
        for side in order:
            side.run(batch)


def per_report(seconds: list[float], reports: int) -> list[float]:
    return [value * 1e3 / reports for value in seconds]


def show(group: Group, plan: Plan) -> None:
    target = TARGETS[group.target_key]
    dew = group.sides[0]
    dew_wall = per_report(dew.wall, plan.reports)
    dew_cpu = per_report(dew.cpu, plan.reports)
    print(f"== {group.title}: {plan.rounds} round(s) of {plan.reports} reports per side ==")
    print(
        f"  {'':<34} {'ms per report':^26}   {'dew / side':^27}".rstrip() + "\n"
        f"  {'side':<34} {'median':>8} {'best':>8} {'cpu':>8}   {'median':>6} {'paired':>6} "
        f"{'best':>6} {'cpu':>6}  {'target':<15} reference"
    )
    for side in group.sides:
        wall = per_report(side.wall, plan.reports)
        cpu = per_report(side.cpu, plan.reports)
        row = (
            f"  {side.label:<34} {statistics.median(wall):>8.4f} {min(wall):>8.4f} "
            f"{statistics.median(cpu):>8.4f}   "
        )
        if side is dew:
            ratios, verdict = [""] * 4, ""
        else:
            ratio = statistics.median(dew_wall) / statistics.median(wall)
            paired = statistics.median(d / s for d, s in zip(dew_wall, wall, strict=True))
            ratios = [
                f"{value:.2f}x"
                for value in (
                    ratio,
                    paired,
                    min(dew_wall) / min(wall),
                    statistics.median(dew_cpu) / statistics.median(cpu),
                )
            ]
            if side.label == group.peer:
                verdict = f"<= {target}x " + ("met" if ratio <= target else "MISSED")
            else:
                verdict = "(information)"
        row += " ".join(f"{value:>6}" for value in ratios)
        print(f"{row}  {verdict:<15} {side.reference}".rstrip())
    for note in group.notes:
        print(textwrap.fill(note, 98, initial_indent="  note: ", subsequent_indent="        "))
    print()


# --- groups -------------------------------------------------------------------------------


def local_group(folder: pathlib.Path, stack: contextlib.ExitStack) -> Group:
    from dew.tracking import LocalTracker

    tracker = stack.enter_context(LocalTracker(folder / "dew"))
    log_metrics = tracker.log_metrics

    def dew_report(values: dict[str, float], step: int) -> None:
        log_metrics(values, step=step)

    journal = stack.enter_context((folder / "bare.jsonl").open("a", encoding="utf-8"))
    dumps, write, flush = json.dumps, journal.write, journal.flush

    def bare_report(values: dict[str, float], step: int) -> None:
        write(dumps({"step": step, "values": values}) + "\n")
        flush()

    peer = "bare JSONL line + flush"
    return Group(
        "local journal",
        "local",
        [
            Side("dew LocalTracker", dew_report, reference=f"guide {GUIDE_REFERENCE['local']}"),
            Side(peer, bare_report, reference=f"design {DESIGN_REFERENCE['jsonl']}"),
        ],
        peer,
    )


def tensorboard_group(folder: pathlib.Path, stack: contextlib.ExitStack) -> Group:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from dew.tracking import TensorBoardTracker

    tracker = stack.enter_context(TensorBoardTracker(folder / "dew"))
    log_metrics = tracker.log_metrics

    def dew_report(values: dict[str, float], step: int) -> None:
        log_metrics(values, step=step)

    event_type, summary_type = event_pb2.Event, summary_pb2.Summary
    value_type = summary_type.Value
    metadata = scalar_metadata.create_summary_metadata("", "")

    def bare_writer(name: str, flush_each: bool) -> Side:
        writer = EventFileWriter(str(folder / name))
        stack.callback(writer.close)
        add_event, flush, now = writer.add_event, writer.flush, time.time
        # The first event of a tag carries the scalar plugin's metadata, as dew's does;
        # it is written here, before the warm-up, so the timed events are plain ones.
        first = [value_type(tag=tag, simple_value=0.0, metadata=metadata) for tag in TAGS]
        add_event(event_type(wall_time=now(), step=0, summary=summary_type(value=first)))
        flush()

        def report(values: dict[str, float], step: int) -> None:
            summary = summary_type(
                value=[value_type(tag=t, simple_value=v) for t, v in values.items()]
            )
            add_event(event_type(wall_time=now(), step=step, summary=summary))
            if flush_each:
                flush()

        label = "EventFileWriter + flush" if flush_each else "EventFileWriter, no flush"
        finish = (lambda: None) if flush_each else flush
        return Side(label, report, finish, reference=f"design {DESIGN_REFERENCE['efw']} (?)")

    peer = "EventFileWriter + flush"
    sides = [
        Side(
            "dew TensorBoardTracker",
            dew_report,
            reference=f"guide {GUIDE_REFERENCE['tensorboard']}",
        ),
        bare_writer("bare-flush", flush_each=True),
        bare_writer("bare-noflush", flush_each=False),
    ]
    notes = [
        "dew flushes every report to the file before log_metrics returns; "
        "'EventFileWriter + flush' is its like-for-like peer (the target's ratio). "
        "'no flush' is the writer's asynchronous best case (one flush per round, timed).",
        "design's 0.070 ms reference does not say whether it flushed each event (hence '?').",
    ]
    if available("tensorboardX"):
        from tensorboardX import SummaryWriter

        for flush_each in (False, True):
            writer = SummaryWriter(str(folder / f"tbx-{int(flush_each)}"))
            stack.callback(writer.close)
            sides.append(tensorboardx_side(writer, flush_each))
    else:
        notes.append("tensorboardX is not installed: its sides are skipped.")
    return Group("tensorboard", "tensorboard", sides, peer, notes)


def tensorboardx_side(writer: Any, flush_each: bool) -> Side:
    add_scalar, flush = writer.add_scalar, writer.flush

    def report(values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            add_scalar(tag, value, step)
        if flush_each:
            flush()

    if flush_each:
        return Side("tensorboardX add_scalar x6 + flush", report)
    return Side(
        "tensorboardX add_scalar x6",
        report,
        flush,
        reference=f"design {DESIGN_REFERENCE['tbx']}",
    )


@contextlib.contextmanager
def file_store_allowed() -> Iterator[None]:
    previous = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = previous


def mlflow_group(uri: str, kind: str, stack: contextlib.ExitStack) -> Group:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from dew.tracking import MLflowTracker

    started = time.perf_counter()
    tracker = stack.enter_context(MLflowTracker("tracker-cost", "dew", uri=uri))
    log_metrics = tracker.log_metrics

    def dew_report(values: dict[str, float], step: int) -> None:
        log_metrics(values, step=step)

    # Built on the URI dew resolved, so MLflow hands both clients the same cached store.
    with file_store_allowed() if tracker.file_store else contextlib.nullcontext():
        client = MlflowClient(tracking_uri=tracker.uri)
        run_id = client.create_run(tracker.experiment_id, run_name="bare").info.run_id
    stack.callback(client.set_terminated, run_id)
    setup = time.perf_counter() - started
    log_batch, now = client.log_batch, time.time

    def bare_report(values: dict[str, float], step: int) -> None:
        timestamp = int(now() * 1000)
        metrics = [Metric(tag, value, timestamp, step) for tag, value in values.items()]
        log_batch(run_id, metrics=metrics, synchronous=True)

    notes = [f"store, experiment and both runs set up in {setup:.2f} s (not timed)."]
    if kind == "sqlite":
        notes.append(
            "wall time includes SQLite's fdatasync waits (MLflow commits several transactions "
            "per log_batch), which follow the host's disk load; 'cpu' leaves them out."
        )
    key = "mlflow-file" if kind == "file" else "mlflow-sqlite"
    peer = "MlflowClient.log_batch"
    dew_reference = f"guide {GUIDE_REFERENCE[key]}" if key in GUIDE_REFERENCE else ""
    return Group(
        f"mlflow ({'file store' if kind == 'file' else 'sqlite'}: {tracker.uri})",
        "mlflow",
        [
            Side("dew MLflowTracker", dew_report, reference=dew_reference),
            Side(peer, bare_report, reference=f"design {DESIGN_REFERENCE[key]}"),
        ],
        peer,
        notes,
    )


def quiet_mlflow() -> None:
    """Keep MLflow's and Alembic's start-up chatter (store migrations, notices) off the table."""
    import mlflow  # noqa: F401  (configures its loggers on import; quieten them after)

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="mlflow")


GROUPS = ("local", "tensorboard", "mlflow-file", "mlflow-sqlite")


def plans_for(args: argparse.Namespace, root: pathlib.Path) -> tuple[list[Plan], list[str]]:
    """The groups to time, and a line for each group skipped for want of its library."""
    only = set(args.only or GROUPS)
    plans, skipped = [], []
    if "local" in only:
        plans.append(
            Plan("local", args.rounds_local, args.reports, lambda s: local_group(root / "local", s))
        )
    if "tensorboard" in only:
        if available("tensorboard"):
            plans.append(
                Plan(
                    "tensorboard",
                    args.rounds_tensorboard,
                    args.reports,
                    lambda s: tensorboard_group(root / "tensorboard", s),
                )
            )
        else:
            skipped.append("== tensorboard: skipped, TensorBoard is not installed ==")
    for kind in ("file", "sqlite"):
        if f"mlflow-{kind}" not in only:
            continue
        if not available("mlflow"):
            skipped.append(f"== mlflow ({kind}): skipped, MLflow is not installed ==")
            continue
        folder = root / f"mlflow-{kind}"
        folder.mkdir()
        if kind == "file":
            uri, rounds, reports = str(folder / "mlruns"), args.rounds_mlflow, args.reports
        else:
            uri = f"sqlite:///{folder / 'mlflow.db'}"
            rounds, reports = args.rounds_sqlite, args.reports_sqlite
        plans.append(
            Plan(f"mlflow-{kind}", rounds, reports, lambda s, u=uri, k=kind: mlflow_group(u, k, s))
        )
    return plans, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 100 reports, 1 round")
    parser.add_argument("--reports", type=int, default=1000, help="reports per side per round")
    parser.add_argument("--reports-sqlite", type=int, default=125, help="the same, SQLite store")
    parser.add_argument("--warmup", type=int, default=50, help="untimed reports per side")
    parser.add_argument("--rounds-local", type=int, default=41)
    parser.add_argument("--rounds-tensorboard", type=int, default=9)
    parser.add_argument("--rounds-mlflow", type=int, default=11, help="rounds, file store")
    parser.add_argument("--rounds-sqlite", type=int, default=8, help="rounds, SQLite store")
    parser.add_argument(
        "--only", choices=GROUPS, action="append", help="time only these groups (repeatable)"
    )
    args = parser.parse_args()
    if args.quick:
        args.reports = args.reports_sqlite = 100
        args.warmup = 10
        args.rounds_local = args.rounds_tensorboard = args.rounds_mlflow = args.rounds_sqlite = 1
    rng = random.Random(SEED)
    began = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="dew-tracker-cost-") as temporary:
        plans, skipped = plans_for(args, pathlib.Path(temporary))
        header(args, plans, temporary)
        for line in skipped:
            print(line + "\n")
        if any(plan.name.startswith("mlflow") for plan in plans):
            quiet_mlflow()
        for plan in plans:
            with contextlib.ExitStack() as stack:
                group = plan.build(stack)
                measure(group, plan, args.warmup, rng)
            show(group, plan)

    print(
        "ms per report: 'median' and 'best' of the rounds' wall time, 'cpu' the median process\n"
        "CPU time (all threads, so a writer thread's work counts; waits on the disk do not).\n"
        "dew / side: 'median' = ratio of the median wall times (the one read against the\n"
        "target), 'paired' = median of the per-round ratios (each dew round against the same\n"
        "round of the side), 'best' = ratio of the best rounds, 'cpu' = ratio of median CPU.\n"
        "> 1 means dew is slower. Reference figures, ms per report: 'design' = DESIGN.md\n"
        "(2-core CPU, the bare peers), 'guide' = the user guide (dew's trackers, i9-12900K)."
    )
    print(f"load avg at the end: {load_average()}; wall time {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
