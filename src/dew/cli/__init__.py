"""The `dew` command: `dew train`, `dew sweep`, `dew eval`, `dew runs`, `dew data`, `dew sample`,
`dew predict` and `dew export`.

- `dew train [--config] [CONFIG]`: train a run configuration, a TOML file or a built-in
  name (`dew.config.BUILTIN_CONFIGS`: `tiny_lm`, the default, `tiny_diffusion`, ...), as
  an ordinary recipe run under `<trainer.checkpoint_dir>/<trainer.name>`.
- `dew sweep [--config] CONFIG SPACE.toml`: one trial per point of the space, with a
  ledger; several `dew sweep --search optuna --storage URL` workers share one study, and
  `--workers N` starts N local workers (`_workers`).
- `dew eval RUN_DIR`: score a run's latest checkpoint (`--step N`: that one; `--metrics a,b`:
  those metrics) on its validation data (`--split train`: every training row once, in row
  order; `--batches N`: the split's first N batches).
- `dew runs [FOLDER]`: a table of the runs under a folder, the hyperparameters that differ
  and their final metrics (a sweep: its best trial); `--sort`, `--filter`, `--json`.
- `dew config show [CONFIG]`: a configuration (a built-in name, a TOML file, a run folder)
  as the TOML `dew train` reads; `dew --version` prints dew's version.
- `dew plot RUN_DIR`: render a run's plots from its local journal (`_plot`).
- `dew sample RUN`: draw from an LM (prompts, decoded with the run's tokenizer) or a
  diffusion run (a labelled grid of the classes asked for), with the sampling protocol beside
  each file (`_sample`).
- `dew predict RUN --input PATH`: a classifier run's top classes for new rows (`.npy`,
  `.npz`, images) as CSV or JSON Lines (`_predict`); `dew export RUN --format
  safetensors|stablehlo --out DIR`: the run's parameters or forward function (`_export`).
- `dew data inspect CONFIG_OR_RUN`: the data a run trains on, its split sizes, fingerprints
  and one batch decoded (`_inspect`, `_contact_sheet`); `dew data tokenizer FILES`: a BPE
  `tokenizer.json` trained on your files (`_data_command`).

Every command that reads a configuration (train, sweep, eval, config show, data inspect) first
imports the installed `dew.plugins` entry points and the modules `--import` names (`_inputs.
_register`; `dew._plugins`), then those the configuration's `trainer.imports` names; `--help`
imports neither.

`dew train` and `dew sweep` take `--tracker local,tensorboard,mlflow,wandb` (`_trackers`):
the trackers added to the run folder's local journal, which is always written, each registered
once with its library, extra and options in `_tracker_options`.

`dew train`, `dew sweep` and `dew eval` run as several processes of one `jax.distributed`
run: `--processes N` starts N local processes (`dew._launch`); on a cluster each process
runs the command itself with `--coordinator-address`, `--num-processes` and `--process-id`,
the `JAX_COORDINATOR_ADDRESS` family of variables, or `--distributed` (JAX's detection of
SLURM, Cloud TPU, Open MPI). Only process zero prints and writes.

The package: `_parser` (the arguments), `_inputs` (reading the config and its overrides),
`_commands` (train, sweep, eval), `_runs` (`dew runs`), `_console` (what
the commands print around a run), `_cluster` (joining a multi-process run), `_errors` (which
errors are the user's, as one line); `main` here runs a command or launches its processes,
importing the command's module (`_COMMANDS`) only when that command runs: the commands that
compute nothing (`--help`, `--version`, `dew runs`, `dew plot`) never import JAX.
"""

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from dew._nonfinite import nonfinite_advice
from dew.cli._cluster import _check_processes, _join, cluster_settings
from dew.cli._errors import (
    _caused_by_user,
    _message,
    advise,
    one_line_warnings,
    reader_gone,
    stop_writing,
)
from dew.cli._inputs import _config_arguments, _register
from dew.cli._parser import PROCESS_TIMEOUT as PROCESS_TIMEOUT
from dew.cli._parser import _parser

__all__ = ["main"]

_RESUMABLE = ("train", "sweep")  # a run or sweep Ctrl-C stops resumes when run again

# Each command and the function that runs it, imported when that command runs: `dew --help`,
# `dew runs`, `dew config show` and `dew plot` never import what `dew train` computes with.
_COMMANDS = {
    "train": ("dew.cli._commands", "_train"),
    "sweep": ("dew.cli._commands", "_sweep"),
    "eval": ("dew.cli._commands", "_eval"),
    "runs": ("dew.cli._runs", "_runs"),
    "plot": ("dew.cli._plot", "_plot"),
    "config": ("dew.cli._config_command", "_config"),
    "data": ("dew.cli._data_command", "_data"),
    "sample": ("dew.cli._sample", "_sample"),
    "predict": ("dew.cli._predict", "_predict"),
    "export": ("dew.cli._export", "_export"),
}


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs the command `name` (a key of `_COMMANDS`)."""
    module, function = _COMMANDS[name]
    return getattr(importlib.import_module(module), function)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dew` console script.

    A user-caused failure (a missing, misplaced or unwritable path, a bad value or file) is
    one line `dew <command>: <message>` on stderr and exit status 2; Ctrl-C is one line and
    exit status 130, and a run or sweep it stops resumes when the command runs again. Other
    errors are bugs and keep their traceback. `dew train`'s Ctrl-C line names the step the
    fit stopped at (a checkpoint of it is saved) and the step the same command resumes from.

    `--processes N` runs the command as N local processes (`dew._launch.launch`); the
    cluster flags and variables (`cluster_settings`) join this process to a multi-process
    run (`dew.distributed.initialize`) before any other JAX work.
    """
    from dew._launch import LAUNCHED_ENV, watch_launcher

    if os.environ.get(LAUNCHED_ENV):  # a launched process dies with its launcher
        watch_launcher()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in _RESUMABLE:
        _config_arguments(args.command_parser, args)
    for option in ("steps", "trials", "batches", "vocab_size"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            parser.error(f"--{option.replace('_', '-')} must be >= 1, got {value}")
    for option in ("step", "rows", "min_frequency"):
        value = getattr(args, option, None)
        if args.command == "data" and value is not None and value < 0:
            parser.error(f"--{option.replace('_', '-')} must be >= 0, got {value}")
    launched = bool(os.environ.get(LAUNCHED_ENV))
    if getattr(args, "workers", None) is not None and not launched:
        from dew.cli._workers import check_workers, launch_workers

        check_workers(args.command_parser, args)
        return launch_workers(args, argv, lambda step: _outcome(args, launched, step))
    if hasattr(args, "processes"):
        _check_processes(args.command_parser, args)
        if args.processes is not None and not launched:
            from dew._launch import child_command, launch

            checked = _outcome(args, launched, lambda: _preflight(args))
            if checked != 0:  # one line here rather than the same error from every process
                return checked
            return launch(
                child_command(argv),
                args.processes,
                label=f"dew {args.command}",
                timeout=args.process_timeout,
            )
    joined = False

    def run() -> int:
        nonlocal joined
        if hasattr(args, "processes"):
            settings = cluster_settings(args, os.environ)
            if settings is not None:
                _join(settings, args.initialization_timeout, f"dew {_command_words(args)}")
                joined = True
        if getattr(args, "registers", False):  # before any configuration is read
            _register(args)
        command = _command(args.command)
        with nonfinite_advice("--on-nonfinite continue"):  # the command's switch, not Python's
            return command(args)

    try:
        code = _outcome(args, launched, run)
    except BaseException:
        if joined:  # a bug's traceback, then out at once (see below)
            traceback.print_exc()
            _leave(1)
        raise
    if joined and code != 0:
        # A failing process of a multi-process run leaves without jax.distributed's
        # shutdown barrier, which would hold it until every peer arrives (and a peer
        # blocked in a collective never does): its launcher then sees it fail.
        _leave(code)
    return code


def _preflight(args: argparse.Namespace) -> int:
    """Before starting local processes, the checks of the user's input that need no JAX
    (the config, the sweep's space, the run folder's run.json, that no other run holds the
    run folder); 0 when they pass."""
    from dew.cli._commands import _sweep_inputs, _train_config

    _register(args)
    if args.command == "train":
        from dew._lock import check_unlocked
        from dew._run_folder import run_folder

        config = _train_config(args)
        check_unlocked(run_folder(config, config.trainer.name)[1])
    elif args.command == "sweep":
        _sweep_inputs(args)
    else:
        from dew._run_folder import RunFolder
        from dew.config import RunConfig

        RunConfig.from_run_record(RunFolder(args.run_dir).run_record)
    return 0


def _outcome(args: argparse.Namespace, launched: bool, run: Callable[[], int]) -> int:
    """`run()`'s status; a user-caused error or Ctrl-C becomes one line and a status, and
    each warning of dew's one line; a pipe closed on standard output (`dew runs | head`)
    ends the command normally."""
    name = _command_words(args)
    try:
        with one_line_warnings(name):
            code = run()
            sys.stdout.flush()  # what is buffered, while a closed pipe can still be told apart
        return code
    except BrokenPipeError as error:
        if not reader_gone():  # another pipe or socket: the error it is
            print(f"dew {name}: {_message(error)}", file=sys.stderr)
            return 2
        stop_writing()
        return 0
    except KeyboardInterrupt as interrupt:
        if not launched:  # a launched process leaves the one line to its launcher
            print(f"dew {name}: {_interrupted(args.command, interrupt)}", file=sys.stderr)
        return 130
    except Exception as error:
        if not _caused_by_user(error):
            raise
        advise(error)
        print(f"dew {name}: {_message(error)}", file=sys.stderr)
        return 2


def _command_words(args: argparse.Namespace) -> str:
    """The command's words after `dew` (`train`, `config show`, `data inspect`), which head
    its one-line errors and warnings."""
    action = getattr(args, "config_action", None) or getattr(args, "data_action", None)
    return f"{args.command} {action}" if action else args.command


def _interrupted(command: str, interrupt: KeyboardInterrupt) -> str:
    """The one line after Ctrl-C: the step a `dew train` fit stopped at and the step the
    same command resumes from, when the fit said (`dew.training.FitInterrupted`)."""
    from dew._interrupts import FitInterrupted

    if command not in _RESUMABLE:
        return "interrupted"
    if command != "train" or not isinstance(interrupt, FitInterrupted):
        return "interrupted; run the same command again to resume"
    if interrupt.saved is not None:
        resume = f"the same command resumes from step {interrupt.saved}"
    elif interrupt.step == 0:
        resume = "the same command starts the run"
    else:  # a second Ctrl-C cut the save short
        resume = "the same command resumes from the latest complete checkpoint"
    return f"interrupted at step {interrupt.step}; {resume}"


def _leave(code: int) -> NoReturn:
    """Exit now with `code`, output flushed, skipping the interpreter's exit handlers."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
