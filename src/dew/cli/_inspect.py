"""`dew data inspect`: what a run configuration's data holds, as plain data (`summary`) and as
the lines the command prints (`summary_lines`).

A split read by step (`StepBatches`, `InOrder`: any `Rows` source) is described by its rows:
their count, fingerprint, and for text its documents; windows of token IDs also count the
tokens they cover. A streamed split (`Dataset(train=callable)`) has no rows to count: its
training side says the records `Dataset.records` gives, its validation side counts the rows of
one pass. The batch shown is the one a one-process run trains on at the step (a stream's is
drawn by replaying the stream up to it) or the validation pass's batch of that number.
"""

import dataclasses
import itertools
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from dew.data import Dataset, InOrder, Partition, StepBatches
from dew.data._text import TextWindows
from dew.data.tokenizers._protocol import Tokenizer
from dew.data.tokenizers._readable import END_OF_DOCUMENT, readable_text, tokenizer_name

__all__ = [
    "END_OF_DOCUMENT",
    "BatchView",
    "batch_view",
    "decoded",
    "image_fields",
    "label_field",
    "summary",
    "summary_lines",
]

_ONE = Partition(0, 1)


@dataclasses.dataclass(frozen=True)
class BatchView:
    """One batch of a split: its arrays, and the rows it reads where the split has rows."""

    split: str
    step: int
    arrays: Mapping[str, np.ndarray]
    rows: np.ndarray | None


def _split_rows(batches: Any) -> Any:
    """The `Rows` a split reads (a `StepBatches`' or an `InOrder`'s), else `None` (a stream)."""
    return batches.rows if isinstance(batches, StepBatches | InOrder) else None


def _leading(arrays: Mapping[str, Any]) -> int:
    return int(np.shape(next(iter(arrays.values())))[0]) if arrays else 0


def _token_field(arrays: Mapping[str, np.ndarray], tokenizer: Tokenizer | None) -> str | None:
    """The field that holds windows of token IDs: `"text"` when it is a 2-D integer array
    (what `LMObjective` reads), or the one such array of a source with a tokenizer."""
    windows = [
        name
        for name, array in arrays.items()
        if np.ndim(array) == 2 and np.issubdtype(np.asarray(array).dtype, np.integer)
    ]
    if "text" in windows:
        return "text"
    return windows[0] if tokenizer is not None and len(windows) == 1 else None


def image_fields(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The fields that hold images `(rows, height, width, 1|3|4)` or clips
    `(rows, frames, height, width, 1|3|4)`."""
    return [
        name
        for name, array in arrays.items()
        if np.ndim(array) in (4, 5) and np.shape(array)[-1] in (1, 3, 4)
    ]


def label_field(arrays: Mapping[str, np.ndarray]) -> str | None:
    for name in ("labels", "label"):
        array = arrays.get(name)
        if (
            array is not None
            and np.ndim(array) == 1
            and np.issubdtype(np.asarray(array).dtype, np.integer)
        ):
            return name
    return None


def _split_summary(batches: Any, tokenizer: Tokenizer | None, records: int | None) -> dict:
    rows = _split_rows(batches)
    if rows is None:
        return {"stream": True, "rows": records, "fingerprint": None}
    found: dict[str, Any] = {"stream": False, "rows": len(rows), "fingerprint": rows.fingerprint}
    if isinstance(rows, TextWindows):
        found["documents"] = int(rows.documents.size)
    if len(rows):
        first = rows.read(np.zeros(1, np.int64))
        field = _token_field(first, tokenizer)
        if field is not None:  # windows sharing one boundary token: each covers width - 1 more
            width = int(np.shape(first[field])[1])
            found["tokens"] = len(rows) * (width - 1) + 1
    return found


def _validation_stream(val: Any) -> dict:
    """A streamed validation split's rows: one pass counted (a pass is finite)."""
    count = sum(_leading(batch) for batch in val(_ONE))
    return {"stream": True, "rows": count, "fingerprint": None}


def _nth(batches: Iterator[Mapping[str, Any]], step: int, what: str) -> Mapping[str, Any]:
    found = next(itertools.islice(batches, step, None), None)
    if found is None:
        raise ValueError(f"--step {step} is past the end of {what}.")
    return found


def batch_view(data: Dataset, split: str, step: int, source: str) -> BatchView:
    """The batch `dew data inspect --split SPLIT --step STEP` shows."""
    if split == "train":
        train = data.train
        if isinstance(train, StepBatches):
            rows = train.indices(step, _ONE)
            return BatchView(split, step, train.rows.read(rows), rows)
        return BatchView(split, step, _nth(train(_ONE), step, f"{source}'s training stream"), None)
    if data.val is None:
        raise ValueError(
            f"the dataset {source!r} has no validation data (inspect --split train, or give "
            "the dataset a val_fraction)."
        )
    if isinstance(data.val, InOrder):
        count = len(data.val.rows)
        total = -(-count // data.val.batch)
        if step >= total:
            raise ValueError(
                f"--step {step} is past the validation split's {total} batch(es) of "
                f"{data.val.batch} rows ({count} rows): pick a step from 0 to {total - 1}."
            )
        rows = np.arange(step * data.val.batch, min(count, (step + 1) * data.val.batch))
        return BatchView(split, step, data.val.rows.read(rows), rows)
    return BatchView(split, step, _nth(data.val(_ONE), step, f"{source}'s validation pass"), None)


def _printable(text: str) -> str:
    """`text` with control and format characters (but newlines and tabs) escaped, so a
    corpus cannot drive the terminal."""
    return "".join(
        character
        if character in "\n\t" or unicodedata.category(character) not in ("Cc", "Cf")
        else character.encode("unicode_escape").decode("ascii")
        for character in text
    )


def decoded(tokenizer: Tokenizer, ids: np.ndarray) -> str:
    """A row of token IDs as text, `END_OF_DOCUMENT` where a document ends
    (`dew.data.tokenizers._readable.readable_text`)."""
    return readable_text(tokenizer, ids)


def _field_summary(array: Any) -> dict:
    array = np.asarray(array)
    found: dict[str, Any] = {"dtype": array.dtype.name, "shape": list(array.shape)}
    if array.size and (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        found["min"], found["max"] = array.min().item(), array.max().item()
    return found


def summary(
    data: Dataset, view: BatchView, *, source: str, shown_rows: int, classes: Any = None
) -> dict:
    """`dew data inspect --json`'s object: the splits, the tokenizer, and the batch."""
    tokenizer = data.tokenizer
    splits = {"train": _split_summary(data.train, tokenizer, data.records)}
    if data.val is not None:
        rows = _split_rows(data.val)
        splits["validation"] = (
            _validation_stream(data.val)
            if rows is None
            else _split_summary(data.val, tokenizer, None)
        )
    arrays = view.arrays
    shown = min(shown_rows, _leading(arrays))
    batch: dict[str, Any] = {
        "split": "validation" if view.split == "val" else "train",
        "step": view.step,
        "rows": _leading(arrays),
        "row_indices": None if view.rows is None else [int(row) for row in view.rows],
        "fields": {name: _field_summary(array) for name, array in arrays.items()},
    }
    field = _token_field(arrays, tokenizer)
    if field is not None:
        ids = np.asarray(arrays[field])[:shown]
        batch["text" if tokenizer is not None else "token_ids"] = [
            _printable(decoded(tokenizer, row)) if tokenizer is not None else row.tolist()
            for row in ids
        ]
    label = label_field(arrays)
    if label is not None:
        values = np.asarray(arrays[label]).tolist()
        batch["labels"] = values
        if classes:
            batch["classes"] = [
                classes[value] if 0 <= value < len(classes) else None for value in values
            ]
    return {
        "dataset": source,
        "tokenizer": None
        if tokenizer is None
        else {
            "name": tokenizer_name(tokenizer),
            "vocab_size": int(tokenizer.vocab_size),
            "eos_id": int(tokenizer.eos_id),
        },
        "classes": None if not classes else list(classes),
        "splits": splits,
        "batch": batch,
    }


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def summary_lines(found: Mapping[str, Any]) -> list[str]:
    """The lines `dew data inspect` prints for `summary`'s object."""
    lines = [f"dataset      {found['dataset']}"]
    tokenizer = found["tokenizer"]
    if tokenizer is not None:
        lines.append(
            f"tokenizer    {tokenizer['name']}  vocab_size {tokenizer['vocab_size']:,}  "
            f"end of document {tokenizer['eos_id']}"
        )
    if found["classes"]:
        lines.append(f"classes      {', '.join(found['classes'])}")
    splits = found["splits"]
    columns = ["rows", "documents", "tokens", "fingerprint"]
    present = [
        column
        for column in columns
        if column in ("rows", "fingerprint") or any(column in split for split in splits.values())
    ]
    table = [["split", *present]]
    for name, split in splits.items():
        cells = []
        for column in present:
            value = split.get(column)
            if column == "fingerprint":
                cells.append("- (a stream)" if split["stream"] else value)
            else:
                cells.append(_count(value))
        table.append([name, *cells])
    widths = [max(len(row[index]) for row in table) for index in range(len(table[0]))]
    for row in table:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    batch = found["batch"]
    where = f"step {batch['step']}" if batch["split"] == "train" else f"batch {batch['step']}"
    indices = batch["row_indices"]
    read = "" if indices is None else f" (rows {_row_list(indices)})"
    lines.append(f"batch        {batch['split']} {where}: {batch['rows']} rows{read}")
    for name, field in batch["fields"].items():
        shape = "x".join(str(size) for size in field["shape"])
        span = f"  [{field['min']:.4g}, {field['max']:.4g}]" if "min" in field else ""
        lines.append(f"  {name}  {field['dtype']} {shape}{span}")
    if "labels" in batch:
        names = batch.get("classes")
        shown = names if names else batch["labels"]
        lines.append(f"  labels: {_row_list([str(value) for value in shown], most=32)}")
    sheet = batch.get("contact_sheet")
    if sheet is not None:
        lines.append(
            f"  contact sheet {sheet['path']} ({sheet['field']}, values {sheet['values']})"
        )
    for index, text in enumerate(batch.get("text", [])):
        lines.append(f"--- row {index}{'' if indices is None else f' (row {indices[index]})'}")
        lines.extend(text.split("\n"))
    for index, ids in enumerate(batch.get("token_ids", [])):
        lines.append(f"--- row {index}: {' '.join(str(value) for value in ids)}")
    return lines


def _row_list(indices: list[Any], most: int = 8) -> str:
    shown = ", ".join(str(index) for index in indices[:most])
    return shown if len(indices) <= most else f"{shown}, ... {len(indices) - most} more"
