"""What a run folder records about the data it trains on, for using the trained model later
without that data: `data.json` beside `run.json`, and a copy of the run's tokenizer file.

`data.json` holds

- `classes`: the class names (`Dataset.classes`), label `i` naming `classes[i]`, or `null`;
- `tokenizer`: the tokenizer that made the batches' token IDs (`Dataset.tokenizer`), or
  `null`: its `kind` (`"bytes"`, `"huggingface"`, `"sentencepiece"`, or `"python"` for a
  tokenizer object dew cannot rebuild), its `fingerprint`, `vocab_size` and `eos_id`, and for
  a tokenizer read from a file the name of its copy in the run folder (`tokenizer.json`,
  `tokenizer.model`), so the run stays usable when the original file moves;
- `fields`: each array field of the first training batch, its shape without the row axis
  and its dtype (`{"images": {"shape": [16, 16, 3], "dtype": "float32"}}`): the rows a
  trained model reads.

The recipe (`RunConfig.train`, `dew train`) writes it when a run starts, on process zero,
beside `run.json` once the run's trackers are open (decision 0039); `dew.load_run` reads it.
"""

import dataclasses
import json
import os
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew._json import read_json, write_atomic
from dew._run_folder import DATA_RECORD, TOKENIZER_COPIES, RunFolder
from dew.data import Dataset
from dew.data.tokenizers import BytesTokenizer, HFTokenizer, SentencePieceTokenizer, Tokenizer

__all__ = ["DATA_RECORD", "DataRecord", "read_data_record", "write_data_record"]

_COPIES = {
    HFTokenizer: ("huggingface", TOKENIZER_COPIES["huggingface"]),
    SentencePieceTokenizer: ("sentencepiece", TOKENIZER_COPIES["sentencepiece"]),
}


@dataclasses.dataclass(frozen=True)
class DataRecord:
    """A run folder's `data.json`, read: the class names, the tokenizer (rebuilt from the
    run folder's copy) and the per-row shape and dtype of each field of a training batch."""

    classes: tuple[str, ...] | None
    tokenizer: Tokenizer | None
    fields: Mapping[str, tuple[tuple[int, ...], str]]


def _fields(batch: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each array field of `batch`: its shape without the row axis, and its dtype."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in (batch or {}).items():
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if isinstance(key, str) and shape is not None and dtype is not None and len(shape) >= 1:
            found[key] = {"shape": [int(size) for size in shape[1:]], "dtype": np.dtype(dtype).name}
    return found


def _tokenizer_entry(tokenizer: Tokenizer) -> tuple[dict[str, Any], tuple[str, bytes] | None]:
    """`data.json`'s tokenizer entry, and the copy to write beside it (name, bytes)."""
    entry: dict[str, Any] = {
        "fingerprint": str(tokenizer.fingerprint),
        "vocab_size": int(tokenizer.vocab_size),
        "eos_id": int(tokenizer.eos_id),
    }
    if isinstance(tokenizer, BytesTokenizer):
        return {"kind": "bytes", **entry}, None
    for kind, (name, copy) in _COPIES.items():
        if isinstance(tokenizer, kind):
            data = pathlib.Path(tokenizer.path).read_bytes()  # type: ignore[attr-defined]
            return {"kind": name, "file": copy, **entry}, (copy, data)
    held = type(tokenizer)
    return {"kind": "python", "type": f"{held.__module__}.{held.__qualname__}", **entry}, None


def write_data_record(
    folder: str | os.PathLike[str], data: Dataset, batch: Mapping[str, Any] | None
) -> None:
    """Write `folder`'s `data.json` for `data` (whose first training batch is `batch`), and
    the copy of its tokenizer's file; a file whose content would not change is left as it
    is. Each is written whole or not at all (`write_atomic`)."""
    folder = pathlib.Path(folder)
    record: dict[str, Any] = {
        "type": "data_record",
        "classes": None if data.classes is None else list(data.classes),
        "tokenizer": None,
        "fields": _fields(batch),
    }
    writes: list[tuple[pathlib.Path, bytes]] = []
    if data.tokenizer is not None:
        record["tokenizer"], copy = _tokenizer_entry(data.tokenizer)
        if copy is not None:
            writes.append((folder / copy[0], copy[1]))
    writes.append(
        (
            RunFolder(folder).data_record,
            (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8"),
        )
    )
    for path, content in writes:  # the copy first: data.json never names a missing file
        if not (path.is_file() and path.read_bytes() == content):
            write_atomic(path, content)


def read_data_record(folder: str | os.PathLike[str]) -> DataRecord | None:
    """`folder`'s `data.json`, its tokenizer rebuilt from the run folder's copy; `None`
    when the folder has none (a run trained before runs recorded their data).

    **Raises:** `ValueError` naming the file for a `data.json` that is not a data record, or
    a tokenizer copy that is missing or no longer the tokenizer the run recorded (another
    fingerprint). A tokenizer dew cannot rebuild (a Python object of the user's) is `None`,
    with a warning naming its type.
    """
    folder = pathlib.Path(folder)
    path = RunFolder(folder).data_record
    if not path.exists():
        return None
    saved = read_json(path, "a run's data record (data.json)")
    if not isinstance(saved, dict) or saved.get("type") != "data_record":
        raise ValueError(f"{path} is not a data record (a run's data.json).")
    classes = saved.get("classes")
    fields = {
        str(key): (tuple(int(size) for size in value["shape"]), str(value["dtype"]))
        for key, value in (saved.get("fields") or {}).items()
    }
    entry = saved.get("tokenizer")
    tokenizer = None if entry is None else _rebuilt(folder, path, entry)
    return DataRecord(None if classes is None else tuple(classes), tokenizer, fields)


def _rebuilt(
    folder: pathlib.Path, path: pathlib.Path, entry: Mapping[str, Any]
) -> Tokenizer | None:
    """The tokenizer `data.json`'s entry records, checked against its fingerprint."""
    kind = entry.get("kind")
    if kind == "python":
        warnings.warn(
            f"{path}: the run's tokenizer is a {entry.get('type')} object, which dew cannot "
            "rebuild from the run folder; the loaded run has no tokenizer (decode with yours).",
            UserWarning,
            stacklevel=4,
        )
        return None
    if kind == "bytes":
        tokenizer: Tokenizer = BytesTokenizer()
    elif kind in ("huggingface", "sentencepiece"):
        copy = folder / str(entry.get("file"))
        if not copy.is_file():
            raise ValueError(
                f"{path} records a {kind} tokenizer copied to {copy}, but that file is missing."
            )
        build = HFTokenizer if kind == "huggingface" else SentencePieceTokenizer
        tokenizer = build(copy, eos=int(entry["eos_id"]))
    else:
        raise ValueError(f"{path} records a tokenizer of unknown kind {kind!r}.")
    if tokenizer.fingerprint != entry.get("fingerprint"):
        raise ValueError(
            f"{path}: the tokenizer at {getattr(tokenizer, 'path', kind)} is not the one the run "
            f"recorded (fingerprint {tokenizer.fingerprint}, recorded {entry.get('fingerprint')})."
        )
    return tokenizer
