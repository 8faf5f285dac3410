"""A run folder: where each of a run's files is, and what reading them tells.

A run named `name` with `trainer.checkpoint_dir = root` keeps its files in `root/name`
(`run_folder`; `RunFolder` names each of them):

- `run.lock`: the lock the run holds while it trains (`dew._lock`);
- `run.json`: the `RunRecord`, the resolved configuration the run trains (`RunFolder.record`);
  a run that started over from a first attempt that failed keeps the old one as
  `run.json.previous`, and its `params.json` as `params.json.previous` (decision 0031);
- `data.json`, and `tokenizer.json` or `tokenizer.model` (a copy of the data's tokenizer
  file): what using the model needs of the data (`dew._data_record`);
- `checkpoints/<step>/`: orbax checkpoints (in a remote store instead when `root` is a
  `gs://` URI; the local files are then under `runs/name` in the working directory);
- `scalars.jsonl`, `records.jsonl`, `params.json`, `summary.json`: the `LocalTracker`'s
  journals. Their names are the journal's own (`dew.tracking._journal`: a sweep's folder, and
  any folder a `LocalTracker` writes, has them too), and this module reads them with the
  journal's readers: the fits the run made (`RunFolder.fits`, `RunFolder.fit_started`), the
  extensions of its step budget (`RunFolder.extensions`, decision 0020) and the latest step it
  reached (`RunFolder.latest_step`);
- `previews/`: the preview files the local tracker writes; `plots/`: `dew plot`'s PNGs;
- `exports.json`: the record of each `dew export` of the run (`dew.export`);
- `data-cache/`: where a source that caches (`text`'s tokens) keeps its cache, unless the
  configuration names a `cache_dir`.

Every module that writes or reads a run folder goes through this one: the recipe
(`RunConfig.train`), `RunConfig.from_run_record`, `dew.load_run` (and so `dew eval`, `dew
predict`, `dew sample`, `dew export`), `dew train`, `dew runs`, `dew plot` and the
`LocalTracker`. It imports no JAX: `dew runs`, `dew config show` and `dew plot` read run
folders without it (decision 0047).
"""

import os
import pathlib
import posixpath
from typing import Any, NamedTuple, Protocol, runtime_checkable

from dew._json import read_json
from dew.checkpoints._location import checkpoint_location, is_remote
from dew.telemetry.records import FitEnded, FitStarted, Record, RunRecord
from dew.tracking._journal import PARAMS, RECORDS, SCALARS, SUMMARY, read_records
from dew.tracking._summary import Summary, summarize

__all__ = [
    "CHECKPOINTS",
    "DATA_CACHE",
    "DATA_RECORD",
    "EXPORTS",
    "LOCAL_ROOT",
    "LOCK_FILE",
    "PARAMS",
    "PLOTS",
    "PREVIEWS",
    "PREVIOUS",
    "RECORDS",
    "RUN_RECORD",
    "SCALARS",
    "STEP_BUDGET",
    "SUMMARY",
    "TOKENIZER_COPIES",
    "Extension",
    "Fit",
    "History",
    "RunFolder",
    "latest_step",
    "read_run_record",
    "run_folder",
]

RUN_RECORD = "run.json"
PREVIOUS = ".previous"
"""The suffix of the run.json (and params.json) a run that never completed a step started
over from."""
LOCK_FILE = "run.lock"
"""The lock file's name inside the folder it locks (`dew._lock`)."""
DATA_RECORD = "data.json"
TOKENIZER_COPIES = {"huggingface": "tokenizer.json", "sentencepiece": "tokenizer.model"}
"""The run folder's copy of a tokenizer file, by the tokenizer's kind."""
CHECKPOINTS = "checkpoints"
PREVIEWS = "previews"
"""The folder under which the local journal and MLflow store preview files."""
PLOTS = "plots"
EXPORTS = "exports.json"
"""The run folder's record of its exports: a JSON list, one object per export."""
DATA_CACHE = "data-cache"
"""The folder in a run folder where a source that caches (`text`'s tokens) keeps its cache,
unless the configuration names a `cache_dir`."""
LOCAL_ROOT = "runs"
"""Where the local files of runs whose checkpoints go to a remote store are written, under
the working directory."""
STEP_BUDGET = "step_budget"
"""The journal artifact noting a run continued to another step total (decision 0020)."""
_SECTIONS = ("model", "data", "optim", "trainer")  # what every run.json holds


@runtime_checkable
class _Configured(Protocol):
    """What `run_folder` reads of a `RunConfig` (its trainer section), named structurally:
    this module is below `dew.config`, which imports it."""

    @property
    def trainer(self) -> Any: ...


def run_folder(config: _Configured, name: str) -> tuple[str, pathlib.Path]:
    """Where a run named `name` keeps its checkpoints, and its local folder (journals
    and run.json)."""
    root = checkpoint_location(config.trainer.checkpoint_dir, "trainer.checkpoint_dir")
    if is_remote(root):  # a URI's path: `gs://bucket/runs/name/checkpoints`
        remote = posixpath.join(root.rstrip("/"), name, CHECKPOINTS)
        return remote, pathlib.Path(LOCAL_ROOT) / name
    folder = pathlib.Path(root) / name
    return str(folder / CHECKPOINTS), folder


def read_run_record(path: pathlib.Path) -> dict[str, Any]:
    """The `run_record` mapping in the run.json at `path` (`RunFolder.record`; `RunConfig.load`
    reads one under another name too), its sections under `RunConfig`'s names (a run.json
    written before `optimizer` became `optim` reads as `optim`); errors name the file."""
    saved = read_json(path, f"{RUN_RECORD} (a RunRecord's JSON)")
    if not isinstance(saved, dict) or saved.get("type") != RunRecord.type:
        kind = saved.get("type") if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{path} holds a {kind!r} record, not a {RunRecord.type}.")
    record: dict[str, Any] = saved  # JSON: its keys are strings
    renamed = RunRecord.renamed.items()
    old = {key: new for key, new in renamed if key in record and new not in record}
    saved = {old.get(key, key): value for key, value in record.items()}
    missing = [key for key in _SECTIONS if key not in saved]
    if missing:
        raise ValueError(f"{path} is not a whole {RunRecord.type}: it lacks {', '.join(missing)}.")
    return saved


class Fit(NamedTuple):
    """One fit a run's journal records: its `FitStarted`, and its `FitEnded` (`None`: the
    fit runs, or was killed). `started` is `None` only for an end whose start is not in the
    journal."""

    started: FitStarted | None
    ended: FitEnded | None


class Extension(NamedTuple):
    """A run continued to another step total (decision 0020): from `from_step` (its latest
    checkpoint then), to `steps`, from the total of its fit before, `previous_steps`. The
    journal keeps one `step_budget` artifact of these three for each change."""

    from_step: int
    steps: int
    previous_steps: int | None


class History:
    """What a run folder's records journal held when it was read (`RunFolder.history`): its
    typed `records` and its other `artifacts`, each `(name, step, value)` in journal order."""

    def __init__(
        self,
        path: pathlib.Path,
        records: list[tuple[str, int | None, Record]],
        artifacts: list[tuple[str, int | None, Any]],
    ) -> None:
        self.path = path
        self.records = records
        self.artifacts = artifacts

    def fits(self) -> list[Fit]:
        """The fits, in the order they started; a resumed run has one per resume."""
        fits: list[Fit] = []
        for _, _, record in self.records:
            if isinstance(record, FitStarted):
                fits.append(Fit(record, None))
            elif isinstance(record, FitEnded):
                if fits and fits[-1].ended is None:
                    fits[-1] = fits[-1]._replace(ended=record)
                else:
                    fits.append(Fit(None, record))
        return fits

    def fit_started(self) -> list[FitStarted]:
        """Each fit's `FitStarted` record, in journal order."""
        return [record for _, _, record in self.records if isinstance(record, FitStarted)]

    def extensions(self) -> list[Extension]:
        """Each change of the run's step total, in journal order; a note that is not one
        raises `ValueError` naming the journal."""
        found = []
        for name, _, value in self.artifacts:
            if name != STEP_BUDGET:
                continue
            if not isinstance(value, dict) or set(value) != set(Extension._fields):
                raise ValueError(
                    f"{self.path}: a {STEP_BUDGET!r} note holds {value!r}, not "
                    f"{', '.join(Extension._fields)}."
                )
            found.append(Extension(**value))
        return found


def latest_step(summary: Summary, history: History) -> int | None:
    """The latest step a run's journal records: the greatest step its scalars journal
    (`summary`) logged a metric at, or the step its latest fit ended at where that is later
    (a fit ends past its last logged step); `None` where neither says."""
    logged = summary.last_step if summary.last else None
    fits = history.fits()
    ended = fits[-1].ended if fits else None
    if ended is None:
        return logged
    return ended.step if logged is None else max(logged, ended.step)


class RunFolder:
    """The run folder at `path`: where each of its files is, and what they tell.

    Nothing is read until a method asks: a `RunFolder` of a folder that does not exist yet
    names where a run would write. The journal is read anew by each method that reads it;
    read it once with `history()` to ask it several things.

    ```python
    >>> run = RunFolder("runs/tiny-lm")
    >>> str(run.run_record), str(run.checkpoints), str(run.previous(run.run_record))
    ('runs/tiny-lm/run.json', 'runs/tiny-lm/checkpoints', 'runs/tiny-lm/run.json.previous')
    >>> run.is_run(), run.fit_started(), run.extensions(), run.latest_step()
    (False, [], [], None)

    ```
    """

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> "RunFolder":
        """The run folder `path` names: the folder, or its run.json. A path that is neither
        (missing, another file, a folder without run.json) is a `FileNotFoundError` naming
        it."""
        path = pathlib.Path(path)
        if path.is_file() and path.name == RUN_RECORD:
            return cls(path.parent)
        if not path.exists():
            raise FileNotFoundError(f"no run folder at {os.fspath(path)}.")
        if not path.is_dir():
            raise FileNotFoundError(
                f"{os.fspath(path)} is a file, not a run folder (one with {RUN_RECORD})."
            )
        if not (path / RUN_RECORD).is_file():
            raise FileNotFoundError(
                f"{os.fspath(path)} is not a run folder: it has no {RUN_RECORD}."
            )
        return cls(path)

    def __repr__(self) -> str:
        return f"RunFolder({os.fspath(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunFolder) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    # Its files and folders.

    @property
    def run_record(self) -> pathlib.Path:
        return self.path / RUN_RECORD

    @property
    def lock(self) -> pathlib.Path:
        return self.path / LOCK_FILE

    @property
    def data_record(self) -> pathlib.Path:
        return self.path / DATA_RECORD

    def tokenizer_copy(self, kind: str) -> pathlib.Path:
        """The run folder's copy of a tokenizer file of `kind` (`TOKENIZER_COPIES`)."""
        return self.path / TOKENIZER_COPIES[kind]

    @property
    def checkpoints(self) -> pathlib.Path:
        """The local checkpoints folder (a run whose checkpoints go to a remote store has
        none: `run_folder` says where they are)."""
        return self.path / CHECKPOINTS

    @property
    def scalars(self) -> pathlib.Path:
        return self.path / SCALARS

    @property
    def records(self) -> pathlib.Path:
        return self.path / RECORDS

    @property
    def params(self) -> pathlib.Path:
        return self.path / PARAMS

    @property
    def summary(self) -> pathlib.Path:
        return self.path / SUMMARY

    @property
    def previews(self) -> pathlib.Path:
        return self.path / PREVIEWS

    @property
    def plots(self) -> pathlib.Path:
        return self.path / PLOTS

    @property
    def exports(self) -> pathlib.Path:
        return self.path / EXPORTS

    @property
    def data_cache(self) -> pathlib.Path:
        return self.path / DATA_CACHE

    @staticmethod
    def previous(file: pathlib.Path) -> pathlib.Path:
        """Where `file` (run.json, params.json) is kept when the run starts over."""
        return file.with_name(f"{file.name}{PREVIOUS}")

    # What they tell.

    def is_run(self) -> bool:
        """Whether the folder holds a run: a run.json."""
        return self.run_record.is_file()

    def has_journal(self) -> bool:
        """Whether the folder holds a scalars journal (a run's, or a sweep's)."""
        return self.scalars.is_file()

    def record(self) -> dict[str, Any]:
        """The `run_record` mapping run.json holds, its sections under `RunConfig`'s names
        (a run.json written before `optimizer` became `optim` reads as `optim`). A missing
        file raises `FileNotFoundError`; one that is not a whole run record, `ValueError`
        naming it."""
        return read_run_record(self.run_record)

    def history(self) -> History:
        """The records journal as it is now (empty where there is none). A torn last line is
        skipped with a warning; a malformed line raises `ValueError` naming it."""
        records, artifacts = read_records(self.path)
        return History(self.records, records, artifacts)

    def fits(self) -> list[Fit]:
        """The fits the journal records, in order (`History.fits`)."""
        return self.history().fits()

    def fit_started(self) -> list[FitStarted]:
        """Each fit's `FitStarted`, in journal order (`History.fit_started`)."""
        return self.history().fit_started()

    def latest_fit(self) -> FitStarted | None:
        """The latest fit's `FitStarted`; `None` where the journal records none, or cannot
        be read (its readers then fall back on run.json's values)."""
        try:
            started = self.fit_started()
        except (OSError, ValueError):
            return None
        return started[-1] if started else None

    def extensions(self) -> list[Extension]:
        """Each change of the run's step total (`History.extensions`)."""
        return self.history().extensions()

    def latest_step(self) -> int | None:
        """The latest step the journal records (`latest_step`): `None` for a folder without
        a journal, or whose journal records no step. A torn last line of either journal is
        skipped with a warning, a missing or stale `summary.json` is read past (the scalars
        journal is), and a malformed line raises `ValueError` naming it."""
        return latest_step(summarize(self.path), self.history())
