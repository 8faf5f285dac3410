"""The trackers `--tracker` adds for a `dew train` or `dew sweep` run beside its local
journal, opened (`_tracker_options` registers them and reads the options).

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
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dew.cli._tracker_options import TrackedRun, checked_trackers, trackers
from dew.telemetry.records import Record
from dew.tracking import Tracker
from dew.tracking._base import AbstractRunTracker
from dew.tracking._preview import Pieces

__all__ = ["open_trackers", "tensorboard_hint"]


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

    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        self._open().log_artifact(name, record, step=step)

    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        self._open().log_artifact(name, pieces.value, step=step)

    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
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
    zero. They are built at the run's first report, each by its registered `CommandTracker`
    (`announce` is then called with each folder a tracker announces: TensorBoard's event
    folder), and closed when the block ends; a block that raises ends the MLflow and W&B runs
    failed."""
    from dew._processes import is_process_zero
    from dew._run_folder import run_folder
    from dew.tracking import Trackers

    names = checked_trackers(args)
    if not names or not is_process_zero():
        yield None
        return
    with contextlib.ExitStack() as stack:

        def build() -> Tracker:
            _, folder = run_folder(config, config.trainer.name)
            announced: list[pathlib.Path] = []
            run = TrackedRun(args, config, folder, stack.enter_context, announced.append)
            built = [stack.enter_context(trackers[name](run)) for name in names]
            if announce is not None:
                for logdir in announced:
                    announce(logdir)
            return built[0] if len(built) == 1 else Trackers(*built)

        yield _OnFirstReport(build)


def tensorboard_hint(folder: str | os.PathLike[str]) -> str:
    """The line that tells how to view the event files under `folder`."""
    return f"TensorBoard: tensorboard --logdir {folder}"
