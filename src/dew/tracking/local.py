"""A tracker that writes synchronous JSONL journals and preview files to a local folder."""

import json
import math
import os
import pathlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dew import _json
from dew._files import open_for_writing
from dew._run_folder import RUN_RECORD
from dew.naming import check_index, flatten_parameters, parse_metric_tag
from dew.telemetry.records import (
    FitStarted,
    Record,
    RunRecord,
    encode_json_value,
)
from dew.tracking._base import AbstractRunTracker
from dew.tracking._journal import (
    PARAMS,
    RECORDS,
    RESUME,
    SCALARS,
    SUMMARY,
    _read_params,
    _reopen_journal,
    append_line,
    repair_tail,
    warn_malformed,
)
from dew.tracking._preview import Pieces, preview_folder
from dew.tracking._summary import EVERY, summarize, write_summary

__all__ = ["LocalTracker"]

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


def _param_leaf(value: Any) -> Any:
    """A parameter JSON cannot hold as it is: arrays as lists, anything else its `repr`."""
    if isinstance(value, np.ndarray) or (hasattr(value, "shape") and hasattr(value, "tolist")):
        return np.asarray(value).tolist()
    return repr(value)


class LocalTracker(AbstractRunTracker):
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
    - `previews/<stage>/<split>/<name>/<step>/...`: the files of a preview
      (`dew.tracking.preview_files`: `grid.png` of images, `grid.gif` of clips,
      `tokens.json` and `text.md` of token rows, `histogram.json` of representations)
      logged under the preview name `stage/split/name` (`dew.naming.preview_name`).
    - `run.json`: the first `RunRecord` logged, written (atomically) only when
      absent: a recipe's run.json is never overwritten.

    Metric tags must be `stage/split/metric` (`dew.naming.parse_metric_tag`), steps
    integers >= 0, a preview's name `stage/split/name`, any other artifact's name a
    path segment (`dew.naming.check_path_segment`): a bad one raises before anything
    is written. Non-finite values are written as
    `"NaN"`, `"+Inf"`, `"-Inf"`, NumPy and JAX scalars as Python numbers. Reopening
    a folder appends to its journals. With `plots=True` (extra `plots`), closing
    renders one PNG per bare metric under `plots/`.

    ```python
    >>> import tempfile
    >>> from dew.tracking import read_journal
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
        # Opened first, never through a symbolic link (`dew._files`): a link in the folder
        # is refused before anything is read or written through it.
        self._scalars = open_for_writing(self.path / SCALARS, "a", encoding="utf-8")
        try:
            self._records = open_for_writing(self.path / RECORDS, "a", encoding="utf-8")
        except BaseException:
            self._scalars.close()
            raise
        try:
            # Only the lines past the journal's summary are read (decision 0046).
            repair_tail(self.path / SCALARS)
            malformed: list[str] = []
            self._summary = summarize(self.path, malformed=malformed)
            warn_malformed(malformed)
            _reopen_journal(self.path / RECORDS)
            self._params: dict[str, Any] = self._reopen_params()
        except BaseException:
            self._scalars.close()
            self._records.close()
            raise
        # A journal `read_journal` refuses gets no summary: every reader meets its bad line.
        self._summarized = not malformed
        self._unsummarized = 0  # lines appended since the summary was last written
        self._last_step = self._summary.last_step
        self._tags: set[str] = set()  # tags already checked

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

    def _describe(self) -> str:
        return f"LocalTracker({str(self.path)!r})"

    def _log_params(self, values: Mapping[str, Any]) -> None:
        flat = _json.encode(flatten_parameters(values), "params", default=_param_leaf)
        params = {**self._params, **flat}
        text = json.dumps(params, indent=2, sort_keys=True, allow_nan=False) + "\n"
        _json.write_atomic(self.path / PARAMS, text)
        self._params = params

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        if type(step) is not int or step < 0:
            step = check_index("step", step)
        simple = True
        for tag, value in values.items():
            if tag not in self._tags:
                parse_metric_tag(tag)
                self._tags.add(tag)
            if type(value) is not float and type(value) is not int:
                simple = False
        line = None
        if simple:  # the common case: Python numbers, encoded by one shared encoder
            try:
                line = _ENCODER.encode({"step": step, "values": values})
            except ValueError:  # non-finite values, encoded one by one below
                line = None
        if line is None:
            values = {tag: _metric_value(tag, value) for tag, value in values.items()}
            line = _ENCODER.encode({"step": step, "values": values})
        self._appended(step, values, append_line(self._scalars, self.path / SCALARS, line + "\n"))
        if step > self._last_step and values:
            self._last_step = step

    def _appended(self, step: int, values: Mapping[str, Any], line: bytes) -> None:
        """Bring the journal's summary up to `line`, just appended; write it every `EVERY`
        lines (decision 0046)."""
        self._summary.add(step, values, line)
        self._unsummarized += 1
        if self._unsummarized >= EVERY:
            self._write_summary()

    def _write_summary(self) -> None:
        # Only a summary of the journal as it is: another writer's lines would be missing.
        if self._summarized and os.fstat(self._scalars.fileno()).st_size == self._summary.size:
            write_summary(self.path, self._summary)
        self._unsummarized = 0

    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        entry = {"name": name, "step": step, "record": record.to_dict()}
        if isinstance(record, FitStarted) and record.start_step < self._last_step:
            self._mark_resume(record.start_step)
        if isinstance(record, RunRecord):
            self._write_run_record(record)
        self._append_entry(entry)

    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        files = pieces.files  # render first: a refused preview leaves no folder
        folder = self.path / preview_folder(name, step)
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for suffix, content in files:
            _json.write_atomic(folder / suffix, content, durable=False)
            written.append(str((folder / suffix).relative_to(self.path)))
        self._append_entry({"name": name, "step": step, "files": written})

    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
        encoded = _json.encode(value, f"artifact {name!r}", default=_unjsonable(name))
        self._append_entry({"name": name, "step": step, "value": encoded})

    def _append_entry(self, entry: dict[str, Any]) -> None:
        """Append one line to `records.jsonl`."""
        append_line(self._records, self.path / RECORDS, json.dumps(entry, allow_nan=False) + "\n")

    def _mark_resume(self, step: int) -> None:
        """Mark where a fit resumes: the steps after `step` are logged again, and
        `read_journal` keeps the last value per (tag, step)."""
        boundary = _ENCODER.encode({"step": step, "values": {}, RESUME: True}) + "\n"
        self._appended(step, {}, append_line(self._scalars, self.path / SCALARS, boundary))

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

    def _close(self) -> None:
        if self._unsummarized or not (self.path / SUMMARY).exists():
            self._write_summary()
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
