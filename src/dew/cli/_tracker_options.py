"""The trackers `--tracker` adds to a run's local journal, registered once each, and the
options `--tracker`, `--mlflow-uri` and `--wandb-offline` as the command reads them.

Each tracker registers in `trackers` (a `dew.registry.Registry`) as a `CommandTracker`: the
function that builds it for one run, the library it needs and the extra that installs it,
and its own command-line options. The parser lists the registered names and adds their
options; `tracker_names` checks each name (and finds its library) while the arguments are
parsed; `checked_trackers` refuses an option whose tracker is not asked for;
`dew.cli._trackers.open_trackers` builds them. Nothing here imports a tracker or its library
until a run builds it (`dew --help` imports none), so a tracker the command can add is its
module in `dew.tracking` plus one `trackers.register` here.
"""

import argparse
import contextlib
import dataclasses
import importlib
import logging
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

from dew._registry import Registry

__all__ = [
    "CommandTracker",
    "TrackedRun",
    "TrackerOption",
    "checked_trackers",
    "tracker_choices",
    "tracker_names",
    "trackers",
]

TENSORBOARD_FOLDER = "tensorboard"
"""The folder of a run's TensorBoard event files, inside its run folder."""
MLFLOW_DATABASE = "mlflow.db"


@dataclasses.dataclass(frozen=True)
class TrackerOption:
    """A command-line option of one tracker: `flag` (`--mlflow-uri`), its `help`, and the
    `metavar` of an option that takes a value (`None`: a flag that is on or off)."""

    flag: str
    help: str
    metavar: str | None = None

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments that holds it (`mlflow_uri`)."""
        return self.flag.removeprefix("--").replace("-", "_")

    def add_to(self, group: Any) -> None:
        """Add the option to an argument group."""
        if self.metavar is None:
            group.add_argument(self.flag, action="store_true", help=self.help)
        else:
            group.add_argument(self.flag, metavar=self.metavar, help=self.help)


@dataclasses.dataclass(frozen=True)
class TrackedRun:
    """The run a `--tracker` tracker is built for.

    - `args`: the command's parsed arguments (a tracker reads its own options there);
    - `config`: the run's `dew.config.RunConfig`; `folder`: its run folder;
    - `hold(context)`: enters a context manager until the trackers close (MLflow's quiet
      loggers);
    - `announce(folder)`: tells the command a folder its viewer reads (TensorBoard's event
      folder), once every tracker is built.
    """

    args: argparse.Namespace
    config: Any
    folder: pathlib.Path
    hold: Callable[[contextlib.AbstractContextManager[Any]], Any]
    announce: Callable[[pathlib.Path], None]

    @property
    def name(self) -> str:
        """The run's name, `trainer.name` (a sweep's trial: `<sweep>/trial-<i>`)."""
        return self.config.trainer.name

    @property
    def group(self) -> str:
        """The run's top-level name: a sweep's trials share their sweep's."""
        return self.name.split("/")[0]


@dataclasses.dataclass(frozen=True)
class CommandTracker:
    """A tracker `--tracker` can add, as `trackers` registers it.

    - `build(run)`: the tracker for one `TrackedRun`. A tracker that cannot open is the
      user's to fix (a store's path, a missing driver, a login): `build` raises a
      `ValueError` naming the tracker, which every process of a multi-process run agrees on.
    - `label`: the tracker's name in messages (`MLflow`).
    - `library`: the module whose import says the tracker can be built; `extra`: the
      `dew-ml` extra that installs it.
    - `options`: its own command-line options (`TrackerOption`); one given without the
      tracker is refused.
    - `writes`: what `--tracker`'s help says it writes, if anything.

    Calling the entry builds the tracker (`entry(run)` is `entry.build(run)`).
    """

    build: Callable[[TrackedRun], Any]
    label: str
    library: str
    extra: str
    options: tuple[TrackerOption, ...] = ()
    writes: str | None = None

    def __call__(self, run: TrackedRun) -> Any:
        return self.build(run)


class _CommandTrackers(Registry[CommandTracker]):
    """The tracker registry: its names in the order registered, the order `--tracker` lists
    them in."""

    def names(self) -> tuple[str, ...]:
        """The registered names, in the order registered."""
        return tuple(self._entries)


def _check_entry(name: str, entry: Any) -> None:
    if not isinstance(entry, CommandTracker):
        raise TypeError(
            f"tracker {name!r} must be registered as a CommandTracker, got {type(entry).__name__}."
        )


trackers: Registry[CommandTracker] = _CommandTrackers("tracker", _check_entry)
"""The trackers `--tracker` adds beside the local journal, by name."""


def tracker_choices() -> tuple[str, ...]:
    """The names `--tracker` takes: `local` (the journal, always written), then the
    registered trackers."""
    return ("local", *trackers.names())


def tracker_names(text: str) -> tuple[str, ...]:
    """`--tracker`'s value: a comma-separated list of `tracker_choices()`, each once, in order.

    An unknown name, or a tracker whose library is not installed, is an argument error
    (exit status 2) naming it and what is allowed or which extra installs it.
    """
    choices = tracker_choices()
    names: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in choices:
            shown = f"unknown tracker {name!r}" if name else "an empty tracker name"
            raise argparse.ArgumentTypeError(
                f"{shown} in {text!r}; choose from {', '.join(choices)} "
                "(a comma-separated list, e.g. local,tensorboard)"
            )
        if name not in names:
            names.append(name)
    for name in names:
        if name in trackers:
            entry = trackers[name]
            try:
                importlib.import_module(entry.library)
            except ImportError:
                raise argparse.ArgumentTypeError(
                    f"--tracker {name} needs {entry.label}, which is not installed: install "
                    f"dew-ml[{entry.extra}] (pip install 'dew-ml[{entry.extra}]')"
                ) from None
    return tuple(names)


def checked_trackers(args: argparse.Namespace) -> tuple[str, ...]:
    """The trackers `args` add to the local journal; an option for a tracker not asked
    for raises `ValueError`."""
    names = tuple(getattr(args, "tracker", None) or ("local",))
    for name in trackers.names():
        entry = trackers[name]
        for option in entry.options:
            if getattr(args, option.dest, None) not in (None, False) and name not in names:
                raise ValueError(
                    f"{option.flag} is for the {entry.label} tracker; add {name} to --tracker "
                    f"(got --tracker {','.join(names)})."
                )
    return tuple(name for name in names if name != "local")


# -- the trackers dew ships ------------------------------------------------------------------


def _tensorboard(run: TrackedRun) -> Any:
    from dew.cli._errors import _message
    from dew.tracking.tensorboard import TensorBoardTracker

    logdir = run.folder / TENSORBOARD_FOLDER
    try:
        tracker = TensorBoardTracker(logdir)
    except OSError as error:
        message = _message(error)
        raise ValueError(f"TensorBoard cannot write in {str(logdir)!r}: {message}") from error
    run.announce(logdir)
    return tracker


def _store(args: argparse.Namespace, config: Any) -> str:
    """`--mlflow-uri`, else `MLFLOW_TRACKING_URI`, else `<runs root>/mlflow.db` (SQLite)."""
    from dew._run_folder import LOCAL_ROOT
    from dew.checkpoints._location import checkpoint_location, is_remote

    if args.mlflow_uri is not None:
        return args.mlflow_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = checkpoint_location(config.trainer.checkpoint_dir, "trainer.checkpoint_dir")
    folder = pathlib.Path(LOCAL_ROOT if is_remote(root) else root)
    return f"sqlite:///{(folder / MLFLOW_DATABASE).resolve()}"


_MLFLOW_LOGGERS = ("mlflow", "alembic")
"""The loggers that print INFO lines (`Creating initial MLflow database tables...`, alembic's
migrations) when MLflow opens a SQLite store: MLflow gives them handlers of their own."""


@contextlib.contextmanager
def _quiet_loggers(names: tuple[str, ...]) -> Iterator[None]:
    """Within this block, the loggers `names` print warnings and errors only; their levels
    are restored after it. The command's doing, never `import dew`'s: a library user's
    logging stays theirs."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _mlflow(run: TrackedRun) -> Any:
    from mlflow.exceptions import MlflowException

    from dew.cli._errors import _message
    from dew.tracking.mlflow import MLflowTracker

    run.hold(_quiet_loggers(_MLFLOW_LOGGERS))  # until the trackers close, as they write
    store = _store(run.args, run.config)
    try:
        return MLflowTracker(run.group, run.name, uri=store)
    except MlflowException as error:
        message = error.message.strip()
        raise ValueError(f"MLflow cannot open the store {store!r}: {message}") from error
    except (OSError, ImportError) as error:  # a store's folder, a database's driver
        raise ValueError(f"MLflow cannot open the store {store!r}: {_message(error)}") from error


def _wandb(run: TrackedRun) -> Any:
    import wandb.errors

    from dew.cli._errors import _message
    from dew.tracking.wandb import WandbTracker

    offline = bool(run.args.wandb_offline)
    try:
        return WandbTracker(run.group, run.name, offline=offline, dir=run.folder)
    except (wandb.errors.Error, OSError) as error:  # not logged in, a bad project name, ...
        raise ValueError(f"W&B cannot start the run: {_message(error)}") from error


trackers.register(
    "tensorboard",
    CommandTracker(
        _tensorboard, "TensorBoard", "tensorboard", "tensorboard",
        writes=f"writes <run folder>/{TENSORBOARD_FOLDER}",
    ),
)  # fmt: skip
trackers.register(
    "mlflow",
    CommandTracker(
        _mlflow, "MLflow", "mlflow", "mlflow",
        options=(
            TrackerOption(
                "--mlflow-uri",
                "the MLflow store (default: MLFLOW_TRACKING_URI, else sqlite:///<checkpoint "
                "dir>/mlflow.db)",
                metavar="URI",
            ),
        ),
    ),
)  # fmt: skip
trackers.register(
    "wandb",
    CommandTracker(
        _wandb, "W&B", "wandb", "wandb",
        options=(TrackerOption("--wandb-offline", "W&B writes the run offline (wandb sync)"),),
    ),
)  # fmt: skip
