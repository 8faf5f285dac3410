"""A tracker that records one MLflow run through `MlflowClient` (extra `mlflow`)."""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import pathlib
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

from dew.naming import check_index, check_path_segment, flatten_parameters, parse_parameter_path
from dew.telemetry.records import Record, encode_json_value
from dew.tracking._base import AbstractRunTracker
from dew.tracking._preview import Pieces, preview_folder

__all__ = ["DEFAULT_ARTIFACTS", "DEFAULT_STORE", "MLflowTracker"]

DEFAULT_STORE = pathlib.Path("runs") / "mlflow.db"
"""The SQLite database used when no `uri` is given, relative to the working directory."""
DEFAULT_ARTIFACTS = "mlartifacts"
"""Folder beside a local SQLite database where experiments dew creates keep artifacts."""

_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
_PARAM_VALUE_LIMIT = 6000  # MLflow's MAX_PARAM_VAL_LENGTH; read from MLflow when it has one
_METRICS_PER_BATCH = 1000  # MLflow's MAX_METRICS_PER_BATCH
_PARAMS_PER_BATCH = 100  # MLflow's MAX_PARAMS_TAGS_PER_BATCH


def _is_file_store(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter is a path


def _sqlite_file(uri: str) -> pathlib.Path | None:
    """The database file of a local `sqlite:///` URI, or None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    if path in ("", ":memory:"):
        return None
    return pathlib.Path(path)


def _resolve_store(uri: str | os.PathLike[str] | None) -> tuple[str, pathlib.Path | None]:
    """The absolute store URI, and the artifact folder for experiments dew creates."""
    if uri is None:
        database = DEFAULT_STORE.resolve()
        return f"sqlite:///{database}", database.parent / DEFAULT_ARTIFACTS
    uri = os.fspath(uri)
    database = _sqlite_file(uri)
    if database is not None:
        _, mark, query = uri.partition("?")
        database = database.resolve()
        return f"sqlite:///{database}{mark}{query}", database.parent / DEFAULT_ARTIFACTS
    if _is_file_store(uri):
        path = urlparse(uri).path if uri.startswith("file:") else uri
        return pathlib.Path(path).resolve().as_uri(), None
    return uri, None


class _ScopedVariable:
    """Sets one environment variable while any caller is inside `scope()`; the last caller
    to leave restores the value from before the first one entered, also when a call raised.

    `os.environ` is one per process: a lock and a count of the callers inside keep one
    thread from restoring the variable while another thread's call still needs it. Other
    code reading the variable meanwhile sees `value`; a change it makes meanwhile is
    undone when the last caller leaves.
    """

    def __init__(self, name: str, value: str) -> None:
        self.name, self.value = name, value
        self._lock = threading.Lock()
        self._inside = 0
        self._previous: str | None = None

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._previous = os.environ.get(self.name)
                os.environ[self.name] = self.value
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    if self._previous is None:
                        os.environ.pop(self.name, None)
                    else:
                        os.environ[self.name] = self._previous


_FILE_STORE_ALLOWED = _ScopedVariable(_ALLOW_FILE_STORE, "true")


def _param_text(value: Any) -> str:
    """The text MLflow stores for one parameter value."""
    if isinstance(value, str):
        return str(value)
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        return str(encode_json_value(number)) if not math.isfinite(number) else repr(number)
    if hasattr(value, "shape") and hasattr(value, "tolist"):  # NumPy and JAX arrays
        value = value.tolist()
        if not isinstance(value, list):
            return _param_text(value)
    if isinstance(value, list | tuple):
        return json.dumps(encode_json_value(list(value)), default=repr, allow_nan=False)
    return repr(value)


def _step_name(step: int | None) -> str:
    return "none" if step is None else str(step)


class MLflowTracker(AbstractRunTracker):
    """Record one MLflow run through `MlflowClient`; never touches MLflow's active run.

    - Store: `uri` is any store MLflow reads. Without one, a SQLite database at
      `runs/mlflow.db` under the working directory (folder created). Experiments dew
      creates in a local SQLite store keep their artifacts in `mlartifacts/` beside
      the database. A plain path or `file:` URI is a file store: MLflow 3.16+ refuses
      those unless `MLFLOW_ALLOW_FILE_STORE=true`, so the tracker sets that variable
      around each of its own MLflow calls only, then restores it, also when the call
      raised. The environment is one per process: while any file-store tracker's call
      is running, in any thread, the variable reads `true` everywhere, and the value
      from before is restored when the last such call returns.
    - `log_metrics`: one `log_batch` per call, every tag at `step`. NaN and infinities
      are passed as they are; a SQLite store reads +-inf back as +-1.797e308 (the
      largest float), a file store keeps them.
    - `log_params`: flattened by `flatten_parameters`; values become text: strings as
      they are, numbers, booleans and None as `str()` (non-finite as `NaN`, `+Inf`,
      `-Inf`), lists, tuples and arrays as JSON, anything else as `repr()`. Text
      longer than MLflow's limit (6000 characters) is cut, ends in `...[truncated]`,
      and is uploaded in full as `params/<key>.txt`. MLflow refuses a changed param,
      so logging a key again with another text raises `ValueError` before anything
      is sent; logging the same value again is a no-op.
    - `log_artifact`: a record becomes `records/<type>-<step>.json` (`record.to_json()`,
      `none` for step None; a repeated path gets `-2`, `-3`, ... before `.json`); a
      preview (`Images`, `Clips`, `TokenRows`, `Representations`, or a
      `dew.tracking.Preview` of one), logged under a preview name `stage/split/name`
      (`dew.naming.preview_name`), is uploaded as the files the local tracker writes
      (`grid.png`, `grid.gif`, `tokens.json` and `text.md`, `histogram.json`:
      `dew.tracking.preview_files`), under `previews/<stage>/<split>/<name>/<step>/`;
      other JSON values become `artifacts/<name>-<step>.json`, their `name` a path
      segment (no `/`). `TokenScores` raises `TypeError`.
    - `close()` ends the run `FAILED` when a `FitEnded` record with a status other than
      `completed` was logged, or when the tracker's `with` block raised; else `FINISHED`.

    ```python
    with MLflowTracker("regression", "baseline") as tracker:
        tracker.log_metrics({"supervised/train/loss": 0.3}, step=10)
    ```
    """

    def __init__(
        self,
        experiment: str,
        name: str | None = None,
        uri: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise ImportError(
                "MLflowTracker needs MLflow: install dew-ml[mlflow] (pip install 'dew-ml[mlflow]')."
            ) from error
        from mlflow import environment_variables
        from mlflow.utils import validation

        limit = getattr(validation, "MAX_PARAM_VAL_LENGTH", _PARAM_VALUE_LIMIT)
        # MLflow 3.16+ refuses file stores unless this variable opts in; older ones take them.
        opt_in_needed = hasattr(environment_variables, _ALLOW_FILE_STORE)
        if not isinstance(experiment, str) or not experiment:
            raise ValueError(f"experiment must be a non-empty string, got {experiment!r}.")
        self._metric, self._param = Metric, Param
        self._param_limit = int(limit)
        self.uri, artifacts = _resolve_store(uri)
        self.file_store = _is_file_store(self.uri)
        self._scope = _FILE_STORE_ALLOWED.scope if self.file_store and opt_in_needed else None
        database = _sqlite_file(self.uri)
        if database is not None:
            database.parent.mkdir(parents=True, exist_ok=True)
        self._params: dict[str, str] = {}
        self._paths: set[str] = set()
        with self._allowed():
            self.client = MlflowClient(tracking_uri=self.uri)
            found = self.client.get_experiment_by_name(experiment)
            if found is None:
                location = None if artifacts is None else artifacts.as_uri()
                try:
                    self.experiment_id = self.client.create_experiment(experiment, location)
                except MlflowException as error:  # created meanwhile by another process
                    if getattr(error, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                        raise
                    found = self.client.get_experiment_by_name(experiment)
            if found is not None:
                if found.lifecycle_stage != "active":
                    raise ValueError(
                        f"MLflow experiment {experiment!r} in {self.uri} is deleted; restore "
                        "it or choose another experiment name."
                    )
                self.experiment_id = found.experiment_id
            run = self.client.create_run(self.experiment_id, run_name=name)
        self.run_id: str = run.info.run_id
        # MLflow names every run it creates (the given name, else one of its own).
        self.name: str = run.info.run_name  # pyright: ignore[reportAttributeAccessIssue]

    def _allowed(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self._scope is None else self._scope()

    def _describe(self) -> str:
        return f"MLflowTracker(run {self.run_id})"

    def _log_params(self, values: Mapping[str, Any]) -> None:
        new: dict[str, str] = {}
        for key, value in flatten_parameters(values).items():
            text = _param_text(value)
            before = self._params.get(key, new.get(key))
            if before is not None and before != text:
                raise ValueError(
                    f"parameter {key!r} was already logged as {before!r}; MLflow refuses a "
                    f"changed value ({text!r}). Log it under another key, or start a new run."
                )
            if before is None:
                new[key] = text
        sent: dict[str, str] = {}
        full: dict[str, str] = {}
        for key, text in new.items():
            if len(text) > self._param_limit:
                full[key] = text
                marker = "...[truncated]"
                text = text[: self._param_limit - len(marker)] + marker
            sent[key] = text
        uploads = {}  # the full text is uploaded to a path built from the key
        for key, text in full.items():
            keys = parse_parameter_path(key)
            for segment in keys:
                check_path_segment(f"parameter key {key!r} (it names params/{key}.txt)", segment)
            uploads[PurePosixPath("params", *keys[:-1], f"{keys[-1]}.txt").as_posix()] = text
        params = [self._param(key, text) for key, text in sent.items()]
        with self._allowed():
            for path, text in uploads.items():
                self.client.log_text(self.run_id, text, path)
            for start in range(0, len(params), _PARAMS_PER_BATCH):
                chunk = params[start : start + _PARAMS_PER_BATCH]
                self.client.log_batch(self.run_id, params=chunk, synchronous=True)
        self._params.update(new)

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        step = check_index("step", step)
        timestamp = int(time.time() * 1000)
        metric = self._metric
        metrics = []
        for tag, value in values.items():
            try:
                number = float(value)
            except (TypeError, ValueError) as error:
                raise TypeError(
                    f"metric {tag!r} must be a real scalar, got {value!r} of type "
                    f"{type(value).__name__}."
                ) from error
            metrics.append(metric(tag, number, timestamp, step))
        with self._allowed():
            for start in range(0, len(metrics), _METRICS_PER_BATCH):
                chunk = metrics[start : start + _METRICS_PER_BATCH]
                self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)

    def _unique(self, folder: str, stem: str) -> str:
        path, count = PurePosixPath(folder, f"{stem}.json").as_posix(), 1
        while path in self._paths:
            count += 1
            path = PurePosixPath(folder, f"{stem}-{count}.json").as_posix()
        self._paths.add(path)
        return path

    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        record_type = check_path_segment("record type", record.type)
        path = self._unique("records", f"{record_type}-{_step_name(step)}")
        with self._allowed():
            self.client.log_text(self.run_id, record.to_json(), path)

    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        files = pieces.files
        where = preview_folder(name, step).as_posix()
        with tempfile.TemporaryDirectory(prefix="dew-mlflow-") as folder:
            for suffix, content in files:
                (pathlib.Path(folder) / suffix).write_bytes(content)
            with self._allowed():
                self.client.log_artifacts(self.run_id, folder, where)

    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
        try:
            text = json.dumps(encode_json_value(value), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"MLflowTracker cannot record artifact {name!r}: {type(value).__name__} is not "
                "a record, a preview artifact or a JSON value."
            ) from error
        path = self._unique("artifacts", f"{name}-{_step_name(step)}")
        with self._allowed():
            self.client.log_text(self.run_id, text, path)

    def _close(self) -> None:
        status = "FAILED" if self.failed else "FINISHED"
        with self._allowed():
            self.client.set_terminated(self.run_id, status)
