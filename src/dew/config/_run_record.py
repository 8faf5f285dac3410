"""A run folder's record, read without building anything: its run.json's configuration
sections (`RunConfig.from_run_record`, `dew config show RUN`) and the step total of its
latest fit. Apart from the training recipe (`dew.config._recipe`), which imports JAX, so
reading a configuration does not (decision 0047)."""

import os
import pathlib
from typing import Any

from dew._json import read_json
from dew.checkpoints._location import uri_scheme
from dew.telemetry.records import RunRecord

__all__ = ["latest_total", "run_record_path", "run_record_sections"]


def _read_run_record(path: pathlib.Path) -> dict[str, Any]:
    """The `run_record` mapping in a run folder's run.json, its sections under `RunConfig`'s
    names (a run.json written before `optimizer` became `optim` reads as `optim`); errors
    name the file."""
    saved = read_json(path, "run.json (a RunRecord's JSON)")
    if not isinstance(saved, dict) or saved.get("type") != "run_record":
        kind = saved.get("type") if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{path} holds a {kind!r} record, not a run_record.")
    old = {key: new for key, new in RunRecord.renamed.items() if key in saved and new not in saved}
    saved = {old.get(key, key): value for key, value in saved.items()}
    missing = [key for key in ("model", "data", "optim", "trainer") if key not in saved]
    if missing:
        raise ValueError(f"{path} is not a whole run_record: it lacks {', '.join(missing)}.")
    return saved


def run_record_path(path: str | os.PathLike[str]) -> pathlib.Path:
    """A run folder's run.json (`path`: the folder or the file)."""
    path = pathlib.Path(path)
    return path / "run.json" if path.is_dir() else path


def run_record_sections(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The configuration sections a run folder's run.json records, as
    `RunConfig.from_dict` reads them (`path`: the folder or the file), located where the
    folder is now (`_located`)."""
    path = run_record_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no run.json at {str(path)!r}: is this a run folder?")
    saved = _read_run_record(path)
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


def latest_total(folder: pathlib.Path) -> int | None:
    """The step total of the latest fit a run folder's journal records (`None`: no journal,
    or one that cannot be read: run.json's total stands)."""
    from dew.tracking._journal import read_records

    if not (folder / "records.jsonl").exists():
        return None
    try:
        records, _ = read_records(folder)
    except (OSError, ValueError):
        return None
    totals = [entry.steps for _, _, entry in records if entry.type == "fit_started"]
    return totals[-1] if totals else None
