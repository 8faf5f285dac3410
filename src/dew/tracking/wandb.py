"""A tracker that records one Weights & Biases run (extra `wandb`)."""

from __future__ import annotations

import html
import io
import json
import numbers
import os
import pathlib
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.naming import (
    ArtifactKind,
    artifact_tag,
    check_index,
    flatten_parameters,
)
from dew.telemetry.records import Record, encode_json_value
from dew.tracking._base import AbstractRunTracker
from dew.tracking._preview import Animation, Picture, Piece, Pieces, TokenTable, Transcript

__all__ = ["WandbTracker"]


def _config_value(value: Any) -> Any:
    """A parameter value as W&B's config stores it (JSON's data model)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "shape") and hasattr(value, "tolist"):  # NumPy and JAX arrays
        return _config_value(value.tolist())
    if isinstance(value, list | tuple):
        return [_config_value(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _config_value(item) for key, item in value.items()}
    return repr(value)


def _identity(value: Any) -> str:
    """Equal for equal config values, NaN included."""
    return json.dumps(value, sort_keys=True)


def _pre(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


class WandbTracker(AbstractRunTracker):
    """Record one W&B run; the global `wandb.run` is never set.

    `wandb.init(project=project, name=name, dir=dir, reinit="create_new")` with
    `mode="offline"` when `offline=True`, else W&B's own choice (`WANDB_MODE`, online
    by default). `dir` is created when missing; None is W&B's default (`WANDB_DIR`
    or the working directory). The run is `tracker.run`.

    - `log_metrics`: one `run.log(values, step=step)`. W&B drops a report at a step
      below one it has seen, so such a step raises `ValueError` before anything is
      sent. NaN and infinities are logged as they are.
    - `log_params`: `flatten_parameters`, then `run.config.update` (tuples and arrays
      as lists, other non-JSON values as `repr()`). W&B refuses a changed config
      value, so a key logged again with another value raises `ValueError` before
      anything is sent; the same value again is a no-op.
    - `log_artifact(name, value, step=None)`, at the latest step seen when `step` is
      None (W&B would drop an older step):

      - a record: `reporting/<type>`, a `wandb.Html` holding `<pre>record JSON</pre>`;
      - `Images`: one `wandb.Image` of their labelled grid, `<stage>/<split>/<name>/grid`;
        `Clips`: one `wandb.Video` of their animated grid under the same key. Both are
        the PNG and GIF files the local tracker writes, captioned with what they show;
      - `TokenRows`: a `wandb.Table` (`row`, `prompt`, `continuation`, `tokens`, and
        `mask` when given), `<stage>/<split>/<name>/tokens`, and a `wandb.Html` of
        their text's Markdown page, `<stage>/<split>/<name>/text`;
      - `Representations`: a `wandb.Histogram` of their per-dimension spread,
        `<stage>/<split>/<name>/spread`;
      - a `dew.tracking.Preview` of one of these: the same, with class names and text;
      - `TokenScores` raises `TypeError`; any other JSON value: `artifacts/<name>`,
        a `wandb.Html` of its JSON.

    - `close()`: `run.finish(exit_code=1)` when a `FitEnded` record with a status
      other than `completed` was logged, or when the tracker's `with` block raised;
      else `exit_code=0`.

    ```python
    with WandbTracker("regression", "baseline", offline=True, dir="runs") as tracker:
        tracker.log_metrics({"supervised/train/loss": 0.3}, step=10)
    ```
    """

    def __init__(
        self,
        project: str,
        name: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as error:
            raise ImportError(
                "WandbTracker needs W&B: install dew-ml[wandb] (pip install 'dew-ml[wandb]')."
            ) from error
        if not isinstance(project, str) or not project:
            raise ValueError(f"project must be a non-empty string, got {project!r}.")
        folder = None if dir is None else pathlib.Path(dir).resolve()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self.run = wandb.init(
            project=project,
            name=name,
            dir=None if folder is None else str(folder),
            mode="offline" if offline else None,
            reinit="create_new",
        )
        self._config: dict[str, str] = {}
        self._step = 0

    def _describe(self) -> str:
        return f"WandbTracker(run {self.run.id})"

    def _check_step(self, step: Any) -> int:
        step = check_index("step", step)
        if step < self._step:
            raise ValueError(
                f"W&B takes steps in order: step {step} comes after step {self._step}, and W&B "
                "would drop the report."
            )
        return step

    def _log_params(self, values: Mapping[str, Any]) -> None:
        new: dict[str, Any] = {}
        for key, value in flatten_parameters(values).items():
            converted = _config_value(value)
            identity = _identity(converted)
            before = self._config.get(key)
            if before is not None and before != identity:
                raise ValueError(
                    f"parameter {key!r} was already logged as {before}; W&B refuses a changed "
                    f"value ({identity}). Log it under another key, or start a new run."
                )
            if before is None:
                new[key] = converted
        if new:
            self.run.config.update(new)
        self._config.update({key: _identity(value) for key, value in new.items()})

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        step = self._check_step(step)
        data = {}
        for tag, value in values.items():
            try:
                data[tag] = float(value)
            except (TypeError, ValueError) as error:
                raise TypeError(
                    f"metric {tag!r} must be a real scalar, got {value!r} of type "
                    f"{type(value).__name__}."
                ) from error
        self.run.log(data, step=step)
        self._step = step

    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        step = self._artifact_step(step)
        tag = artifact_tag(ArtifactKind.RECORD, record.type)
        self._log({tag: self._wandb.Html(_pre(record.to_json()), inject=False)}, step)

    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        step = self._artifact_step(step)
        rendered = tuple(pieces)
        with tempfile.TemporaryDirectory(prefix="dew-wandb-") as folder:
            data = {
                artifact_tag(ArtifactKind.PREVIEW, name, piece.part): self._media(
                    piece, pathlib.Path(folder)
                )
                for piece in rendered
            }
            self._log(data, step)  # W&B reads the files while the folder is there

    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
        step = self._artifact_step(step)
        try:
            text = json.dumps(encode_json_value(value), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"WandbTracker cannot record artifact {name!r}: {type(value).__name__} is "
                "not a record, a preview artifact or a JSON value."
            ) from error
        tag = artifact_tag(ArtifactKind.VALUE, name)
        self._log({tag: self._wandb.Html(_pre(text), inject=False)}, step)

    def _artifact_step(self, step: int | None) -> int:
        """An artifact's step: the latest step seen when None (W&B would drop an older one)."""
        return self._step if step is None else self._check_step(step)

    def _log(self, data: dict[str, Any], step: int) -> None:
        self.run.log(data, step=step)
        self._step = step

    def _media(self, piece: Piece, folder: pathlib.Path) -> Any:
        """One preview piece as W&B media: the grid of images as `wandb.Image` (the PNG
        file as it is), the animated grid as `wandb.Video` (the GIF), each captioned with
        what it shows; token tables as `wandb.Table` (each row's prompt, continuation and
        IDs), the transcript as `wandb.Html` (its Markdown page, as it is), the spread as
        `wandb.Histogram`."""
        wandb = self._wandb
        if isinstance(piece, Picture):
            file_name, content = piece.file
            path = folder / file_name
            path.write_bytes(content)  # wandb.Image copies the PNG file as it is
            return wandb.Image(str(path), caption=piece.caption)
        if isinstance(piece, Animation):
            return wandb.Video(io.BytesIO(piece.gif), caption=piece.caption, format="gif")
        if isinstance(piece, Transcript):
            return wandb.Html(_pre(piece.markdown), inject=False)
        if isinstance(piece, TokenTable):
            columns: list[Any] = ["row", "prompt", "continuation", "tokens"]
            rows: list[Any] = [
                [index, text.prompt, text.continuation, tokens]
                for index, (text, tokens) in enumerate(
                    zip(piece.text, piece.tokens.tolist(), strict=True)
                )
            ]
            if piece.mask is not None:
                columns.append("mask")
                for row, mask in zip(rows, piece.mask.tolist(), strict=True):
                    row.append(mask)
            return wandb.Table(columns=columns, data=rows)
        counts, edges = np.asarray(piece.summary["counts"]), np.asarray(piece.summary["edges"])
        return wandb.Histogram(np_histogram=(counts, edges))

    def _close(self) -> None:
        self.run.finish(exit_code=1 if self.failed else 0)
