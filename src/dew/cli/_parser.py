"""The `dew` command's argument parser: its commands, their options and the multi-process ones."""

import argparse
from typing import Any

import dew
from dew._nonfinite import ON_NONFINITE
from dew.cli._export import add_export
from dew.cli._predict import add_predict
from dew.cli._sample import add_sample


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dew", description="Train, evaluate and track models.")
    parser.add_argument("--version", action="version", version=f"dew {dew.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a run configuration (default: tiny_lm)")
    train.add_argument("config", nargs="?", help=f"{_CONFIG_HELP} (default: tiny_lm)")
    _run_options(train)
    _tracker_options(train)
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
    sweep.add_argument(
        "--direction",
        choices=("minimize", "maximize"),
        help="of the score (default: the one --metric declares, or the ledger's on a rerun)",
    )
    sweep.add_argument(
        "--pruner",
        default="none",
        metavar="median|hyperband|none",
        help="with --search optuna: stop trials whose validation score falls behind (default none)",
    )
    sweep.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="start N local sweep workers on one ledger (and one storage with --search optuna)",
    )
    _tracker_options(sweep)
    _process_options(sweep)

    evaluate = commands.add_parser("eval", help="score a run's latest checkpoint")
    evaluate.set_defaults(command_parser=evaluate)
    evaluate.add_argument("run_dir", help="a run folder (it holds run.json)")
    evaluate.add_argument("--step", type=int, help="the checkpoint step to score (default latest)")
    evaluate.add_argument("--metrics", metavar="A,B", help="score only these metrics (bare names)")
    evaluate.add_argument("--verbose", action="store_true", help="print the pass's counts too")
    evaluate.add_argument(
        "--split",
        choices=("val", "train"),
        default="val",
        help="the validation split (default), or every training row once, in row order",
    )
    evaluate.add_argument(
        "--batches",
        type=int,
        metavar="N",
        help="score only the split's first N batches (a streamed training split needs it)",
    )
    _registration_options(evaluate)
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
    runs.add_argument(
        "--columns",
        metavar="A,B",
        help="these columns after run: metrics (bare names or tags), hyperparameters (--set "
        "paths), status, step, 'best trial' (default: all that fit the terminal's width)",
    )
    runs.add_argument("--json", action="store_true", help="a JSON list of the runs, for scripts")

    plot = commands.add_parser("plot", help="render a run's plots from its local journal")
    plot.add_argument("run_dir", help="a run folder (it holds scalars.jsonl)")

    config = commands.add_parser("config", help="show a run configuration as TOML")
    config_actions = config.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    show = config_actions.add_parser(
        "show", help="print a resolved run configuration as TOML that dew train reads"
    )
    show.add_argument(
        "config",
        nargs="?",
        help=f"{_CONFIG_HELP}, or a run folder or its run.json (default: tiny_lm)",
    )
    _override_options(show)

    _data_commands(commands)
    for using in (
        add_sample(commands),
        add_predict(commands),
        add_export(commands),
    ):  # a trained run, used
        _registration_options(using)
    _add_examples(parser)  # last: every command above gets its EXAMPLES
    return parser


_CONFIG_HELP = "a RunConfig TOML file or a built-in configuration's name"


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(command_parser=parser)  # its usage heads the errors about its arguments
    parser.add_argument(
        "--config", dest="config_option", metavar="CONFIG", help=f"{_CONFIG_HELP} (as CONFIG)"
    )
    _override_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no per-step lines or progress bar")
    parser.add_argument(
        "--verbose", action="store_true", help="also each evaluation's pass counts and event key"
    )


def _data_commands(commands: Any) -> None:
    data = commands.add_parser("data", help="inspect a run's data, or train a tokenizer")
    actions = data.add_subparsers(dest="data_action", metavar="ACTION", required=True)
    inspect = actions.add_parser(
        "inspect",
        help="the data a configuration or run trains on: sizes, fingerprint, one batch decoded",
        description="Build the data a run configuration names (as dew train would, its token "
        "cache in the run folder) and print its split sizes (rows; documents and tokens for "
        "text), fingerprints, and one batch: text decoded through the source's tokenizer, "
        "images as a PNG contact sheet with their labels.",
    )
    inspect.set_defaults(command_parser=inspect)
    inspect.add_argument(
        "config",
        nargs="?",
        metavar="CONFIG_OR_RUN",
        help=f"{_CONFIG_HELP}, or a run folder (default: tiny_lm)",
    )
    inspect.add_argument(
        "--split", choices=("train", "val"), default="train", help="the split (default train)"
    )
    inspect.add_argument(
        "--step",
        type=int,
        default=0,
        metavar="N",
        help="train: the batch a one-process run trains on at step N; val: the N-th "
        "validation batch (default 0)",
    )
    inspect.add_argument(
        "--rows", type=int, default=4, metavar="K", help="rows of the batch to show (default 4)"
    )
    inspect.add_argument(
        "--out",
        metavar="FILE.png",
        help="the images' contact sheet (default: <dataset>-<split>-step<N>.png here)",
    )
    inspect.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    _override_options(inspect)

    tokenizer = actions.add_parser(
        "tokenizer",
        help="train a byte-level BPE tokenizer.json on your files",
        description="Train a byte-level BPE tokenizer (GPT-2's scheme, with the Hugging Face "
        "tokenizers library) on text files or JSON Lines, as dew.data.text reads them, and "
        "write it as a tokenizer.json that [data.kwargs] tokenizer names.",
    )
    tokenizer.set_defaults(command_parser=tokenizer)
    tokenizer.add_argument(
        "files", nargs="+", metavar="FILES", help="text files, JSON Lines files or globs"
    )
    tokenizer.add_argument(
        "--vocab-size", type=int, required=True, metavar="N", help="the vocabulary (>= 257)"
    )
    tokenizer.add_argument(
        "--out", default="tokenizer.json", help="the file to write (default tokenizer.json)"
    )
    tokenizer.add_argument("--field", help="JSON Lines: the field holding each line's text")
    tokenizer.add_argument(
        "--min-frequency",
        type=int,
        default=2,
        metavar="K",
        help="merge a pair only if it occurs at least K times (default 2)",
    )
    tokenizer.add_argument("--force", action="store_true", help="replace an existing --out")


def _registration_options(parser: argparse.ArgumentParser) -> None:
    """`--import MODULE`; the command also loads the installed `dew.plugins` entry points."""
    parser.set_defaults(registers=True)
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module that registers your models, datasets, objectives or optimizers "
        "(repeatable; a run records it in trainer.imports)",
    )


def _override_options(parser: argparse.ArgumentParser) -> None:
    """`dew train`'s overrides, for a command that resolves a configuration without training
    it (`dew config show`, `dew data inspect`)."""
    _registration_options(parser)
    parser.add_argument("--name", help="the run name (overrides trainer.name)")
    parser.add_argument("--steps", type=int, help="optimizer steps (overrides trainer.steps)")
    parser.add_argument("--checkpoint-dir", help="overrides trainer.checkpoint_dir")
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where a text source keeps its token cache (overrides data.kwargs.cache_dir; "
        "default: the run folder's data-cache)",
    )
    parser.add_argument(
        "--on-nonfinite",
        choices=ON_NONFINITE,
        help="a NaN or infinite training loss: raise (stop before saving that state, the "
        "default) or continue (overrides trainer.on_nonfinite)",
    )
    parser.add_argument(
        "--precision",
        metavar="POLICY",
        help="float32, mixed_bfloat16 or bfloat16: the step's compute dtype, params kept in "
        "float32 (overrides trainer.precision)",
    )
    parser.add_argument(
        "--accumulate",
        type=int,
        metavar="K",
        help="micro-batches per optimizer step, dividing the batch size (overrides "
        "trainer.accumulate)",
    )
    parser.add_argument(
        "--strategy",
        metavar="NAME",
        help="data or fsdp: how params and optimizer state lie over the devices (overrides "
        "trainer.strategy)",
    )
    parser.add_argument(
        "--remat",
        metavar="POLICY",
        help="true, false or a jax.checkpoint_policies name: recompute each block's "
        "activations in the backward pass (overrides model.kwargs.remat)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a dotted path with a TOML value, e.g. --set optim.learning_rate=0.01",
    )


EXAMPLES: dict[str, tuple[str, ...]] = {
    "": (
        "dew train                          # the built-in tiny_lm, as the run runs/quickstart",
        "dew runs                           # the runs under runs/ and their final metrics",
        "dew config show runs/quickstart    # the configuration a run trained, as TOML",
    ),
    "train": (
        "dew train                          # the built-in tiny_lm, as the run runs/quickstart",
        "dew train run.toml --set optim.learning_rate=0.01 --name lr-0.01",
        "dew train run.toml --import my_data    # my_data.py registers the run's dataset",
    ),
    "sweep": (
        "dew sweep tiny_lm space.toml --trials 8",
        "dew sweep run.toml space.toml --trials 8 --search grid --name lr-grid",
        "dew sweep run.toml space.toml --trials 16 --search optuna "
        "--storage sqlite:///lr.db --study-name lr",
    ),
    "eval": (
        "dew eval runs/quickstart           # score the run's latest checkpoint again",
        "dew eval runs/quickstart --split train --batches 50",
        "dew eval runs/lr-grid/trial-0",
    ),
    "runs": (
        "dew runs                           # the runs under runs/, a table per kind of run",
        "dew runs runs/lr-grid --sort perplexity --columns perplexity,optim.learning_rate",
        "dew runs --filter status=completed --json   # the rows as JSON, for scripts",
    ),
    "config": (
        "dew config show tiny_diffusion     # a built-in configuration",
        "dew config show runs/quickstart > run.toml",
        "dew train run.toml --name quickstart-copy",
    ),
    "config show": (
        "dew config show                    # tiny_lm, what a bare dew train trains",
        "dew config show runs/quickstart > run.toml",
        "dew config show tiny_lm --set optim.learning_rate=0.01 --name lr-0.01",
    ),
    "plot": (
        "dew plot runs/quickstart",
        "dew plot runs/lr-grid/trial-0",
    ),
    "data": (
        "dew data inspect run.toml          # sizes, fingerprint and batch 0, decoded",
        "dew data tokenizer 'corpus/*.txt' --vocab-size 4096 --out tokenizer.json",
        "dew data inspect runs/quickstart --split val --json",
    ),
    "data inspect": (
        "dew data inspect run.toml          # sizes, fingerprint and batch 0, decoded",
        "dew data inspect runs/quickstart --step 500 --rows 2",
        "dew data inspect tiny_classifier --split val --out sheet.png",
    ),
    "sample": (
        "dew sample runs/my-text --prompt 'def main(' --max-tokens 80 --temperature 0.8",
        "dew sample runs/my-text --prompts prompts.txt --rows 4 --top-p 0.9 --out samples.jsonl",
        "dew sample runs/tiny-diffusion --class disc --class bar --rows 8 --out grid.png",
    ),
    "predict": (
        "dew predict runs/tiny-classifier --input rows.npy --out preds.csv",
        "dew predict runs/tiny-classifier --input photos/ --top-k 3 --out preds.jsonl",
        "dew predict runs/tiny-classifier --input shape.png   # CSV on standard output",
    ),
    "export": (
        "dew export runs/tiny-classifier --format safetensors --out exported",
        "dew export runs/quickstart --format stablehlo --out exported-lm",
        "dew export runs/tiny-diffusion --format stablehlo --out dit --weights live",
    ),
    "data tokenizer": (
        "dew data tokenizer 'corpus/*.txt' --vocab-size 4096 --out tokenizer.json",
        "dew data tokenizer notes.jsonl --field body --vocab-size 8000 --min-frequency 3",
        "dew data tokenizer 'corpus/*.txt' --vocab-size 4096 --out tokenizer.json --force",
    ),
}
"""Each command's `--help` examples (the key: the command's words after `dew`, `""` for `dew`
itself): two or three command lines, one per string, with a comment where it helps. A command
added to the parser adds its entry here; `tests/test_cli_help.py` fails for one without, and
for an example the parser refuses."""


class _ExamplesFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that the examples epilog keeps its lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(_EXAMPLES_HEADING):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


_EXAMPLES_HEADING = "examples:\n"


def _add_examples(parser: argparse.ArgumentParser, words: str = "") -> None:
    """Give `parser` and each of its subcommands, recursively, their `EXAMPLES` as the
    epilog of their `--help`."""
    if words in EXAMPLES:
        parser.epilog = _EXAMPLES_HEADING + "\n".join(f"  {line}" for line in EXAMPLES[words])
        parser.formatter_class = _ExamplesFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                _add_examples(command, f"{words} {name}".strip())


def _tracker_options(parser: argparse.ArgumentParser) -> None:
    from dew.cli._tracker_options import tracker_choices, tracker_names, trackers

    group = parser.add_argument_group(
        "trackers",
        "The run folder's local journal is always written; --tracker adds other trackers. "
        "A sweep gives each trial trackers of its own.",
    )
    notes = [
        f"{name} {trackers[name].writes}" for name in trackers.names() if trackers[name].writes
    ]
    group.add_argument(
        "--tracker",
        type=tracker_names,
        default="local",
        metavar="NAMES",
        help=f"comma-separated, any of {','.join(tracker_choices())} (default local)"
        + "".join(f"; {note}" for note in notes),
    )
    for name in trackers.names():
        for option in trackers[name].options:
            option.add_to(group)


PROCESS_TIMEOUT = 86400.0
"""`--process-timeout`'s default: a day, the longest a local multi-process run may take."""


INITIALIZATION_TIMEOUT = 300
"""`--initialization-timeout`'s default, in seconds: `jax.distributed.initialize`'s own."""


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
        "--initialization-timeout",
        type=int,
        default=INITIALIZATION_TIMEOUT,
        metavar="SECONDS",
        help="how long a process waits for the coordinator and its peers to join before it "
        f"fails (default {INITIALIZATION_TIMEOUT})",
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
