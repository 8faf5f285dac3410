"""The `dew` command: `dew train`, `dew sweep`, `dew eval` and `dew runs`.

- `dew train [--config] [CONFIG]`: train a run configuration, a TOML file or a built-in
  name (`dew.config.BUILTIN_CONFIGS`: `tiny_lm`, the default, `tiny_diffusion`, ...), as
  an ordinary recipe run under `<trainer.checkpoint_dir>/<trainer.name>`.
- `dew sweep [--config] CONFIG SPACE.toml`: one trial per point of the space, with a
  ledger; several `dew sweep --search optuna --storage URL` workers share one study.
- `dew eval RUN_DIR`: score a run's latest checkpoint on its validation data.
- `dew runs [FOLDER]`: a table of the runs under a folder with their final metrics.

`dew train`, `dew sweep` and `dew eval` run as several processes of one `jax.distributed`
run: `--processes N` starts N local processes (`dew._launch`); on a cluster each process
runs the command itself with `--coordinator-address`, `--num-processes` and `--process-id`,
the `JAX_COORDINATOR_ADDRESS` family of variables, or `--distributed` (JAX's detection of
SLURM, Cloud TPU, Open MPI). Only process zero prints and writes.
"""

import argparse
import contextlib
import errno
import math
import os
import pathlib
import sys
import tomllib
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

__all__ = ["main"]

_RESUMABLE = ("train", "sweep")  # a run or sweep Ctrl-C stops resumes when run again


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dew", description="Train, evaluate and track models.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a run configuration (default: tiny_lm)")
    train.add_argument("config", nargs="?", help=f"{_CONFIG_HELP} (default: tiny_lm)")
    _run_options(train)
    _process_options(train)

    sweep = commands.add_parser(
        "sweep",
        help="search a hyperparameter space",
        usage="dew sweep [options] [--config] CONFIG SPACE",
    )
    sweep.add_argument("config", nargs="?", help=_CONFIG_HELP)
    sweep.add_argument("space", nargs="?", help="a TOML file: dotted paths to choices or ranges")
    _run_options(sweep)
    sweep.add_argument("--trials", type=int, required=True, help="the trial budget (>= 1)")
    sweep.add_argument("--search", choices=("grid", "random", "optuna"), default="random")
    sweep.add_argument("--search-seed", type=int, default=0, help="random search's seed")
    sweep.add_argument("--ledger", help="default: <checkpoint_dir>/<name>/ledger.json")
    sweep.add_argument("--storage", help="an Optuna storage URL shared by several workers")
    sweep.add_argument("--study-name", help="the Optuna study (needed with --storage)")
    sweep.add_argument("--metric", help="the score: a validation (else training) metric")
    sweep.add_argument("--direction", choices=("minimize", "maximize"), default="minimize")
    _process_options(sweep)

    evaluate = commands.add_parser("eval", help="score a run's latest checkpoint")
    evaluate.set_defaults(command_parser=evaluate)
    evaluate.add_argument("run_dir", help="a run folder (it holds run.json)")
    _process_options(evaluate)

    runs = commands.add_parser("runs", help="list runs and their final metrics")
    runs.add_argument("folder", nargs="?", default="runs", help="where to look (default runs)")
    return parser


_CONFIG_HELP = "a RunConfig TOML file or a built-in configuration's name"


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(command_parser=parser)  # its usage heads the errors about its arguments
    parser.add_argument(
        "--config", dest="config_option", metavar="CONFIG", help=f"{_CONFIG_HELP} (as CONFIG)"
    )
    parser.add_argument("--name", help="the run name (overrides trainer.name)")
    parser.add_argument("--steps", type=int, help="optimizer steps (overrides trainer.steps)")
    parser.add_argument("--checkpoint-dir", help="overrides trainer.checkpoint_dir")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a dotted path with a TOML value, e.g. --set optim.learning_rate=0.01",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-step lines or progress bar")


PROCESS_TIMEOUT = 86400.0
"""`--process-timeout`'s default: a day, the longest a local multi-process run may take."""


def _process_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "multi-process runs (jax.distributed)",
        "--processes N starts N local processes of this command; on a cluster each process "
        "runs the command with the coordinator's address, the process count and its index "
        "(or the JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID variables), or "
        "with --distributed to let JAX detect them (SLURM, Cloud TPU, Open MPI).",
    )
    group.add_argument(
        "--processes", type=int, metavar="N", help="start N local processes of this command"
    )
    group.add_argument(
        "--process-timeout",
        type=float,
        default=PROCESS_TIMEOUT,
        metavar="SECONDS",
        help="with --processes: stop every process when the run takes longer (default a day)",
    )
    group.add_argument(
        "--coordinator-address", metavar="HOST:PORT", help="process zero's host and a free port"
    )
    group.add_argument("--num-processes", type=int, metavar="N", help="the run's process count")
    group.add_argument("--process-id", type=int, metavar="I", help="this process's index")
    group.add_argument(
        "--distributed",
        action="store_true",
        help="join a jax.distributed run JAX finds in the environment (SLURM, Cloud TPU, ...)",
    )


_CLUSTER_FLAGS = ("coordinator_address", "num_processes", "process_id", "distributed")
_CLUSTER_ENV = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_processes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad `--processes`, `--process-timeout` and cluster flag values (exit 2)."""
    if args.processes is not None:
        if args.processes < 1:
            parser.error(f"--processes must be >= 1, got {args.processes}")
        given = [_flag(name) for name in _CLUSTER_FLAGS if getattr(args, name) not in (None, False)]
        if given:
            parser.error(
                f"--processes starts local processes; it does not combine with {', '.join(given)}"
                " (a cluster's processes each run the command with those instead)"
            )
    if not args.process_timeout > 0:  # NaN too
        parser.error(f"--process-timeout must be > 0 seconds, got {args.process_timeout}")
    if args.num_processes is not None and args.num_processes < 1:
        parser.error(f"--num-processes must be >= 1, got {args.num_processes}")
    if args.process_id is not None and args.process_id < 0:
        parser.error(f"--process-id must be >= 0, got {args.process_id}")
    if args.coordinator_address is not None:
        problem = _address_problem(args.coordinator_address)
        if problem:
            parser.error(f"--coordinator-address {problem}")


def _address_problem(text: str) -> str | None:
    """What is wrong with `text` as a coordinator's HOST:PORT, or None."""
    host, separator, port = text.rpartition(":")
    if not separator or not host or host in ("[", "[]") or not port.isdigit():
        return f"must be HOST:PORT (e.g. 10.0.0.1:1234), got {text!r}"
    if not 0 < int(port) < 65536:
        return f"has port {port}; a port is 1 to 65535 (got {text!r})"
    return None


def cluster_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The arguments of `dew.distributed.initialize` the flags and environment ask for, or
    `None` when this is a one-process run: the cluster flags win over the
    `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` variables, and
    `--distributed` with nothing else leaves everything to JAX's cluster detection.

    **Raises:** `ValueError` naming the flag or variable when a value is malformed, an index
    is out of range, or a count or index is missing without `--distributed`.
    """
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, variable in _CLUSTER_ENV.items():
        value = getattr(args, name, None)
        if value is not None:
            settings[name], sources[name] = value, _flag(name)
            continue
        text = environ.get(variable, "").strip()
        if not text:
            continue
        sources[name] = variable
        if name == "coordinator_address":
            problem = _address_problem(text)
            if problem:
                raise ValueError(f"{variable} {problem}.")
            settings[name] = text
        else:
            try:
                settings[name] = int(text)
            except ValueError:
                raise ValueError(f"{variable} must be a whole number, got {text!r}.") from None
    detect = bool(getattr(args, "distributed", False))
    if not settings and not detect:
        return None
    count, index = settings.get("num_processes"), settings.get("process_id")
    if count is not None and count < 1:
        raise ValueError(f"{sources['num_processes']} must be >= 1, got {count}.")
    if index is not None and not (index >= 0 and (count is None or index < count)):
        allowed = "0 or more" if count is None else f"0 to {count - 1} ({count} processes)"
        raise ValueError(f"{sources['process_id']} must be {allowed}, got {index}.")
    missing = [name for name in _CLUSTER_ENV if name not in settings]
    if missing and not detect:
        wanted = ", ".join(f"{_flag(name)} (or {_CLUSTER_ENV[name]})" for name in missing)
        given = ", ".join(sources.values())
        raise ValueError(
            f"{given} joins a multi-process run, which also needs {wanted}; or pass "
            "--distributed to let JAX detect them from the cluster (SLURM, Cloud TPU, Open MPI)."
        )
    return {name: settings.get(name) for name in _CLUSTER_ENV}


def _join(settings: Mapping[str, Any]) -> None:
    """`dew.distributed.initialize` with `settings`, its failures as one clear error."""
    from dew.distributed import initialize

    where = settings["coordinator_address"] or "the address JAX detects"
    try:
        initialize(**settings)
    except ValueError as error:  # JAX's: nothing detected, or values it refuses
        raise ValueError(
            f"cannot join the multi-process run ({error}); give --coordinator-address, "
            "--num-processes and --process-id (or their JAX_* variables), or run under a "
            "cluster JAX detects (SLURM, Cloud TPU, Open MPI) with --distributed."
        ) from error
    except RuntimeError as error:  # the coordinator never answered, or peers never came
        raise ConnectionError(
            f"cannot join the multi-process run at {where}: {_message(error)}"
        ) from error


def _say(*values: Any, **options: Any) -> None:
    """`print` on process zero only: the other processes of a run stay quiet."""
    from dew._processes import is_process_zero

    if is_process_zero():
        print(*values, **options)


class _BadInputError(ValueError):
    """A TypeError or KeyError dew's validation raised while reading the user's files and
    options: user-caused, unlike the same types raised while training (bugs)."""


@contextlib.contextmanager
def _reading(path: str | None = None) -> Iterator[None]:
    """Turn dew's TypeError and KeyError about the user's input into `_BadInputError`, naming
    the file `path` it came from."""
    try:
        yield
    except (TypeError, KeyError, ValueError) as error:
        if path is not None and path not in _message(error):
            error.add_note(f"(in {path})")
        if isinstance(error, ValueError):
            raise
        raise _BadInputError(_message(error)) from error


def _toml_value(text: str, where: str) -> Any:
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string: --set optim.optimizer=sgd


def _config_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Settle `args.config` (and a sweep's `args.space`) from the positional arguments and
    `--config`, which names the config instead of the first positional one."""
    option = getattr(args, "config_option", None)
    if args.command == "sweep":
        given = [value for value in (option, args.config, args.space) if value is not None]
        if len(given) != 2:
            parser.error(
                "dew sweep takes a CONFIG (a TOML file or a built-in name, as the first "
                f"argument or --config) and a SPACE file, got {given}"
            )
        args.config, args.space = given
    elif option is not None:
        if args.config is not None:
            parser.error(f"give the config once, not both {args.config!r} and --config {option!r}")
        args.config = option


def _run_config(value: str) -> Any:
    """The run configuration `value` names: a built-in configuration's name, else a TOML
    file; a missing file says that `value` is no built-in name either, and lists them."""
    from dew.config import BUILTIN_CONFIGS, RunConfig, builtin

    if value in BUILTIN_CONFIGS:
        return builtin(value)
    try:
        return RunConfig.load(value)
    except FileNotFoundError as error:
        error.add_note(
            f"(the config {value!r} is neither a file nor a built-in configuration's name; "
            f"the built-in ones are {', '.join(BUILTIN_CONFIGS)})"
        )
        raise


def _configure(args: argparse.Namespace) -> Any:
    from dew.config import override

    with _reading():
        config = _run_config("tiny_lm" if args.config is None else args.config)
        point: dict[str, Any] = {}
        for item in args.set:
            path, separator, text = item.partition("=")
            if not separator or not path:
                raise ValueError(f"--set takes PATH=VALUE, got {item!r}.")
            point[path.strip()] = _toml_value(text.strip(), path)
        if args.name is not None:
            point["trainer.name"] = args.name
        if args.steps is not None:
            point["trainer.steps"] = args.steps
        if args.checkpoint_dir is not None:
            point["trainer.checkpoint_dir"] = args.checkpoint_dir
        return override(config, point) if point else config


def _summary(history: Mapping[str, Sequence[tuple[int, float]]]) -> str:
    return "  ".join(f"{tag} {series[-1][1]:.4f}" for tag, series in history.items() if series)


def _default_metrics(config: Any) -> tuple[Any, tuple[Any, ...], dict[str, str]]:
    """The configured objective (on shapes), its default metrics (built once: FID loads
    its weights here) and those it skips, each skipped one reported on one line."""
    from dew.config import objective_shapes
    from dew.objectives.base import SkipsMetrics

    objective = objective_shapes(config)
    skipped = objective.skipped_metrics() if isinstance(objective, SkipsMetrics) else {}
    for name, why in skipped.items():
        _say(f"{name} skipped: {why}")
    return objective, tuple(objective.default_metrics()), skipped


def _train_config(args: argparse.Namespace) -> Any:
    config = _configure(args)
    if config.trainer.name is None:
        raise ValueError("dew train needs a run name: set trainer.name or pass --name.")
    return config


def _train(args: argparse.Namespace) -> int:
    from dew.config._recipe import run_folder

    config = _train_config(args)
    name = config.trainer.name
    _, metrics, _ = _default_metrics(config)
    state = config.train(metrics=metrics, progress=not args.quiet)
    _, folder = run_folder(config, name)
    _say(f"step {int(state.step)}  {_summary(state.metric_history)}")
    _say(f"run folder {folder}")
    return 0


def _space(path: str) -> dict[str, Any]:
    from dew.config.sweep import IntUniform, Uniform

    with open(path, "rb") as handle:
        try:
            tree = tomllib.load(handle)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path} is not valid TOML: {error}.") from None
    space: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and "low" in value and "high" in value:
            unknown = sorted(set(value) - {"low", "high", "log", "type"})
            if unknown:
                raise ValueError(
                    f"{path}: the range at {prefix!r} has unknown keys {unknown}; a range takes "
                    "low, high, log and type ('float' or 'int')."
                )
            kind = value.get("type", "float")
            if kind not in ("float", "int"):
                raise ValueError(
                    f"{path}: the range at {prefix!r} has type {kind!r}; use 'float' or 'int'."
                )
            log = bool(value.get("log", False))
            if kind == "int":
                space[prefix] = IntUniform(value["low"], value["high"], log=log)
            else:  # TOML writes 1 for 1.0
                space[prefix] = Uniform(_number(value["low"]), _number(value["high"]), log=log)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)
        else:
            space[prefix] = value

    walk("", tree)
    return space


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _search(args: argparse.Namespace) -> Any:
    from dew.config.sweep import grid_search, optuna_search, random_search

    if args.search == "grid":
        return grid_search
    if args.search == "random":
        return random_search(seed=args.search_seed)
    try:  # the command, unlike the library, keeps Optuna's per-study INFO lines quiet
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
    except ImportError:
        pass  # optuna_search raises its own error naming the extra
    return optuna_search(storage=args.storage, study_name=args.study_name, direction=args.direction)


def _score(history: Mapping[str, Sequence[tuple[int, float]]], metric: str) -> float:
    from dew.naming import Split, parse_metric_tag

    for split in (Split.VALIDATION, Split.TRAIN):
        for tag, series in history.items():
            parsed = parse_metric_tag(tag)
            if (parsed.split, parsed.metric) == (split, metric) and series:
                return float(series[-1][1])
    raise ValueError(
        f"the trial reported no {metric!r}; its metrics are {sorted(history)}. Pick one with "
        "--metric (a bare name)."
    )


def _sweep_inputs(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The sweep's base configuration and its checked space."""
    from dew.config.sweep import _checked_space

    config = _configure(args)
    if config.trainer.name is None:
        raise ValueError("dew sweep needs trainer.name (or --name): it names every trial.")
    if args.storage is not None and args.search != "optuna":
        raise ValueError(f"--storage is Optuna's; use it with --search optuna, not {args.search}.")
    with _reading(args.space):  # a bad space is the user's before anything is written
        return config, _checked_space(config, _space(args.space))


def _sweep(args: argparse.Namespace) -> int:
    from dew._processes import is_process_zero
    from dew.config._recipe import run_folder
    from dew.config.sweep import sweep
    from dew.tracking import LocalTracker

    config, space = _sweep_inputs(args)
    _, metrics, _ = _default_metrics(config)
    metric = args.metric or (metrics[0].name if metrics else "loss")
    _, local = run_folder(config, config.trainer.name)  # the sweep's own local folder
    ledger = args.ledger or str(local / "ledger.json")
    search = _search(args)

    def trial(run: Any) -> float:
        from dew.training import NonFiniteTrainingError

        try:
            state = run.train(metrics=metrics, progress=not args.quiet)
        except NonFiniteTrainingError as error:  # a diverging trial is data, not the end
            _say(f"{run.trainer.name}: {error}", file=sys.stderr)
            return math.nan
        if not is_process_zero():  # the sweep records process zero's score
            return math.nan
        return _score(state.metric_history, metric)

    # Only process zero writes: the sweep's tracker, like the ledger, is its alone.
    tracking = LocalTracker(local / "sweep") if is_process_zero() else contextlib.nullcontext()
    with tracking as tracker:
        trials = sweep(
            config,
            space,
            train=trial,
            trials=args.trials,
            ledger=ledger,
            tracker=tracker,
            search=search,
        )
    for finished in trials:
        _say(f"trial {finished.index}  {metric} {finished.value:.4f}  {finished.overrides}")
    scored = [t for t in trials if not math.isnan(t.value)]
    if scored:
        pick = max if args.direction == "maximize" else min
        best = pick(scored, key=lambda t: t.value)
        _say(f"best trial {best.index}  {metric} {best.value:.4f}  {best.overrides}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from dew.config import RunConfig, evaluate_run
    from dew.training import key_text

    folder = pathlib.Path(args.run_dir)
    config = RunConfig.from_run_record(folder / "run.json")  # evaluate_run's own first read
    objective, metrics, skipped = _default_metrics(config)
    result = evaluate_run(folder, metrics=metrics)
    if result.scores:
        shown = "  ".join(f"{name} {value:.4f}" for name, value in result.scores.items())
        _say(f"step {result.step}  {shown}")
    else:  # say why there is no score rather than print an empty line
        weights = "EMA params" if getattr(objective, "ema_decay", None) is not None else "params"
        if metrics:
            why = "the validation pass was empty"
        elif skipped:
            why = f"{', '.join(skipped)} skipped"
        else:
            why = f"the {objective.name} objective declares no metrics"
        _say(
            f"step {result.step}  no scores: {why} (restored the step-{result.step} "
            f"checkpoint's {weights})"
        )
    _say(
        f"  evaluation/coordinated_batches {result.coordinated_batches}  evaluation/records "
        f"{result.records}  evaluation/uneven_shards {result.uneven_shards}  event key "
        f"{key_text(result.key)}"
    )
    return 0


def _runs(args: argparse.Namespace) -> int:
    """List the runs under a folder. A run whose journal cannot be read is listed as
    `unreadable`, its error printed to standard error, and the exit status is 1."""
    from dew.tracking import read_journal

    root = pathlib.Path(args.folder)
    if not root.is_dir():
        raise FileNotFoundError(f"no folder {str(root)!r} to list runs from.")
    rows, unreadable = [], 0
    for journal_file in sorted(root.rglob("scalars.jsonl")):
        folder = journal_file.parent
        name = str(folder.relative_to(root)) or "."
        try:
            journal = read_journal(folder)
        except (OSError, ValueError) as error:
            unreadable += 1
            print(f"dew runs: {name}: {error}", file=sys.stderr)
            rows.append((name, "unreadable", "-", "(see the error above)"))
            continue
        status = "-"
        for _, _, record in journal.records:  # the latest fit decides: a resumed one runs
            if record.type == "fit_started":
                status = "running or killed"
            elif record.type == "fit_ended":
                status = record.status
        last = max((step for series in journal.scalars.values() for step, _ in series), default=0)
        rows.append((name, status, str(last), _summary(journal.scalars)))
    if not rows:
        print(f"no runs under {root}")
        return 0
    headers = ("run", "status", "step", "final metrics")
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(3)]
    for row in [headers, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            + "  "
            + row[3]
        )
    return 1 if unreadable else 0


def _message(error: BaseException) -> str:
    """`error` as one line, its notes included; an OSError names its path first and, when a
    file stands where a folder should, which one."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        path = os.fsdecode(error.filename)
        text = f"{path}: {error.strerror}"
        if error.filename2 is not None:
            text = f"{path} -> {os.fsdecode(error.filename2)}: {error.strerror}"
        blocking = _file_in_the_way(path) if error.errno in (errno.ENOTDIR, errno.EEXIST) else None
        if blocking is not None:
            text += f" ({blocking} is a file, not a folder)"
    elif isinstance(error, KeyError) and error.args:
        text = str(error.args[0])
    else:
        text = str(error) or type(error).__name__
    parts = [text, *getattr(error, "__notes__", ())]
    return " ".join(line.strip() for part in parts for line in part.splitlines() if line.strip())


def _file_in_the_way(path: str) -> str | None:
    """The first existing component of `path` (itself included) that is not a folder."""
    candidate = pathlib.Path(path)
    for folder in [*reversed(candidate.parents), candidate]:
        if folder.exists() and not folder.is_dir():
            return str(folder)
        if not folder.exists():
            return None
    return None


def _caused_by_user(error: BaseException) -> bool:
    """Whether `error` is the user's to fix (a path, a value, a file, a missing extra)
    rather than a bug in dew, which keeps its traceback."""
    if isinstance(error, OSError | ValueError):
        return True
    if isinstance(error, KeyError):  # dew's lookups: undeclared paths, unregistered names
        return type(error).__module__.split(".")[0] == "dew"
    if isinstance(error, ImportError):  # a missing optional dependency, not a broken import
        return error.name is not None and error.name.split(".")[0] != "dew"
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dew` console script.

    A user-caused failure (a missing, misplaced or unwritable path, a bad value or file) is
    one line `dew <command>: <message>` on stderr and exit status 2; Ctrl-C is one line and
    exit status 130, and a run or sweep it stops resumes when the command runs again. Other
    errors are bugs and keep their traceback.

    `--processes N` runs the command as N local processes (`dew._launch.launch`); the
    cluster flags and variables (`cluster_settings`) join this process to a multi-process
    run (`dew.distributed.initialize`) before any other JAX work.
    """
    from dew._launch import LAUNCHED_ENV

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in _RESUMABLE:
        _config_arguments(args.command_parser, args)
    for option in ("steps", "trials"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            parser.error(f"--{option} must be >= 1, got {value}")
    launched = bool(os.environ.get(LAUNCHED_ENV))
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
                _join(settings)
                joined = True
        commands = {"train": _train, "sweep": _sweep, "eval": _eval, "runs": _runs}
        return commands[args.command](args)

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
    (the config, the sweep's space, the run folder's run.json); 0 when they pass."""
    if args.command == "train":
        _train_config(args)
    elif args.command == "sweep":
        _sweep_inputs(args)
    else:
        from dew.config import RunConfig

        RunConfig.from_run_record(pathlib.Path(args.run_dir) / "run.json")
    return 0


def _outcome(args: argparse.Namespace, launched: bool, run: Callable[[], int]) -> int:
    """`run()`'s status; a user-caused error or Ctrl-C becomes one line and a status."""
    try:
        return run()
    except KeyboardInterrupt:
        if not launched:  # a launched process leaves the one line to its launcher
            resume = "; run the same command again to resume" if args.command in _RESUMABLE else ""
            print(f"dew {args.command}: interrupted{resume}", file=sys.stderr)
        return 130
    except Exception as error:
        if not _caused_by_user(error):
            raise
        print(f"dew {args.command}: {_message(error)}", file=sys.stderr)
        return 2


def _leave(code: int) -> NoReturn:
    """Exit now with `code`, output flushed, skipping the interpreter's exit handlers."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
