"""The `dew` command's argument parser: its commands, their options and the multi-process ones."""

import argparse


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
    evaluate.add_argument("--step", type=int, help="the checkpoint step to score (default latest)")
    evaluate.add_argument("--metrics", metavar="A,B", help="score only these metrics (bare names)")
    evaluate.add_argument("--verbose", action="store_true", help="print the pass's counts too")
    _process_options(evaluate)

    runs = commands.add_parser("runs", help="list runs and their final metrics")
    runs.add_argument("folder", nargs="?", default="runs", help="where to look (default runs)")
    runs.add_argument(
        "--sort", metavar="METRIC", help="best first by a metric (a bare name or a full tag)"
    )
    runs.add_argument("--reverse", action="store_true", help="with --sort: worst first")
    runs.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep matching runs: KEY=VALUE, KEY~REGEX, KEY<NUMBER, KEY>NUMBER (repeatable)",
    )
    runs.add_argument("--json", action="store_true", help="a JSON list of the runs, for scripts")
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
    parser.add_argument(
        "--verbose", action="store_true", help="also each evaluation's pass counts and event key"
    )


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
