"""`dew predict RUN --input PATH`: a classifier run's top classes for new rows."""

import argparse
import csv
import io
import json
import pathlib
from typing import Any

from dew.cli._inputs import _say

__all__ = ["add_predict", "run_arguments"]

_WEIGHTS_HELP = (
    "the weights to use: auto (default: the EMA weights where the run keeps them, else the "
    "live ones), live or ema"
)


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """The run folder and which of its checkpoints and weights, as `dew.load_run` takes them
    (the parser adds `--import`)."""
    parser.set_defaults(command_parser=parser)
    parser.add_argument("run_dir", help="a run folder (it holds run.json)")
    parser.add_argument("--step", type=int, metavar="N", help="the checkpoint (default latest)")
    parser.add_argument(
        "--weights", choices=("auto", "live", "ema"), default="auto", help=_WEIGHTS_HELP
    )


def add_predict(commands: Any) -> argparse.ArgumentParser:
    """Add `dew predict`'s parser to `commands`, and return it."""
    predict = commands.add_parser(
        "predict",
        help="a classifier run's top classes for new rows",
        description="Load a classifier run (dew.load_run) and write the top classes of each "
        "row of --input with their softmax probabilities, by class name where the run's data "
        "named its classes. The rows are scored in batches of one shape, so the model compiles "
        "once.",
    )
    run_arguments(predict)
    predict.add_argument(
        "--input",
        required=True,
        metavar="PATH",
        help="a .npy array of rows, a .npz archive (its array under the batch key the "
        "classifier reads), an image file, or a folder of images (resized to the run's)",
    )
    predict.add_argument(
        "--out", metavar="FILE", help="preds.csv or preds.jsonl (default: CSV on standard output)"
    )
    predict.add_argument(
        "--top-k", type=int, default=1, metavar="K", help="classes per row (default 1)"
    )
    predict.add_argument(
        "--batch-size", type=int, default=64, metavar="N", help="rows per batch (default 64)"
    )
    return predict


def _predict(args: argparse.Namespace) -> int:
    from dew._integers import check_integer
    from dew._predict import (
        classifier_of,
        input_rows,
        predict_classes,
        prediction_rows,
        read_rows,
    )
    from dew.config import load_run

    check_integer("--top-k", args.top_k, minimum=1)
    check_integer("--batch-size", args.batch_size, minimum=1)
    out = None if args.out is None else pathlib.Path(args.out)
    if out is not None:
        if out.suffix not in (".csv", ".jsonl"):
            raise ValueError(f"--out {args.out!r} must end .csv or .jsonl.")
        if not out.parent.is_dir():
            raise FileNotFoundError(
                f"--out {args.out!r}: no folder {str(out.parent)!r} to write it in."
            )
    if not pathlib.Path(args.input).exists():
        raise FileNotFoundError(f"--input {args.input!r}: no such file or folder.")
    loaded = load_run(args.run_dir, step=args.step, weights=args.weights)
    shape, dtype = input_rows(loaded)
    names, rows = read_rows(args.input, classifier_of(loaded).inputs, shape, dtype)
    found = predict_classes(loaded, rows, top_k=args.top_k, batch_size=args.batch_size)
    records = prediction_rows(names, found, loaded.classes)
    if out is None:
        print(_csv(records, args.top_k), end="")
        return 0
    from dew._json import write_atomic

    text = (
        _csv(records, args.top_k)
        if out.suffix == ".csv"
        else "".join(json.dumps(record) + "\n" for record in records)
    )
    write_atomic(out, text)
    weights = "EMA" if loaded.weights == "ema" else "live"
    _say(
        f"wrote {len(records)} predictions (top {args.top_k}) to {out}: {loaded.folder}, "
        f"step {loaded.step}, {weights} weights"
    )
    return 0


def _csv(records: list[Any], top_k: int) -> str:
    """The predictions as CSV: `row`, then `class_i` and `probability_i` for each of the k."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    header = ["row"]
    for rank in range(1, top_k + 1):
        header += [f"class_{rank}", f"probability_{rank}"]
    writer.writerow(header)
    for record in records:
        cells = [record["row"]]
        for shown, value in zip(record["classes"], record["probabilities"], strict=True):
            cells += [shown, f"{value:.6g}"]
        writer.writerow(cells)
    return buffer.getvalue()
