"""The `dew` commands: `train`, `sweep`, `eval` and `runs`."""

import argparse
import contextlib
import math
import pathlib
import sys
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from dew.cli._inputs import _configure, _reading, _say


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
    from dew.cli._trackers import open_trackers, tensorboard_hint
    from dew.config._recipe import run_folder

    config = _train_config(args)
    name = config.trainer.name
    _, metrics, _ = _default_metrics(config)
    with open_trackers(
        args, config, announce=lambda logdir: _say(tensorboard_hint(logdir))
    ) as tracker:
        state = config.train(metrics=metrics, progress=not args.quiet, tracker=tracker)
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
    from dew.cli._trackers import checked_trackers, open_trackers, tensorboard_hint
    from dew.config._recipe import run_folder
    from dew.config.sweep import sweep
    from dew.tracking import LocalTracker

    config, space = _sweep_inputs(args)
    checked_trackers(args)  # --mlflow-uri without mlflow is the user's before anything is written
    _, metrics, _ = _default_metrics(config)
    metric = args.metric or (metrics[0].name if metrics else "loss")
    _, local = run_folder(config, config.trainer.name)  # the sweep's own local folder
    ledger = args.ledger or str(local / "ledger.json")
    search = _search(args)

    hinted: list[pathlib.Path] = []  # the trials' event files: one line for all of them

    def announce(logdir: pathlib.Path) -> None:
        if not hinted:
            hinted.append(logdir)
            _say(tensorboard_hint(local))

    def trial(run: Any) -> float:
        from dew.training import NonFiniteTrainingError

        try:
            with open_trackers(args, run, announce=announce) as tracker:
                state = run.train(metrics=metrics, progress=not args.quiet, tracker=tracker)
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
