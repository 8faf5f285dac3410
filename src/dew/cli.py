"""The `dew` command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dew", description="Train, evaluate and track models.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train the built-in quick-start language model")
    train.add_argument("--out", default="runs/quickstart", help="the local run folder")
    train.add_argument("--steps", type=int, default=300, help="optimizer steps (>= 1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dew` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        if args.steps < 1:
            parser.error(f"--steps must be >= 1, got {args.steps}")
        from dew._quickstart import run_quickstart

        run_quickstart(args.out, steps=args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
