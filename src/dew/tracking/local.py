"""A tracker that writes synchronous JSONL journals and preview files to a local folder."""

import dataclasses
import json
import math
import os
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

from dew.artifacts import Artifact
from dew.naming import check_name, flatten_parameters
from dew.telemetry.records import (
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
_ENCODER = json.JSONEncoder(allow_nan=False)


def _encode_scalars(values: Mapping[str, Any]) -> dict[str, Any]:
    encoded = {}
    for tag, value in values.items():
        value = float(value) if not isinstance(value, int | float) else value
        if isinstance(value, float) and not math.isfinite(value):
            value = encode_json_value(value)
        encoded[tag] = value
    return encoded


def _heal_torn_tail(path: pathlib.Path) -> None:
    """Cut a journal back to its last complete line, so appending never glues a
    new line onto a line a crash left half-written."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as journal:
        journal.seek(-1, os.SEEK_END)
        if journal.read(1) == b"\n":
            return
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1
        journal.truncate(keep)
    warnings.warn(
        f"{path} ended in a torn line (a crash mid-write?); cut it back to its last "
        f"complete line ({len(data) - keep} bytes dropped).",
        stacklevel=3,
    )


class LocalTracker(AbstractTracker):
    """Synchronous JSONL journals of scalars and typed records, plus preview files.

    Layout of `path`:

    - `scalars.jsonl`: one line per `log_metrics` call,
      `{"step": 5, "values": {"lm/train/loss": 1.2}}`, flushed at once.
    - `records.jsonl`: one line per artifact that is a record or a plain JSON
      value, `{"name": ..., "step": ..., "record": {...}}` / `"value": ...`;
      previews add a line pointing at their files.
    - `params.json`: the flattened parameters logged so far.
    - `previews/<name>/<step>/...`: PNG images, animated GIF clips, JSON token
      rows and histograms (`dew.tracking.preview_files`).
    - `run.json`: the first `RunRecord` logged, written only when absent: a
      recipe's run.json is never overwritten.

    Non-finite values are written as `"NaN"`, `"+Inf"`, `"-Inf"`. Reopening a
    folder appends to its journals. With `plots=True` (extra `plots`), closing
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
        for name in (SCALARS, RECORDS):
            _heal_torn_tail(self.path / name)
        self._scalars = (self.path / SCALARS).open("a", encoding="utf-8")
        self._records = (self.path / RECORDS).open("a", encoding="utf-8")
        params_file = self.path / PARAMS
        self._params: dict[str, Any] = (
            json.loads(params_file.read_text()) if params_file.exists() else {}
        )
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(
                f"LocalTracker({str(self.path)!r}) is closed; it records nothing more."
            )

    def log_params(self, values: Mapping[str, Any]) -> None:
        self._check_open()
        flat = encode_json_value(flatten_parameters(values))
        self._params.update(flat)
        target = self.path / PARAMS
        temporary = target.with_suffix(".json.tmp")
        temporary.write_text(
            json.dumps(self._params, indent=2, sort_keys=True, default=repr) + "\n"
        )
        os.replace(temporary, target)

    def log_metrics(self, values: Mapping[str, Any], *, step: int) -> None:
        self._check_open()
        report = {"step": int(step), "values": values}
        try:  # the common case: finite Python numbers, encoded by one shared encoder
            line = _ENCODER.encode(report)
        except (TypeError, ValueError):  # non-finite values, NumPy or JAX scalars
            report["values"] = _encode_scalars(values)
            line = _ENCODER.encode(report)
        self._scalars.write(line + "\n")
        self._scalars.flush()

    def log_artifact(self, name: str, value: Any, *, step: int | None = None) -> None:
        self._check_open()
        check_name("artifact name", name)
        entry: dict[str, Any] = {"name": name, "step": step}
        if isinstance(value, Record):
            entry["record"] = value.to_dict()
            if isinstance(value, RunRecord):
                self._write_run_record(value)
        elif isinstance(value, Artifact):
            files = preview_files(value)  # render first: a refused preview leaves no folder
            folder = self.path / PREVIEWS / name / ("none" if step is None else str(step))
            folder.mkdir(parents=True, exist_ok=True)
            written = []
            for suffix, content in files:
                (folder / suffix).write_bytes(content)
                written.append(str((folder / suffix).relative_to(self.path)))
            entry["files"] = written
        else:
            entry["value"] = encode_json_value(value)
        self._records.write(json.dumps(entry, allow_nan=False, default=_unjsonable(name)) + "\n")
        self._records.flush()

    def _write_run_record(self, record: RunRecord) -> None:
        target = self.path / RUN_RECORD
        if target.exists():
            return
        target.write_text(json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")

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


def _unjsonable(name: str):
    def fail(value: Any) -> Any:
        raise TypeError(
            f"LocalTracker cannot journal artifact {name!r}: {type(value).__name__} is not a "
            "record, a preview artifact or a JSON value."
        )

    return fail


@dataclasses.dataclass(frozen=True)
class Journal:
    """What a `LocalTracker` folder holds, as `read_journal` returns it.

    - `scalars`: metric tag to `[(step, value), ...]`, values as floats.
    - `records`: `[(name, step, record)]` for every typed record, in order.
    - `artifacts`: `[(name, step, value_or_files)]` for the other artifacts.
    - `params`: the flattened parameters.
    """

    scalars: dict[str, list[tuple[int, float]]]
    records: list[tuple[str, int | None, Record]]
    artifacts: list[tuple[str, int | None, Any]]
    params: dict[str, Any]


def _read_lines(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    torn_tail = lines[-1]  # empty when the file ends in a newline
    entries = []
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: line {number} is not valid JSON ({error}).") from error
    if torn_tail.strip():
        try:
            entries.append(json.loads(torn_tail))
        except json.JSONDecodeError:
            warnings.warn(
                f"{path}: skipped a torn last line (a crash mid-write?); every line before it "
                "was read.",
                stacklevel=3,
            )
    return entries


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read a `LocalTracker` folder back: scalars by tag, records, artifacts, params.

    A torn last line (a crash mid-write) is skipped with a warning; a malformed
    line anywhere else raises `ValueError` naming it.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no LocalTracker folder at {str(path)!r}.")
    scalars: dict[str, list[tuple[int, float]]] = {}
    for entry in _read_lines(path / SCALARS):
        for tag, value in entry["values"].items():
            scalars.setdefault(tag, []).append((entry["step"], float(decode_json_value(value))))
    records: list[tuple[str, int | None, Record]] = []
    artifacts: list[tuple[str, int | None, Any]] = []
    for entry in _read_lines(path / RECORDS):
        if "record" in entry:
            records.append((entry["name"], entry["step"], record_from_dict(entry["record"])))
        elif "files" in entry:
            artifacts.append((entry["name"], entry["step"], entry["files"]))
        else:
            artifacts.append((entry["name"], entry["step"], decode_json_value(entry["value"])))
    params_file = path / PARAMS
    params = decode_json_value(json.loads(params_file.read_text())) if params_file.exists() else {}
    return Journal(scalars, records, artifacts, params)
