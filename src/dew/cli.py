"""The `dew` command: `dew train`, `dew sweep`, `dew eval` and `dew runs`.

- `dew train [--config] [CONFIG]`: train a run configuration, a TOML file or a built-in
  name (`dew.config.BUILTIN_CONFIGS`: `tiny_lm`, the default, `tiny_diffusion`, ...), as
  an ordinary recipe run under `<trainer.checkpoint_dir>/<trainer.name>`.
- `dew sweep [--config] CONFIG SPACE.toml`: one trial per point of the space, with a
  ledger; several `dew sweep --search optuna --storage URL` workers share one study.
- `dew eval RUN_DIR`: score a run's latest checkpoint on its validation data.
- `dew runs [FOLDER]`: a table of the runs under a folder with their final metrics.
"""

import argparse
import contextlib
import errno
import math
import os
import pathlib
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["main"]

_RESUMABLE = ("train", "sweep")  # a run or sweep Ctrl-C stops resumes when run again


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dew", description="Train, evaluate and track models.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a run configuration (default: tiny_lm)")
    train.add_argument("config", nargs="?", help=f"{_CONFIG_HELP} (default: tiny_lm)")
    _run_options(train)

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

    evaluate = commands.add_parser("eval", help="score a run's latest checkpoint")
    evaluate.add_argument("run_dir", help="a run folder (it holds run.json)")

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
        print(f"{name} skipped: {why}")
    return objective, tuple(objective.default_metrics()), skipped


def _train(args: argparse.Namespace) -> int:
    from dew.config._recipe import run_folder

    config = _configure(args)
    name = config.trainer.name
    if name is None:
        raise ValueError("dew train needs a run name: set trainer.name or pass --name.")
    _, metrics, _ = _default_metrics(config)
    state = config.train(metrics=metrics, progress=not args.quiet)
    _, folder = run_folder(config, name)
    print(f"step {int(state.step)}  {_summary(state.metric_history)}")
    print(f"run folder {folder}")
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


def _sweep(args: argparse.Namespace) -> int:
    from dew.config._recipe import run_folder
    from dew.config.sweep import _checked_space, sweep
    from dew.tracking import LocalTracker

    config = _configure(args)
    if config.trainer.name is None:
        raise ValueError("dew sweep needs trainer.name (or --name): it names every trial.")
    if args.storage is not None and args.search != "optuna":
        raise ValueError(f"--storage is Optuna's; use it with --search optuna, not {args.search}.")
    _, metrics, _ = _default_metrics(config)
    metric = args.metric or (metrics[0].name if metrics else "loss")
    _, local = run_folder(config, config.trainer.name)  # the sweep's own local folder
    ledger = args.ledger or str(local / "ledger.json")
    with _reading(args.space):  # a bad space is the user's before anything is written
        space = _checked_space(config, _space(args.space))
    search = _search(args)

    def trial(run: Any) -> float:
        from dew.training import NonFiniteTrainingError

        try:
            state = run.train(metrics=metrics, progress=not args.quiet)
        except NonFiniteTrainingError as error:  # a diverging trial is data, not the end
            print(f"{run.trainer.name}: {error}", file=sys.stderr)
            return math.nan
        return _score(state.metric_history, metric)

    with LocalTracker(local / "sweep") as tracker:
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
        print(f"trial {finished.index}  {metric} {finished.value:.4f}  {finished.overrides}")
    scored = [t for t in trials if not math.isnan(t.value)]
    if scored:
        pick = max if args.direction == "maximize" else min
        best = pick(scored, key=lambda t: t.value)
        print(f"best trial {best.index}  {metric} {best.value:.4f}  {best.overrides}")
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
        print(f"step {result.step}  {shown}")
    else:  # say why there is no score rather than print an empty line
        weights = "EMA params" if getattr(objective, "ema_decay", None) is not None else "params"
        if metrics:
            why = "the validation pass was empty"
        elif skipped:
            why = f"{', '.join(skipped)} skipped"
        else:
            why = f"the {objective.name} objective declares no metrics"
        print(
            f"step {result.step}  no scores: {why} (restored the step-{result.step} "
            f"checkpoint's {weights})"
        )
    print(
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
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in _RESUMABLE:
        _config_arguments(args.command_parser, args)
    for option in ("steps", "trials"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            parser.error(f"--{option} must be >= 1, got {value}")
    commands = {"train": _train, "sweep": _sweep, "eval": _eval, "runs": _runs}
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        resume = "; run the same command again to resume" if args.command in _RESUMABLE else ""
        print(f"dew {args.command}: interrupted{resume}", file=sys.stderr)
        return 130
    except Exception as error:
        if not _caused_by_user(error):
            raise
        print(f"dew {args.command}: {_message(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
