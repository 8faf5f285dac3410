"""`dew export RUN --format safetensors|stablehlo --out DIR`: a run's trained parameters or its
model's forward function, for use without dew (`dew.export`)."""

import argparse
from typing import Any

from dew.cli._inputs import _say
from dew.cli._predict import run_arguments

__all__ = ["add_export"]


def add_export(commands: Any) -> argparse.ArgumentParser:
    """Add `dew export`'s parser to `commands`, and return it."""
    export = commands.add_parser(
        "export",
        help="write a run's model for use without dew (safetensors, StableHLO)",
        description="Load a run (dew.load_run) and write its trained parameters as "
        "model.safetensors with config.json (--format safetensors), or its model's forward "
        "function over a batch as model.exported with signature.json (--format stablehlo: "
        "jax.export, a symbolic batch dimension b). The run folder's exports.json records "
        "each export and its parity: the largest difference between the export and dew's "
        "model on one batch of the run's data.",
    )
    run_arguments(export)
    export.add_argument(
        "--format", required=True, choices=("safetensors", "stablehlo"), help="what to write"
    )
    export.add_argument("--out", required=True, metavar="DIR", help="the folder to write into")
    export.add_argument("--force", action="store_true", help="replace an earlier export in DIR")
    return export


def _export(args: argparse.Namespace) -> int:
    from dew._run_folder import RunFolder
    from dew.export import export_run

    record = export_run(
        args.run_dir, args.format, args.out, step=args.step, weights=args.weights, force=args.force
    )
    weights = "EMA" if record["weights"] == "ema" else "live"
    parity = record["parity"]
    _say(
        f"exported step {record['step']} ({weights} weights) of {args.run_dir} as "
        f"{args.format}: {', '.join(record['files'])} in {args.out}"
    )
    recorded = RunFolder.of(args.run_dir).exports  # the folder, or its run.json
    _say(
        f"  parity on {parity['rows']} rows of the run's data: max abs difference "
        f"{parity['max_abs_difference']:.3g} (recorded in {recorded})"
    )
    return 0
