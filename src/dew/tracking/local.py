"""A tracker that writes synchronous JSONL journals and preview files to a local folder."""

import dataclasses
import json
import math
import os
import pathlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dew import _json
from dew.artifacts import Artifact
from dew.naming import check_index, check_path_segment, flatten_parameters, parse_metric_tag
from dew.telemetry.records import (
    FitStarted,
    Record,
    RunRecord,
    decode_json_value,
    encode_json_value,
    record_from_dict,
)
from dew.tracking._protocol import AbstractTracker
from dew.tracking._render import preview_files

__all__ = ["Journal", "LocalTracker", "read_journal"]

SCALARS = "scalars.jsonl"
RECORDS = "records.jsonl"
PARAMS = "params.json"
PREVIEWS = "previews"
RUN_RECORD = "run.json"
RESUME = "resume"
"""The key marking a resume boundary line: `{"step": 4, "values": {}, "resume": true}`."""
_ENCODER = json.JSONEncoder(allow_nan=False)


def _metric_value(tag: str, value: Any) -> int | float | str:
    """One metric value as the journal writes it: a Python number, non-finite as a string."""
    value = _json.python_scalar(value)
    if isinstance(value, str | bytes) or not isinstance(value, int | float):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"metric {tag!r} must be a real scalar, got {value!r} of type "
                f"{type(value).__name__}."
            ) from None
    if isinstance(value, float) and not math.isfinite(value):
        return encode_json_value(value)
    return float(value) if isinstance(value, bool) else value


def _scalars_entry(entry: Any) -> str | None:
    """Why `entry` is not a scalars line, or None when it is one."""
    if not isinstance(entry, dict) or set(entry) - {"step", "values", RESUME}:
        return 'it is not {"step": ..., "values": {...}}'
    step, values = entry.get("step"), entry.get("values")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"its step is {step!r}, not an integer >= 0"
    if not isinstance(values, dict):
        return f"its values are {values!r}, not a mapping"
    for tag, value in values.items():
        if isinstance(value, str) and value in _json.NON_FINITE:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"metric {tag!r} is {value!r}, not a number"
    return None


def _records_entry(entry: Any) -> str | None:
    """Why `entry` is not a records line, or None when it is one."""
    if not isinstance(entry, dict) or "name" not in entry or "step" not in entry:
        return 'it is not {"name": ..., "step": ..., "record" | "files" | "value": ...}'
    kinds = [key for key in ("record", "files", "value") if key in entry]
    if len(kinds) != 1 or len(entry) != 3:
        return "it needs exactly one of 'record', 'files', 'value' besides 'name' and 'step'"
    step = entry["step"]
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        return f"its step is {step!r}, not None or an integer >= 0"
    if kinds == ["record"] and not isinstance(entry["record"], dict):
        return f"its record is {entry['record']!r}, not a mapping"
    return None


_SHAPES: dict[str, Callable[[Any], str | None]] = {SCALARS: _scalars_entry, RECORDS: _records_entry}


def _parse_line(path: pathlib.Path, number: int, line: bytes) -> Any:
    """One journal line, checked for its journal's shape; `ValueError` naming the line."""
    try:
        entry = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: line {number} is not UTF-8 ({error}).") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: line {number} is not valid JSON ({error}).") from error
    problem = _SHAPES[path.name](entry)
    if problem is not None:
        raise ValueError(f"{path}: line {number} is not a {path.name} line: {problem}.")
    return entry


def _lines(path: pathlib.Path) -> tuple[list[bytes], bytes]:
    """The complete lines of a journal and its tail (empty when it ends in a newline)."""
    pieces = path.read_bytes().split(b"\n")
    return pieces[:-1], pieces[-1]


def _reopen_journal(path: pathlib.Path) -> list[Any]:
    """Prepare a journal for appending, and return its entries.

    A tail without its newline is finished with one when it is a whole line, and cut
    back to the last complete line (with a warning) when it is torn, so appending never
    glues a new line onto a half-written one. A malformed complete line is kept and
    warned about, naming it: `read_journal` refuses the journal until it is repaired.
    """
    if not path.exists() or path.stat().st_size == 0:
        return []
    lines, tail = _lines(path)
    entries, malformed = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(_parse_line(path, number, line))
        except ValueError as error:
            malformed.append(str(error))
    if tail:
        try:
            entries.append(_parse_line(path, len(lines) + 1, tail))
        except ValueError:
            with path.open("rb+") as journal:
                journal.truncate(path.stat().st_size - len(tail))
            warnings.warn(
                f"{path} ended in a torn line (a crash mid-write?); cut it back to its last "
                f"complete line ({len(tail)} bytes dropped).",
                stacklevel=3,
            )
        else:
            with path.open("ab") as journal:
                journal.write(b"\n")  # a whole line whose newline was never written
    if malformed:
        more = f" (and {len(malformed) - 1} more malformed lines)" if len(malformed) > 1 else ""
        warnings.warn(
            f"{malformed[0]}{more} LocalTracker keeps it and appends after it, but "
            "read_journal refuses this journal until the line is repaired or removed.",
            stacklevel=3,
        )
    return entries


def _read_params(path: pathlib.Path) -> dict[str, Any]:
    """The parameters in `params.json`; a file that is not a JSON object raises naming it."""
    params = _json.read_json(path, "params.json (a JSON object of parameters)")
    if not isinstance(params, dict):
        raise ValueError(f"{path} holds {type(params).__name__}, not a JSON object of parameters.")
    return params


def _param_leaf(value: Any) -> Any:
    """A parameter JSON cannot hold as it is: arrays as lists, anything else its `repr`."""
    if isinstance(value, np.ndarray) or (hasattr(value, "shape") and hasattr(value, "tolist")):
        return np.asarray(value).tolist()
    return repr(value)


class LocalTracker(AbstractTracker):
    """Synchronous JSONL journals of scalars and typed records, plus preview files.

    Layout of `path`:

    - `scalars.jsonl`: one line per `log_metrics` call,
      `{"step": 5, "values": {"lm/train/loss": 1.2}}`, flushed at once. A fit that
      resumes at step `k` of a journal that already holds later steps first writes a
      boundary line `{"step": k, "values": {}, "resume": true}`.
    - `records.jsonl`: one line per artifact that is a record or a plain JSON
      value, `{"name": ..., "step": ..., "record": {...}}` / `"value": ...`;
      previews add a line pointing at their files.
    - `params.json`: the flattened parameters logged so far (replaced atomically).
    - `previews/<name>/<step>/...`: PNG images, animated GIF clips, JSON token
      rows and histograms (`dew.tracking.preview_files`).
    - `run.json`: the first `RunRecord` logged, written (atomically) only when
      absent: a recipe's run.json is never overwritten.

    Metric tags must be `stage/split/metric` (`dew.naming.parse_metric_tag`), steps
    integers >= 0, artifact names path segments (`dew.naming.check_path_segment`): a
    bad one raises before anything is written. Non-finite values are written as
    `"NaN"`, `"+Inf"`, `"-Inf"`, NumPy and JAX scalars as Python numbers. Reopening
    a folder appends to its journals. With `plots=True` (extra `plots`), closing
    renders one PNG per bare metric under `plots/`.

    ```python
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with LocalTracker(folder) as tracker:
    ...     tracker.log_metrics({"lm/train/loss": 2.5, "lm/validation/psnr": float("inf")}, step=1)
    >>> read_journal(folder).scalars
    {'lm/train/loss': [(1, 2.5)], 'lm/validation/psnr': [(1, inf)]}

    ```
    """

    def __init__(self, path: str | os.PathLike[str], plots: bool = False) -> None:
        self.path = pathlib.Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.plots = plots
        scalars = _reopen_journal(self.path / SCALARS)
        _reopen_journal(self.path / RECORDS)
        self._params: dict[str, Any] = self._reopen_params()
        self._last_step = max((entry["step"] for entry in scalars if entry["values"]), default=-1)
        self._tags: set[str] = set()  # tags already checked
        self._scalars = (self.path / SCALARS).open("a", encoding="utf-8")
        self._records = (self.path / RECORDS).open("a", encoding="utf-8")
        self.closed = False

    def _reopen_params(self) -> dict[str, Any]:
        target = self.path / PARAMS
        if not target.exists():
            return {}
        try:
            return _read_params(target)
        except ValueError as error:
            kept = target.with_name(f"{PARAMS}.unreadable")
            os.replace(target, kept)
            warnings.warn(
                f"{error} Moved it to {kept.name} (nothing is deleted); the parameters "
                "logged from now on start a new params.json.",
                stacklevel=3,
            )
            return {}

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(
                f"LocalTracker({str(self.path)!r}) is closed; it records nothing more."
            )

    def log_params(self, values: Mapping[str, Any]) -> None:
        self._check_open()
        flat = _json.encode(flatten_parameters(values), "params", default=_param_leaf)
        params = {**self._params, **flat}
        text = json.dumps(params, indent=2, sort_keys=True, allow_nan=False) + "\n"
        _json.write_atomic(self.path / PARAMS, text)
        self._params = params

    def log_metrics(self, values: Mapping[str, Any], *, step: int | np.integer) -> None:
        self._check_open()
        if type(step) is not int or step < 0:
            step = check_index("step", step)
        simple = True
        for tag, value in values.items():
            if tag not in self._tags:
                parse_metric_tag(tag)
                self._tags.add(tag)
            if type(value) is not float and type(value) is not int:
                simple = False
        if simple:  # the common case: Python numbers, encoded by one shared encoder
            try:
                line = _ENCODER.encode({"step": step, "values": values})
            except ValueError:  # non-finite values
                simple = False
        if not simple:
            encoded = {tag: _metric_value(tag, value) for tag, value in values.items()}
            line = _ENCODER.encode({"step": step, "values": encoded})
        self._scalars.write(line + "\n")
        self._scalars.flush()
        if step > self._last_step and values:
            self._last_step = step

    def log_artifact(self, name: str, value: Any, *, step: int | np.integer | None = None) -> None:
        self._check_open()
        check_path_segment("artifact name", name)
        if step is not None:
            step = check_index("step", step)
        entry: dict[str, Any] = {"name": name, "step": step}
        if isinstance(value, Record):
            entry["record"] = value.to_dict()
            if isinstance(value, FitStarted) and value.start_step < self._last_step:
                self._mark_resume(value.start_step)
            if isinstance(value, RunRecord):
                self._write_run_record(value)
        elif isinstance(value, Artifact):
            files = preview_files(value)  # render first: a refused preview leaves no folder
            folder = self.path / PREVIEWS / name / ("none" if step is None else str(step))
            folder.mkdir(parents=True, exist_ok=True)
            written = []
            for suffix, content in files:
                _json.write_atomic(folder / suffix, content, durable=False)
                written.append(str((folder / suffix).relative_to(self.path)))
            entry["files"] = written
        else:
            entry["value"] = _json.encode(value, f"artifact {name!r}", default=_unjsonable(name))
        self._records.write(json.dumps(entry, allow_nan=False) + "\n")
        self._records.flush()

    def _mark_resume(self, step: int) -> None:
        """Mark where a fit resumes: the steps after `step` are logged again, and
        `read_journal` keeps the last value per (tag, step)."""
        self._scalars.write(_ENCODER.encode({"step": step, "values": {}, RESUME: True}) + "\n")
        self._scalars.flush()

    def _write_run_record(self, record: RunRecord) -> None:
        target = self.path / RUN_RECORD
        if target.exists():
            return
        _json.write_atomic(target, json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")

    def plot(self) -> list[pathlib.Path]:
        """Render one PNG per bare metric under `plots/` from the journal (extra `plots`)."""
        from dew.tracking.plots import plot_journal

        if not self._scalars.closed:
            self._scalars.flush()
        return plot_journal(self.path)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._scalars.close()
        self._records.close()
        if self.plots:
            self.plot()


def _unjsonable(name: str) -> Callable[[Any], Any]:
    def fail(value: Any) -> Any:
        raise TypeError(
            f"LocalTracker cannot journal artifact {name!r}: {type(value).__name__} is not a "
            "record, a preview artifact or a JSON value."
        )

    return fail


@dataclasses.dataclass(frozen=True)
class Journal:
    """What a `LocalTracker` folder holds, as `read_journal` returns it.

    - `scalars`: metric tag to `[(step, value), ...]`, values as floats, one value per
      step: the last one logged.
    - `records`: `[(name, step, record)]` for every typed record, in order.
    - `artifacts`: `[(name, step, value_or_files)]` for the other artifacts.
    - `params`: the flattened parameters.
    - `resumes`: the steps at which a fit resumed (the journal's resume boundaries).
    """

    scalars: dict[str, list[tuple[int, float]]]
    records: list[tuple[str, int | None, Record]]
    artifacts: list[tuple[str, int | None, Any]]
    params: dict[str, Any]
    resumes: list[int] = dataclasses.field(default_factory=list)


def _read_lines(path: pathlib.Path) -> list[tuple[int, Any]]:
    """A journal's entries with their line numbers."""
    if not path.exists():
        return []
    lines, tail = _lines(path)
    entries = [
        (number, _parse_line(path, number, line))
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if tail.strip():
        try:
            entries.append((len(lines) + 1, _parse_line(path, len(lines) + 1, tail)))
        except ValueError as error:
            if isinstance(error.__cause__, json.JSONDecodeError | UnicodeDecodeError):
                warnings.warn(
                    f"{path}: skipped a torn last line (a crash mid-write?); every line "
                    "before it was read.",
                    stacklevel=3,
                )
            else:
                raise  # a whole line of the wrong shape
    return entries


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read a `LocalTracker` folder back: scalars by tag, records, artifacts, params.

    Each series holds one value per step, the last one logged: the steps a resumed fit
    logs again replace the values logged before the resume boundary. A torn last line
    (a crash mid-write) is skipped with a warning; a malformed line anywhere else (not
    UTF-8, not JSON, or not the journal's shape) raises `ValueError` naming the file
    and the line, and so does a `params.json` that is not a JSON object.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no LocalTracker folder at {str(path)!r}.")
    by_step: dict[str, dict[int, float]] = {}
    resumes = []
    for _, entry in _read_lines(path / SCALARS):
        step = entry["step"]
        if entry.get(RESUME):
            resumes.append(step)
        for tag, value in entry["values"].items():
            by_step.setdefault(tag, {})[step] = float(decode_json_value(value))
    scalars = {tag: list(series.items()) for tag, series in by_step.items()}
    records: list[tuple[str, int | None, Record]] = []
    artifacts: list[tuple[str, int | None, Any]] = []
    records_path = path / RECORDS
    for number, entry in _read_lines(records_path):
        if "record" in entry:
            try:
                record = record_from_dict(entry["record"])
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"{records_path}: line {number} holds no record: {error}"
                ) from error
            records.append((entry["name"], entry["step"], record))
        elif "files" in entry:
            artifacts.append((entry["name"], entry["step"], entry["files"]))
        else:
            artifacts.append((entry["name"], entry["step"], decode_json_value(entry["value"])))
    params_file = path / PARAMS
    params = decode_json_value(_read_params(params_file)) if params_file.exists() else {}
    return Journal(scalars, records, artifacts, params, resumes)
