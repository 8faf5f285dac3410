"""`dew plot RUN_DIR`: render a run's plots from its local journal (extra `plots`)."""

import argparse
import pathlib

from dew._json import read_json
from dew._run_folder import RunFolder
from dew.cli._inputs import _say


def _run_name(folder: pathlib.Path) -> str:
    """The run's name as its run.json records it (`trainer.name`), else the folder's."""
    try:
        name = read_json(RunFolder(folder).run_record)["trainer"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = None
    return name if isinstance(name, str) and name else folder.resolve().name


def _plot(args: argparse.Namespace) -> int:
    """Render `<run>/plots/<metric>.png` for every bare metric of a run's journal and say
    where they went; a folder without a journal is the user's error."""
    from dew.tracking import plots

    folder = pathlib.Path(args.run_dir)
    run = RunFolder(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no run folder {str(folder)!r}.")
    if not run.has_journal():
        raise FileNotFoundError(
            f"{str(folder)!r} has no journal (scalars.jsonl): give a run folder, one that "
            "dew train wrote (dew runs lists them)."
        )
    written = plots.plot_journal(folder, run=_run_name(folder))
    if not written:
        _say(f"nothing to plot: {run.scalars} holds no metrics yet")
        return 0
    _say(f"{len(written)} plots in {run.plots}: {', '.join(p.name for p in written)}")
    return 0
