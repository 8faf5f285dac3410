"""The `dew` commands `train`, `sweep` and `eval` (`runs` is `_runs`)."""

import argparse
import contextlib
import math
import os
import pathlib
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dew.cli._console import config_lines, end_lines, model_lines, point_value
from dew.cli._inputs import _configure, _reading, _say

WORKER_ENV = "DEW_SWEEP_WORKER"
"""Set in the environment of each of `dew sweep --workers N`'s workers (`_workers`): the
worker prints no summary, the launcher prints one."""


def _default_metrics(config: Any) -> tuple[Any, tuple[Any, ...], dict[str, str]]:
    """The configured objective (on shapes), its default metrics (built once: FID loads
    its weights here) and those it skips, each skipped one reported on one line."""
    from dew.config import objective_shapes
    from dew.objectives.base import AbstractObjective, SkipsMetrics

    objective: AbstractObjective = objective_shapes(config)
    skipped = objective.skipped_metrics() if isinstance(objective, SkipsMetrics) else {}
    for name, why in skipped.items():
        _say(f"{name} skipped: {why}")
    return objective, tuple(objective.default_metrics()), skipped


def _check_verbosity(args: argparse.Namespace) -> None:
    if args.quiet and args.verbose:
        raise ValueError(
            "--quiet prints no evaluation lines for --verbose to add to; pass one or the other."
        )


def _train_config(args: argparse.Namespace) -> Any:
    _check_verbosity(args)
    config = _configure(args)
    if config.trainer.name is None:
        raise ValueError("dew train needs a run name: set trainer.name or pass --name.")
    return config


def _introduce(args: argparse.Namespace, config: Any, objective: Any) -> None:
    """Unless `--quiet`: the resolved configuration and the model's parameter counts."""
    if not args.quiet:
        for line in [*config_lines(config), *model_lines(getattr(objective, "model", objective))]:
            _say(line)


def _directions(metrics: Sequence[Any]) -> dict[str, str | None]:
    """Each metric's bare name and the direction it declares (decision 0064)."""
    from dew.metrics import MetricSet

    return MetricSet(metrics).directions


def _sweep_direction(
    args: argparse.Namespace, metric: str, metrics: Sequence[Any], ledger: str
) -> str:
    """The sweep's direction: `--direction`, else the one its ledger records (a rerun
    continues as it began), else the one the score `metric` declares (a metric the
    objective does not score, such as the training `loss`, by its name; decision 0064)."""
    from dew._directions import direction_of
    from dew.config.sweep._ledger import read_ledger

    if args.direction is not None:
        return args.direction
    if pathlib.Path(ledger).is_file():
        return read_ledger(ledger).direction
    direction = direction_of(metric, _directions(metrics))
    if direction is None:
        raise ValueError(
            f"the sweep's score {metric!r} has no direction (it is best near the data's own "
            "value); pass --direction minimize or --direction maximize."
        )
    return direction


def _start_step(folder: pathlib.Path) -> int:
    """The step the run folder's latest fit started from (its journal's last `FitStarted`);
    0 when the journal cannot tell."""
    from dew._processes import is_process_zero
    from dew._run_folder import RunFolder

    if not is_process_zero():  # only process zero writes the journal
        return 0
    latest = RunFolder(folder).latest_fit()
    return 0 if latest is None else latest.start_step


def _train(args: argparse.Namespace) -> int:
    from dew._loop import verbose_console
    from dew._run_folder import run_folder
    from dew.cli._trackers import open_trackers, tensorboard_hint

    config = _train_config(args)
    name = config.trainer.name
    objective, metrics, _ = _default_metrics(config)
    _introduce(args, config, objective)
    began = time.perf_counter()
    with (
        verbose_console(args.verbose),
        open_trackers(
            args, config, announce=lambda logdir: _say(tensorboard_hint(logdir))
        ) as tracker,
    ):
        state = config.train(metrics=metrics, progress=not args.quiet, tracker=tracker)
    seconds = time.perf_counter() - began
    _, folder = run_folder(config, name)
    step = int(state.step)
    trained = step - _start_step(folder)
    directions = _directions(metrics)
    history = state.metric_history
    for line in end_lines(
        history, step=step, trained=trained, seconds=seconds, directions=directions
    ):
        _say(line)
    _say(f"run folder {folder}")
    return 0


def _space(path: str) -> dict[str, Any]:
    from dew.config._toml import read_toml
    from dew.config.sweep import IntUniform, Uniform

    tree = read_toml(path)
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


def _search(args: argparse.Namespace, direction: str) -> Any:
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
    return optuna_search(
        storage=args.storage,
        study_name=args.study_name,
        direction=direction,
        pruner=args.pruner,
    )


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


def _ledger_path(args: argparse.Namespace, config: Any) -> str:
    from dew._run_folder import run_folder

    _, local = run_folder(config, config.trainer.name)  # the sweep's own local folder
    return args.ledger or str(local / "ledger.json")


def _with_recorded_imports(config: Any, ledger: str) -> Any:
    """A rerun of a sweep imports the modules its ledger's base configuration names (its
    `trainer.imports`) and keeps them in the configuration its trials record, so a rerun
    needs no `--import` the first run was given."""
    from dew.config import override
    from dew.config.sweep._ledger import read_ledger
    from dew.registry import import_modules

    if not pathlib.Path(ledger).is_file():
        return config
    trainer = read_ledger(ledger).data["config"].get("trainer")
    recorded = trainer.get("imports") if isinstance(trainer, Mapping) else None
    if not isinstance(recorded, list) or not recorded:
        return config
    import_modules(recorded, named_by=f"trainer.imports of {ledger}")
    merged = list(dict.fromkeys([*recorded, *config.trainer.imports]))
    return (
        config
        if merged == list(config.trainer.imports)
        else override(config, {"trainer.imports": merged})
    )


def _sweep_inputs(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The sweep's base configuration (with the modules a rerun's ledger records) and its
    checked space."""
    from dew.config.sweep import _checked_space

    _check_verbosity(args)
    config = _configure(args)
    if config.trainer.name is None:
        raise ValueError("dew sweep needs trainer.name (or --name): it names every trial.")
    if args.storage is not None and args.search != "optuna":
        raise ValueError(f"--storage is Optuna's; use it with --search optuna, not {args.search}.")
    _check_pruner(args, config)
    config = _with_recorded_imports(config, _ledger_path(args, config))
    with _reading(args.space):  # a bad space is the user's before anything is written
        return config, _checked_space(config, _space(args.space))


def _check_pruner(args: argparse.Namespace, config: Any) -> None:
    """A `--pruner` the sweep can use (decision 0055): one of `PRUNERS`, with Optuna search,
    evaluation events to report at, and one process per trial."""
    from dew.config.sweep._optuna import PRUNERS

    if args.pruner not in PRUNERS:
        raise ValueError(f"--pruner {args.pruner!r} is not one of {', '.join(map(repr, PRUNERS))}.")
    if args.pruner == "none":
        return
    if args.search != "optuna":
        raise ValueError(
            f"--pruner {args.pruner} needs --search optuna (an Optuna pruner decides from "
            f"the study's reported scores), not --search {args.search}."
        )
    if config.trainer.eval_every is None:
        raise ValueError(
            f"--pruner {args.pruner} stops trials at their evaluation events, but "
            "trainer.eval_every is not set: set it (--set trainer.eval_every=N)."
        )
    flags = [
        flag
        for flag, name in (("--processes", "processes"), ("--distributed", "distributed"))
        if getattr(args, name, None) not in (None, False)
    ]
    if flags or getattr(args, "num_processes", None) not in (None, 1):
        raise ValueError(
            f"--pruner {args.pruner} prunes trials of one process each; it does not combine "
            f"with {', '.join(flags) or '--num-processes'} (use --workers N for parallel trials)."
        )


def _sweep(args: argparse.Namespace) -> int:
    from dew._processes import is_process_zero
    from dew._run_folder import run_folder
    from dew.cli._tracker_options import checked_trackers
    from dew.cli._trackers import open_trackers, tensorboard_hint
    from dew.config.sweep import sweep
    from dew.tracking import LocalTracker

    config, space = _sweep_inputs(args)
    checked_trackers(args)  # --mlflow-uri without mlflow is the user's before anything is written
    objective, metrics, _ = _default_metrics(config)
    _introduce(args, config, objective)
    metric = args.metric or (metrics[0].name if metrics else "loss")
    _, local = run_folder(config, config.trainer.name)  # the sweep's own local folder
    ledger = _ledger_path(args, config)
    direction = _sweep_direction(args, metric, metrics, ledger)
    search = _search(args, direction)

    hinted: list[pathlib.Path] = []  # the trials' event files: one line for all of them

    def announce(logdir: pathlib.Path) -> None:
        if not hinted:
            hinted.append(logdir)
            _say(tensorboard_hint(local))

    def trial(run: Any) -> float:
        from dew._loop import verbose_console
        from dew.config.sweep import pruning_stopper
        from dew.training import NonFiniteTrainingError

        _say(_trial_line(run, space, args.trials))
        stopper = pruning_stopper(metric)  # None without --pruner
        try:
            with (
                verbose_console(args.verbose),
                open_trackers(args, run, announce=announce) as tracker,
            ):
                state = run.train(
                    metrics=metrics,
                    progress=not args.quiet,
                    tracker=tracker,
                    early_stopper=stopper,
                )
        except NonFiniteTrainingError as error:  # a diverging trial is data, not the end
            _say(f"{run.trainer.name}: {error}", file=sys.stderr)
            return math.nan
        reports = None if stopper is None else stopper.trial
        if reports is not None and reports.pruned_at is not None:
            _say(f"{run.trainer.name}: pruned at step {reports.pruned_at}")
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
            direction=direction,
        )
    if os.environ.get(WORKER_ENV):  # one of --workers N: the launcher sums up
        return 0
    for finished in trials:
        _say(trial_summary(finished, metric))
    scored = [t for t in trials if not math.isnan(t.value) and not t.pruned]
    scored.sort(key=lambda t: t.index)  # of trials that tie, the first is the best
    if scored:
        pick = max if direction == "maximize" else min
        best = pick(scored, key=lambda t: t.value)
        _say(f"best trial {best.index}  {metric} {best.value:.4f}  {best.overrides}")
    return 0


def trial_summary(trial: Any, metric: str) -> str:
    """`trial I  METRIC VALUE  POINT`, and `  pruned at step S` for a pruned trial."""
    line = f"trial {trial.index}  {metric} {trial.value:.4f}  {trial.overrides}"
    if trial.pruned:
        line += f"  pruned at step {max(trial.reports, default='?')}"
    return line


def _trial_line(run: Any, space: Mapping[str, Any], trials: int) -> str:
    """`trial I/N  path=value ...`: the trial starting (its index, as in its folder
    `trial-I`, of the budget N) and its point, read back from its configuration."""
    index = run.trainer.name.rsplit("trial-", 1)[-1]
    point = "  ".join(f"{path}={point_value(run, path)}" for path in space)
    return f"trial {index}/{trials}  {point}"


def _chosen_metrics(metrics: Sequence[Any], names: str | None) -> tuple[Any, ...]:
    """The metrics `--metrics a,b` names, in its order; all of them without it."""
    if names is None:
        return tuple(metrics)
    by_name = {metric.name: metric for metric in metrics}
    asked = [name.strip() for name in names.split(",")]
    unknown = [name for name in asked if name not in by_name]
    if unknown or not asked:
        raise ValueError(
            f"--metrics names {', '.join(map(repr, unknown or [names]))}, which the run's "
            f"objective does not score; its metrics are {', '.join(by_name) or 'none'}."
        )
    return tuple(by_name[name] for name in dict.fromkeys(asked))


def _eval(args: argparse.Namespace) -> int:
    from dew.config import RunConfig, evaluate_run
    from dew.distributed import process_count
    from dew.registry import import_modules

    # Public names alone (a test holds dew eval to them), so run.json is spelled here as the
    # documentation spells it (`dew._run_folder.RUN_RECORD`).
    folder = pathlib.Path(args.run_dir)
    config = RunConfig.from_run_record(folder / "run.json")  # evaluate_run's own first read
    import_modules(config.trainer.imports, named_by=f"trainer.imports of {folder / 'run.json'}")
    objective, metrics, skipped = _default_metrics(config)
    metrics = _chosen_metrics(metrics, args.metrics)
    split = "train" if args.split == "train" else "validation"
    result = evaluate_run(
        folder, metrics=metrics, step=args.step, split=split, batches=args.batches
    )
    scored = "" if split == "validation" else "  (training split)"
    if result.scores:
        shown = "  ".join(f"{name} {value:.4f}" for name, value in result.scores.items())
        _say(f"step {result.step}{scored}  {shown}")
    else:  # say why there is no score rather than print an empty line
        weights = "EMA params" if getattr(objective, "ema_decay", None) is not None else "params"
        if metrics:
            why = f"the {'training' if split == 'train' else 'validation'} pass was empty"
        elif skipped:
            why = f"{', '.join(skipped)} skipped"
        else:
            why = f"the {objective.name} objective declares no metrics"
        _say(
            f"step {result.step}  no scores: {why} (restored the step-{result.step} "
            f"checkpoint's {weights})"
        )
    # The counts say something with uneven shards or several processes, else on --verbose.
    if args.verbose or result.uneven_shards or process_count() > 1:
        _say(f"  {_counts_line(result)}")
    return 0


def _counts_line(result: Any) -> str:
    """An `Evaluation`'s counts and key as `dew train` prints them (the console's own line)."""
    from dew._loop import counts_line
    from dew.training._evaluation_event import key_text

    counts = (result.coordinated_batches, result.records, result.uneven_shards)
    return counts_line(*counts, key_text(result.key))
