"""`--tracker`, `--mlflow-uri` and `--wandb-offline`: the trackers a `dew train` or `dew sweep`
run reports to beside its local journal, built (`_tracker_options` reads the options).

The local journal (`LocalTracker` in the run folder) is always written: `dew runs`, `dew eval`
and `dew plot` read it, and run.json comes with it. `--tracker` names the trackers added to it
(`local` may be named and changes nothing); see docs/decisions/0022-cli-trackers.md. Each run
(a `dew train` run, each trial of a sweep) gets trackers of its own:

- `tensorboard`: an event file in `<run folder>/tensorboard`;
- `mlflow`: a run named after the run in the MLflow experiment named after its top-level name
  (a sweep's trials share the sweep's experiment), in the store `--mlflow-uri`, else
  `MLFLOW_TRACKING_URI`, else the SQLite database `mlflow.db` beside the run folders; MLflow's
  and alembic's INFO lines are left out while its run is open;
- `wandb`: a run of the W&B project named the same way, written under the run folder,
  offline with `--wandb-offline`.

They are built at the run's first report, once the recipe has checked the run folder; only
process zero of a multi-process run builds them, the others report to none.
"""

import argparse
import contextlib
import logging
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dew.cli._errors import _message
from dew.cli._tracker_options import checked_trackers
from dew.tracking import Tracker
from dew.tracking._base import AbstractRunTracker

__all__ = ["open_trackers", "tensorboard_hint"]

TENSORBOARD_FOLDER = "tensorboard"
"""The folder of a run's TensorBoard event files, inside its run folder."""
MLFLOW_DATABASE = "mlflow.db"


def _store(args: argparse.Namespace, config: Any) -> str:
    """`--mlflow-uri`, else `MLFLOW_TRACKING_URI`, else `<runs root>/mlflow.db` (SQLite)."""
    from dew.checkpoints._location import checkpoint_location, is_remote
    from dew.config._recipe import LOCAL_ROOT

    if args.mlflow_uri is not None:
        return args.mlflow_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = checkpoint_location(config.trainer.checkpoint_dir, "trainer.checkpoint_dir")
    folder = pathlib.Path(LOCAL_ROOT if is_remote(root) else root)
    return f"sqlite:///{(folder / MLFLOW_DATABASE).resolve()}"


def _build(name: str, args: argparse.Namespace, config: Any, folder: pathlib.Path) -> Any:
    run = config.trainer.name
    group = run.split("/")[0]  # a sweep's trials `<sweep>/trial-<i>` share the sweep's
    # A tracker that cannot open is the user's to fix (a store's path, a missing driver, a
    # login): a ValueError naming the tracker, which every process of a multi-process run
    # agrees on (dew.config._recipe opens the trackers as one phase).
    if name == "tensorboard":
        from dew.tracking.tensorboard import TensorBoardTracker

        logdir = folder / TENSORBOARD_FOLDER
        try:
            return TensorBoardTracker(logdir)
        except OSError as error:
            message = _message(error)
            raise ValueError(f"TensorBoard cannot write in {str(logdir)!r}: {message}") from error
    if name == "mlflow":
        from mlflow.exceptions import MlflowException

        from dew.tracking.mlflow import MLflowTracker

        store = _store(args, config)
        try:
            return MLflowTracker(group, run, uri=store)
        except MlflowException as error:
            message = error.message.strip()
            raise ValueError(f"MLflow cannot open the store {store!r}: {message}") from error
        except (OSError, ImportError) as error:  # a store's folder, a database's driver
            raise ValueError(
                f"MLflow cannot open the store {store!r}: {_message(error)}"
            ) from error
    import wandb.errors

    from dew.tracking.wandb import WandbTracker

    try:
        return WandbTracker(group, run, offline=bool(args.wandb_offline), dir=folder)
    except (wandb.errors.Error, OSError) as error:  # not logged in, a bad project name, ...
        raise ValueError(f"W&B cannot start the run: {_message(error)}") from error


class _OnFirstReport(AbstractRunTracker):
    """A tracker built when the run first reports to it: after the recipe has checked the
    run folder, so a run it refuses leaves no event file or MLflow or W&B run behind."""

    def __init__(self, build: Callable[[], Tracker]) -> None:
        self._build: Callable[[], Tracker] | None = build
        self._tracker: Tracker | None = None

    def _open(self) -> Tracker:
        if self._tracker is None:
            build, self._build = self._build, None  # built once: a failed build is not retried
            if build is None:
                raise RuntimeError("the --tracker trackers failed to open; they record nothing.")
            self._tracker = build()
        return self._tracker

    def _describe(self) -> str:
        return "the --tracker trackers"

    def _log_params(self, values: Mapping[str, Any]) -> None:
        self._open().log_params(values)

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        self._open().log_metrics(values, step=step)

    def _log_artifact(self, name: str, value: Any, *, step: Any) -> None:
        self._open().log_artifact(name, value, step=step)

    def _close(self) -> None:  # what it built is closed by `open_trackers`
        pass


@contextlib.contextmanager
def open_trackers(
    args: argparse.Namespace,
    config: Any,
    *,
    announce: Callable[[pathlib.Path], None] | None = None,
) -> Iterator[Tracker | None]:
    """The trackers `--tracker` adds for the run `config.trainer.name`, as one tracker for
    `RunConfig.train(tracker=...)`: `None` when there are none, and on every process but
    zero. They are built at the run's first report (`announce` is then called with the
    TensorBoard event folder) and closed when the block ends; a block that raises ends the
    MLflow and W&B runs failed."""
    from dew._processes import is_process_zero
    from dew.config._recipe import run_folder
    from dew.tracking import Trackers

    names = checked_trackers(args)
    if not names or not is_process_zero():
        yield None
        return
    with contextlib.ExitStack() as stack:

        def build() -> Tracker:
            if "mlflow" in names:  # until the trackers close, as they write
                stack.enter_context(_quiet_loggers(_MLFLOW_LOGGERS))
            _, folder = run_folder(config, config.trainer.name)
            built = [stack.enter_context(_build(name, args, config, folder)) for name in names]
            if "tensorboard" in names and announce is not None:
                announce(folder / TENSORBOARD_FOLDER)
            return built[0] if len(built) == 1 else Trackers(*built)

        yield _OnFirstReport(build)


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


def tensorboard_hint(folder: str | os.PathLike[str]) -> str:
    """The line that tells how to view the event files under `folder`."""
    return f"TensorBoard: tensorboard --logdir {folder}"
