"""`dew config show [CONFIG]`: a resolved run configuration as the TOML `dew train` reads."""

import argparse

from dew.cli._inputs import _configure


def _config(args: argparse.Namespace) -> int:
    """Print the configuration `args.config` names (a built-in name, default `tiny_lm`; a
    TOML file; a run folder or its run.json), after `--set`, `--name`, `--steps` and
    `--checkpoint-dir`, as `RunConfig.to_toml` writes it: `dew train FILE` trains the file
    this output is saved to as the same configuration."""
    config = _configure(args)
    print(config.to_toml(), end="")
    return 0
