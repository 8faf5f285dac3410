"""`dew sweep --workers N`: N local sweep workers, each an independent `dew sweep` process
training one trial at a time, on one ledger and, with Optuna search, one storage (decision
0054). The workers start as `--processes` starts its processes (`dew._launch.launch`), with
the same failure handling: a failing worker is named and stops the others, Ctrl-C stops them
all, and the same command run again continues the sweep."""

import argparse
import math
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any


def check_workers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a bad `--workers` (exit 2)."""
    if args.workers is None:
        return
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    given = [
        flag
        for flag, name in (
            ("--processes", "processes"),
            ("--coordinator-address", "coordinator_address"),
            ("--num-processes", "num_processes"),
            ("--process-id", "process_id"),
            ("--distributed", "distributed"),
        )
        if getattr(args, name) not in (None, False)
    ]
    if given:
        parser.error(
            f"--workers starts independent sweep workers; it does not combine with "
            f"{', '.join(given)} (a worker trains its trials in one process)"
        )


def _worker_arguments(args: argparse.Namespace, config: Any) -> list[str]:
    """What each worker adds to the command line: with Optuna search and no `--storage`,
    one SQLite storage in the sweep's folder (`study.db`) and its study name."""
    if args.search != "optuna" or args.storage is not None:
        return []
    from dew._run_folder import run_folder

    _, local = run_folder(config, config.trainer.name)
    local.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{(local / 'study.db').resolve()}"
    return ["--storage", storage, "--study-name", args.study_name or config.trainer.name]


def launch_workers(
    args: argparse.Namespace,
    argv: Sequence[str],
    outcome: Callable[[Callable[[], int]], int],
) -> int:
    """Check the sweep's input once, start `args.workers` workers and, once every one ended
    well, print the ledger's trials and the best one. `outcome` runs a step with the
    command's one-line errors."""
    from dew._launch import child_command, launch
    from dew.cli._commands import WORKER_ENV, _ledger_path, _sweep_inputs
    from dew.cli._inputs import _register

    prepared: dict[str, Any] = {}

    def prepare() -> int:
        _register(args)
        config, _ = _sweep_inputs(args)
        prepared["config"] = config
        prepared["extra"] = _worker_arguments(args, config)
        prepared["ledger"] = _ledger_path(args, config)
        return 0

    checked = outcome(prepare)
    if checked != 0:
        return checked
    # The workers' ledger is the one path, whatever folder each resolves it from.
    ledger = str(pathlib.Path(prepared["ledger"]).resolve())
    command = child_command([*argv, *prepared["extra"], "--ledger", ledger])
    env = {**os.environ, WORKER_ENV: "1"}
    code = launch(
        command,
        args.workers,
        label="dew sweep",
        timeout=args.process_timeout,
        env=env,
        straggler=None,  # a worker with no trial left ends while the others train theirs
        distributed=False,
    )
    if code == 0:
        return outcome(lambda: _summary(args, ledger))
    return code


def _summary(args: argparse.Namespace, ledger: str) -> int:
    """The ledger's finished trials and the best one, as `dew sweep` prints them."""
    from dew.cli._commands import trial_summary
    from dew.config.sweep._ledger import read_ledger

    read = read_ledger(ledger)
    finished = read.state.finished
    metric = args.metric or "score"
    for _, trial in sorted(finished.items()):
        print(trial_summary(trial, metric))
    # in index order: of trials that tie, the first is the best (`dew runs` picks it too)
    scored = [t for _, t in sorted(finished.items()) if not math.isnan(t.value) and not t.pruned]
    if scored:  # by the direction the workers recorded (--direction, else the metric's)
        pick = max if read.direction == "maximize" else min
        best = pick(scored, key=lambda trial: trial.value)
        print(f"best trial {best.index}  {metric} {best.value:.4f}  {best.overrides}")
    sys.stdout.flush()
    return 0
