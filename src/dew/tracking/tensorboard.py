"""A tracker that writes one TensorBoard event file, without TensorFlow (extra `tensorboard`).

TensorBoard is imported when a `TensorBoardTracker` is constructed, never when
this module is imported, so `import dew` loads no part of it.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import time
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.naming import (
    ArtifactKind,
    artifact_tag,
    check_index,
    flatten_parameters,
    metric_tag_pattern,
    parse_metric_tag,
)
from dew.telemetry.records import Record, encode_json_value
from dew.tracking._base import AbstractRunTracker
from dew.tracking._preview import Animation, Picture, Piece, Pieces, TokenTable, Transcript

__all__ = ["TensorBoardTracker", "scalars_layout"]

PARAMS_TAG = "params"


@functools.cache
def _tensorboard() -> types.SimpleNamespace:
    """TensorBoard's writer, protos and plugin metadata, imported on first use."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.custom_scalar import layout_pb2
        from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
        from tensorboard.plugins.histogram import metadata as histogram_metadata
        from tensorboard.plugins.hparams import summary_v2 as hparams_summary
        from tensorboard.plugins.image import metadata as image_metadata
        from tensorboard.plugins.scalar import metadata as scalar_metadata
        from tensorboard.plugins.text import metadata as text_metadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.util import tensor_util
    except ImportError as error:
        raise ImportError(
            "TensorBoardTracker needs TensorBoard (it does not need TensorFlow); "
            "install dew-ml[tensorboard].",
            name="tensorboard",
        ) from error
    return types.SimpleNamespace(
        EventFileWriter=EventFileWriter,
        # Classes protobuf generates at import time, which a type checker cannot see.
        Event=event_pb2.Event,  # pyright: ignore[reportAttributeAccessIssue]
        Summary=summary_pb2.Summary,  # pyright: ignore[reportAttributeAccessIssue]
        HistogramProto=summary_pb2.HistogramProto,  # pyright: ignore[reportAttributeAccessIssue]
        make_tensor_proto=tensor_util.make_tensor_proto,
        hparams_pb=hparams_summary.hparams_pb,
        layout_pb2=layout_pb2,
        layout_tag=custom_scalar_metadata.CONFIG_SUMMARY_TAG,
        layout_metadata=custom_scalar_metadata.create_summary_metadata(),
        metadata={
            "scalars": scalar_metadata.create_summary_metadata("", ""),
            "text": text_metadata.create_summary_metadata("", ""),
            "images": image_metadata.create_summary_metadata("", ""),
            "histograms": histogram_metadata.create_summary_metadata("", ""),
        },
    )


def _is_metric_tag(tag: Any) -> bool:
    try:
        parse_metric_tag(tag)
    except (TypeError, ValueError):
        return False
    return True


def scalars_layout(tags: Any) -> Any:
    """The custom_scalars layout (a `tensorboard.plugins.custom_scalar.layout_pb2.Layout`)
    that draws every split of a stage's metric on one chart.

    One category per stage (its title the stage), one multiline chart per bare metric (its
    title the metric), whose one tag regex matches exactly that stage's and metric's tags:
    `^lm/(train|validation)/loss$` for `lm/train/loss` and `lm/validation/loss`, every
    segment escaped with `re.escape`. Tags that are not metric tags (`stage/split/metric`)
    are left out. Needs TensorBoard (extra `tensorboard`).

    ```python
    >>> layout = scalars_layout(["lm/validation/loss", "lm/train/loss", "lm/train/lr"])
    >>> for category in layout.category:
    ...     for chart in category.chart:
    ...         print(category.title, chart.title, list(chart.multiline.tag))
    lm loss ['^lm/(train|validation)/loss$']
    lm lr ['^lm/(train)/lr$']

    ```
    """
    layout_pb2 = _tensorboard().layout_pb2
    charts: dict[str, dict[str, set[str]]] = {}
    for tag in filter(_is_metric_tag, tags):
        parsed = parse_metric_tag(tag)
        charts.setdefault(parsed.stage, {}).setdefault(parsed.metric, set()).add(parsed.split)
    layout = layout_pb2.Layout()
    for stage, metrics in sorted(charts.items()):
        category = layout.category.add(title=stage)
        for metric, splits in sorted(metrics.items()):
            regex = metric_tag_pattern(stage, splits, metric)
            category.chart.add(title=metric).multiline.tag.append(regex)
    return layout


def _check_step(step: Any) -> int:
    return check_index("step", step)


def _hparam_value(value: Any) -> bool | int | float | str:
    """A parameter as TensorBoard's HParams stores it: bool, number or string.

    NumPy and JAX scalars become Python scalars; anything else HParams cannot
    store (tuples, lists, None, arrays, ...) becomes its `str`, as TensorBoard's
    own v1 HParams summary does for tuples and lists.
    """
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _markdown_cell(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _artifact_text(value: Any) -> str:
    """A plain artifact value as text: strings as they are, else JSON, else `repr`."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(encode_json_value(value), allow_nan=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


class TensorBoardTracker(AbstractRunTracker):
    """Writes one TensorBoard event file with TensorBoard's own `EventFileWriter`.

    TensorFlow is not needed. Install `dew-ml[tensorboard]`. Every report is
    flushed to the event file before its call returns. Tags:

    - `log_metrics`: one event per call at `step`, one scalar summary per metric
      tag (TensorBoard stores scalars as float32; NaN and infinities as they are).
      Each call that reports a metric tag not seen before also writes TensorBoard's
      custom_scalars layout (`scalars_layout` of every metric tag so far, under
      `custom_scalars__config__`), so the Custom Scalars dashboard draws
      `lm/train/loss` and `lm/validation/loss` as two lines of one chart.
    - `log_params`: a text summary `params` at step 0, a markdown table of the
      flattened parameters logged so far, and the HParams plugin's session
      start info. HParams reads one set of hyperparameters per run, so it is
      written once, with every parameter logged before the first metric,
      artifact or `close` (parameters logged later are in the `params` table
      only). Values HParams cannot store (tuples, lists, None) become strings.
    - `log_artifact(name, value, step=...)` (`step=None` writes step 0). The
      value's kind chooses the form and `name` names the series (a preview's a
      preview name `stage/split/name`, anything else's a tag segment: non-empty, no
      `/`), so previews of different names never collide. The trainer logs its
      previews as `<stage>/validation/samples`:

      - a record (`dew.telemetry.records`): a text summary
        `reporting/<record.type>` holding the record's JSON;
      - `Images`: one PNG image summary of their labelled grid (the PNG the local
        tracker writes, `dew.tracking._grid`), `<stage>/<split>/<name>/grid`;
      - `Clips`: their animated grid, a GIF, under the same tag;
      - `Representations`: a histogram of their per-dimension spread,
        `<stage>/<split>/<name>/spread`;
      - `TokenRows`: a text table with one row of token IDs per generated row
        (only the generated positions where a mask is given),
        `<stage>/<split>/<name>/tokens`, and their decoded text, the Markdown page of
        `text.md`, `<stage>/<split>/<name>/text`;
      - a `dew.tracking.Preview` of one of these: the same, with class names and text;
      - `TokenScores`: raises `TypeError`, it has no summary form;
      - any other value: a text summary `artifacts/<name>` (strings as they
        are, else JSON, else `repr`).

    ```python
    >>> import tempfile
    >>> from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    >>> logdir = tempfile.mkdtemp()
    >>> with TensorBoardTracker(logdir) as tracker:
    ...     tracker.log_metrics({"lm/train/loss": 2.5}, step=10)
    >>> events = EventAccumulator(logdir)
    >>> _ = events.Reload()
    >>> [(event.step, event.value) for event in events.Scalars("lm/train/loss")]
    [(10, 2.5)]

    ```
    """

    _preview_form = "summary"  # "TokenScores has no summary form; TensorBoardTracker takes ..."

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self._tb = _tensorboard()
        self.logdir = pathlib.Path(logdir)
        self._writer = self._tb.EventFileWriter(str(self.logdir))
        self._described: set[str] = set()  # tags whose plugin metadata is written
        self._new_tags: list[str] = []  # tags the event being built describes
        self._params: dict[str, Any] = {}
        self._hparams_written = False
        self._charted: set[str] = set()  # the metric tags the latest layout draws

    def _describe(self) -> str:
        return f"TensorBoardTracker({str(self.logdir)!r})"

    def _event(self, step: int) -> Any:
        self._new_tags.clear()
        return self._tb.Event(wall_time=time.time(), step=step)

    def _value(self, event: Any, tag: str, plugin: str, **data: Any) -> None:
        """Add one summary value; the first value of a tag carries its plugin's
        metadata, as TensorFlow's own writers do (readers keep the first)."""
        value = event.summary.value.add(tag=tag, **data)
        if tag not in self._described:
            value.metadata.CopyFrom(self._tb.metadata[plugin])
            self._new_tags.append(tag)

    def _text(self, event: Any, tag: str, text: Any) -> None:
        tensor = self._tb.make_tensor_proto(text, dtype=np.object_)
        self._value(event, tag, "text", tensor=tensor)

    def _write(self, event: Any) -> None:
        """Hand the event to the writer and wait until it is in the file."""
        self._writer.add_event(event)
        self._writer.flush()
        self._described.update(self._new_tags)

    def _log_params(self, values: Mapping[str, Any]) -> None:
        flat = {path: _hparam_value(value) for path, value in flatten_parameters(values).items()}
        self._params.update(flat)
        rows = [f"| {_markdown_cell(k)} | {_markdown_cell(v)} |" for k, v in self._params.items()]
        table = "\n".join(["| parameter | value |", "| --- | --- |", *rows])
        event = self._event(0)
        self._text(event, PARAMS_TAG, table)
        self._write(event)

    def _write_hparams(self) -> None:
        """Write the HParams session start info once, before the first other report."""
        if self._hparams_written or not self._params:
            return
        self._hparams_written = True
        summary = self._tb.hparams_pb(self._params)
        event = self._tb.Event(wall_time=time.time(), step=0, summary=summary)
        self._writer.add_event(event)
        self._writer.flush()

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        step = _check_step(step)
        self._write_hparams()
        event = self._event(step)
        for tag, value in values.items():
            if not isinstance(tag, str) or not tag:
                raise ValueError(f"metric tags must be non-empty strings, got {tag!r}.")
            if isinstance(value, (str, bytes)):
                raise TypeError(f"metric {tag!r} must be a real scalar, got {value!r}.")
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"metric {tag!r} must be a real scalar, got {value!r} of type "
                    f"{type(value).__name__}."
                ) from None
            self._value(event, tag, "scalars", simple_value=number)
        charted = {tag for tag in values if tag not in self._charted and _is_metric_tag(tag)}
        if charted:
            self._layout(event, self._charted | charted)
        self._write(event)
        self._charted |= charted

    def _layout(self, event: Any, tags: set[str]) -> None:
        """Add the custom_scalars layout of `tags` to `event`: TensorBoard reads a run's
        latest layout, so each rewrite replaces the one before."""
        encoded = scalars_layout(tags).SerializeToString()
        event.summary.value.add(
            tag=self._tb.layout_tag,
            metadata=self._tb.layout_metadata,
            tensor=self._tb.make_tensor_proto(encoded, dtype=np.object_),
        )

    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        event = self._event(0 if step is None else step)
        self._text(event, artifact_tag(ArtifactKind.RECORD, record.type), record.to_json())
        self._write_artifact(event)

    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        rendered = tuple(pieces)  # before the event: a refused preview writes nothing
        event = self._event(0 if step is None else step)
        for piece in rendered:
            self._piece(event, artifact_tag(ArtifactKind.PREVIEW, name, piece.part), piece)
        self._write_artifact(event)

    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
        event = self._event(0 if step is None else step)
        self._text(event, artifact_tag(ArtifactKind.VALUE, name), _artifact_text(value))
        self._write_artifact(event)

    def _write_artifact(self, event: Any) -> None:
        """Write an artifact's event, after the HParams session info where it is due."""
        self._write_hparams()
        self._write(event)

    def _piece(self, event: Any, tag: str, piece: Piece) -> None:
        """Add one preview piece: grids as images (PNG and GIF bytes), token tables as a
        text table, the transcript as Markdown text, the spread as a histogram."""
        if isinstance(piece, Picture):
            self._image(event, tag, piece.pixels.shape, piece.png)
        elif isinstance(piece, Animation):
            self._image(event, tag, piece.frames.shape[1:], piece.gif)
        elif isinstance(piece, Transcript):
            self._text(event, tag, piece.markdown)
        elif isinstance(piece, TokenTable):
            tokens = piece.tokens
            mask = np.ones(tokens.shape, bool) if piece.mask is None else piece.mask
            rows = [
                " ".join(str(int(token)) for token in row[keep])
                for row, keep in zip(tokens, mask, strict=True)
            ]
            self._text(event, tag, np.array(rows, dtype=object))
        else:
            spread = piece.summary
            values = np.asarray(spread["spread"], np.float64)
            values = values[np.isfinite(values)]
            if values.size == 0:
                values = np.zeros(1)
            histo = self._tb.HistogramProto(
                min=float(values.min()),
                max=float(values.max()),
                num=float(values.size),
                sum=float(values.sum()),
                sum_squares=float(np.square(values).sum()),
                bucket_limit=spread["edges"][1:],
                bucket=spread["counts"],
            )
            self._value(event, tag, "histograms", histo=histo)

    def _image(self, event: Any, tag: str, shape: tuple[int, ...], encoded: bytes) -> None:
        height, width, channels = shape
        image = self._tb.Summary.Image(
            height=height, width=width, colorspace=channels, encoded_image_string=encoded
        )
        self._value(event, tag, "images", image=image)

    def _close(self) -> None:
        try:
            self._write_hparams()
        finally:
            self._writer.close()
