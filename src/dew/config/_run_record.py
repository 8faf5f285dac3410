"""A run folder's record, read without building anything: its run.json's configuration
sections (`RunConfig.from_run_record`, `dew config show RUN`), located where the folder is
now. Apart from the training recipe (`dew.config._recipe`), which imports JAX, so reading a
configuration does not (decision 0047); the run folder's files are `dew._run_folder`'s."""

import os
import pathlib
from typing import Any

from dew._run_folder import RunFolder, read_run_record
from dew.checkpoints._location import uri_scheme

__all__ = ["run_record_path", "run_record_sections"]


def run_record_path(path: str | os.PathLike[str]) -> pathlib.Path:
    """A run folder's run.json (`path`: the folder or the file)."""
    path = pathlib.Path(path)
    return RunFolder(path).run_record if path.is_dir() else path


def run_record_sections(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The configuration sections a run folder's run.json records, as
    `RunConfig.from_dict` reads them (`path`: the folder or the file), located where the
    folder is now (`_located`)."""
    path = run_record_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no run.json at {str(path)!r}: is this a run folder?")
    saved = read_run_record(path)
    plain = {section: saved[section] for section in ("model", "data", "optim", "trainer")}
    if saved.get("objective"):
        plain["objective"] = saved["objective"]
    if isinstance(plain["trainer"], dict):
        plain["trainer"] = _located(plain["trainer"], path.parent)
    return plain


def _located(trainer: dict[str, Any], folder: pathlib.Path) -> dict[str, Any]:
    """A recorded trainer section whose `checkpoint_dir` says where `folder` is now, when
    the record points elsewhere and the folder's path ends with the run's name: a run read
    back from a moved folder (or from another working directory) then resumes there rather
    than starting anew where it once was. Any other folder (a record copied elsewhere, a
    renamed folder), and a URI `checkpoint_dir` (the checkpoints live in a store, not in the
    folder), keep the recorded values."""
    root, name = trainer.get("checkpoint_dir"), trainer.get("name")
    if not isinstance(root, str) or uri_scheme(root) or not isinstance(name, str) or not name:
        return trainer
    segments = pathlib.PurePosixPath(name).parts  # a run name is a relative folder path
    if os.path.abspath(os.path.join(root, *segments)) == os.path.abspath(folder):
        return trainer  # where the record says: as recorded
    for candidate in (folder, pathlib.Path(os.path.abspath(folder))):
        if candidate.parts[-len(segments) :] == segments:
            return {**trainer, "checkpoint_dir": os.fspath(candidate.parents[len(segments) - 1])}
    return trainer
