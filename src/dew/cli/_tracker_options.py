"""`--tracker`, `--mlflow-uri` and `--wandb-offline` as the command reads them: the names
`--tracker` takes, each checked (and its library found) while the arguments are parsed, and
the options checked against the trackers named. `dew.cli._trackers` builds the trackers."""

import argparse
import importlib

__all__ = ["TRACKERS", "checked_trackers", "tracker_names"]

TRACKERS = ("local", "tensorboard", "mlflow", "wandb")
"""The names `--tracker` takes."""

_PACKAGES = {  # a tracker's module, the library's name and the extra that installs it
    "tensorboard": ("tensorboard", "TensorBoard", "tensorboard"),
    "mlflow": ("mlflow", "MLflow", "mlflow"),
    "wandb": ("wandb", "W&B", "wandb"),
}


def tracker_names(text: str) -> tuple[str, ...]:
    """`--tracker`'s value: a comma-separated list of `TRACKERS`, each once, in order.

    An unknown name, or a tracker whose library is not installed, is an argument error
    (exit status 2) naming it and what is allowed or which extra installs it.
    """
    names: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in TRACKERS:
            shown = f"unknown tracker {name!r}" if name else "an empty tracker name"
            raise argparse.ArgumentTypeError(
                f"{shown} in {text!r}; choose from {', '.join(TRACKERS)} "
                "(a comma-separated list, e.g. local,tensorboard)"
            )
        if name not in names:
            names.append(name)
    for name in names:
        if name in _PACKAGES:
            module, library, extra = _PACKAGES[name]
            try:
                importlib.import_module(module)
            except ImportError:
                raise argparse.ArgumentTypeError(
                    f"--tracker {name} needs {library}, which is not installed: install "
                    f"dew-ml[{extra}] (pip install 'dew-ml[{extra}]')"
                ) from None
    return tuple(names)


def checked_trackers(args: argparse.Namespace) -> tuple[str, ...]:
    """The trackers `args` add to the local journal; an option for a tracker not asked
    for raises `ValueError`."""
    names = tuple(getattr(args, "tracker", None) or ("local",))
    if getattr(args, "mlflow_uri", None) is not None and "mlflow" not in names:
        raise ValueError(
            f"--mlflow-uri is for the MLflow tracker; add mlflow to --tracker (got "
            f"--tracker {','.join(names)})."
        )
    if getattr(args, "wandb_offline", False) and "wandb" not in names:
        raise ValueError(
            f"--wandb-offline is for the W&B tracker; add wandb to --tracker (got "
            f"--tracker {','.join(names)})."
        )
    return tuple(name for name in names if name != "local")
