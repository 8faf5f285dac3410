"""`dew.data.huggingface`: a Hugging Face `datasets.Dataset` (in memory, saved with
`save_to_disk`, or read from local JSON, Parquet or CSV files) as step-indexed rows: chosen
columns as batch arrays, or one text column tokenized once into windows for a language model.
Nothing downloads."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dew._integers import check_integer
from dew.data._arrow_columns import ColumnRows, column_dtype, text_column
from dew.data._dataset import Dataset
from dew.data._documents import resolve_files
from dew.data._indexed import InOrder, StepBatches, check_fraction, fingerprint_of, indexed_dataset
from dew.data._optional import optional
from dew.data._text import windows_dataset
from dew.data._token_cache import Documents, TokenCache, documents_cache
from dew.data.tokenizers._load import load_tokenizer
from dew.data.tokenizers._protocol import Tokenizer

__all__ = ["FILE_BUILDERS", "huggingface", "huggingface_entry"]

_OWNER = "huggingface"
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
"""The file endings `huggingface` reads, and the `datasets` builder that reads each."""
_ROWS_A_READ = 4096  # a text column's strings handed to the token cache at a time


@dataclasses.dataclass(frozen=True)
class _Source:
    """A loaded `datasets.Dataset` or `DatasetDict`, and the fingerprint it is known by
    (`None`: each split's own `_fingerprint`)."""

    data: Any
    fingerprint: str | None
    shown: str


def _datasets() -> Any:
    return optional("datasets", "hf", "dew.data.huggingface")


def _saved(folder: pathlib.Path) -> bool:
    return any((folder / name).is_file() for name in ("state.json", "dataset_dict.json"))


def _file_builder(files: Sequence[pathlib.Path]) -> str:
    unknown = [path for path in files if path.suffix.lower() not in FILE_BUILDERS]
    if unknown:
        raise ValueError(
            f"{_OWNER}: {os.fspath(unknown[0])!r} is not a file huggingface reads (endings: "
            f"{', '.join(FILE_BUILDERS)}); for text files use dew.data.text."
        )
    builders = {FILE_BUILDERS[path.suffix.lower()] for path in files}
    if len(builders) > 1:
        raise ValueError(
            f"{_OWNER}: the files mix formats ({', '.join(sorted(map(str, builders)))}); name "
            "files of one format."
        )
    return builders.pop()


def _files_fingerprint(builder: str, files: Sequence[pathlib.Path]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(builder.encode())
    for path in files:
        status = path.stat()
        digest.update(repr((str(path.resolve()), status.st_size, status.st_mtime_ns)).encode())
    return digest.hexdigest()


def _reason(error: BaseException) -> str:
    """An error's first line, and its cause's (`datasets` wraps a parse error in its own)."""
    text = str(error).strip().splitlines()
    shown = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    return f"{shown}; {_reason(error.__cause__)}" if error.__cause__ is not None else shown


def _load(source: object, cache_dir: str | os.PathLike[str] | None) -> _Source:
    """`source` as a loaded dataset: a `datasets.Dataset` or `DatasetDict` as it is, a folder
    saved with `save_to_disk` through `load_from_disk`, files through `load_dataset` with the
    builder of their ending (its Arrow cache under `cache_dir/huggingface` where given)."""
    datasets = _datasets()
    if isinstance(source, datasets.Dataset | datasets.DatasetDict):
        return _Source(source, None, type(source).__name__)
    if isinstance(source, datasets.IterableDataset | datasets.IterableDatasetDict):
        raise TypeError(
            f"{_OWNER}: an {type(source).__name__} streams, and has no random access by index; "
            "load the dataset without streaming=True, or use Dataset(train=...) for a stream."
        )
    if isinstance(source, str | os.PathLike) and pathlib.Path(source).expanduser().is_dir():
        folder = pathlib.Path(source).expanduser()
        if not _saved(folder):
            raise ValueError(
                f"{_OWNER}: {os.fspath(source)!r} is a folder but no dataset saved with "
                "save_to_disk (no state.json or dataset_dict.json); name its data files with a "
                f"glob such as {os.path.join(os.fspath(source), '*.parquet')!r}."
            )
        try:
            loaded = datasets.load_from_disk(os.fspath(folder))
        except Exception as error:
            raise ValueError(
                f"{_OWNER}: datasets cannot read the saved dataset {os.fspath(source)!r} "
                f"({_reason(error)})."
            ) from None
        return _Source(loaded, None, repr(os.fspath(source)))
    if not isinstance(source, str | os.PathLike) and not (
        isinstance(source, Sequence) and not isinstance(source, str)
    ):
        raise TypeError(
            f"{_OWNER}: give a datasets.Dataset or DatasetDict, a folder saved with "
            f"save_to_disk, or local .json/.jsonl/.parquet/.csv files; got {type(source).__name__}."
        )
    entries = [source] if isinstance(source, str | os.PathLike) else list(source)
    for entry in entries:
        if isinstance(entry, str | os.PathLike):
            path = os.fspath(entry)
            if not pathlib.Path(path).expanduser().exists() and not set("*?[") & set(path):
                raise FileNotFoundError(
                    f"{_OWNER}: no file or folder at {path!r}; dew.data.huggingface reads local "
                    f"data only (nothing downloads): load a Hub dataset with "
                    f"datasets.load_dataset({path!r}) yourself and pass the Dataset."
                )
    files = resolve_files(_OWNER, entries)
    builder = _file_builder(files)
    try:
        loaded = datasets.load_dataset(
            builder,
            data_files=[os.fspath(path) for path in files],
            split="train",
            cache_dir=None if cache_dir is None else os.fspath(pathlib.Path(cache_dir) / "hf"),
        )
    except Exception as error:
        raise ValueError(
            f"{_OWNER}: datasets cannot read {os.fspath(files[0])!r}"
            f"{f' (or {len(files) - 1} more)' if len(files) > 1 else ''} as {builder} "
            f"({_reason(error)})."
        ) from None
    shown = repr(os.fspath(files[0])) + (f" and {len(files) - 1} more" if len(files) > 1 else "")
    return _Source(loaded, _files_fingerprint(builder, files), shown)


def _split(source: _Source, split: str | None, role: str) -> tuple[Any, str]:
    """The `datasets.Dataset` of `split` (a DatasetDict's; `"train"` by default) and the
    fingerprint its rows are known by."""
    datasets = _datasets()
    data = source.data
    if isinstance(data, datasets.DatasetDict):
        name = "train" if split is None else split
        if name not in data:
            splits = ", ".join(repr(key) for key in data) or "none"
            raise ValueError(
                f"{_OWNER}: the {role} split {name!r} is not in {source.shown} (its splits: "
                f"{splits}); pass {'split' if role == 'training' else 'val_split'}= naming one."
            )
        return data[name], fingerprint_of(data[name]._fingerprint, name)
    if split is not None:
        raise ValueError(
            f"{_OWNER}: {role} split {split!r} names a split, but {source.shown} is one "
            "dataset, not a DatasetDict; leave it out."
        )
    fingerprint = source.fingerprint if source.fingerprint is not None else data._fingerprint
    return data, fingerprint


def _columns(value: object) -> dict[str, str]:
    if isinstance(value, Mapping) and value:
        pairs = dict(value)
    elif isinstance(value, Sequence) and not isinstance(value, str) and value:
        pairs = {column: column for column in value}
    else:
        raise TypeError(
            f"{_OWNER}: columns must be a non-empty list of column names, or a mapping of batch "
            f"keys to column names, got {value!r}."
        )
    if not all(isinstance(item, str) and item for pair in pairs.items() for item in pair):
        raise TypeError(
            f"{_OWNER}: columns' keys and names must be non-empty strings, got {value!r}."
        )
    return pairs


def _arrow_column(dataset: Any, name: str, shown: str) -> tuple[Any, Any]:
    """A column's Arrow data (the dataset's rows, its index mapping applied) and feature."""
    if name not in dataset.column_names:
        known = ", ".join(repr(column) for column in dataset.column_names)
        raise ValueError(f"{_OWNER}: {shown} has no column {name!r} (its columns: {known}).")
    table = dataset.select_columns([name]).with_format("arrow")[:]
    return table.column(0), dataset.features[name]


def _column_rows(dataset: Any, fingerprint: str, columns: dict[str, str], shown: str) -> ColumnRows:
    dtypes = {}
    for key, name in columns.items():
        array, feature = _arrow_column(dataset, name, shown)
        dtypes[key] = column_dtype(_OWNER, name, array, feature)[0]
    return ColumnRows(dataset, columns, dtypes, fingerprint)


def _class_names(dataset: Any, columns: dict[str, str]) -> tuple[str, ...] | None:
    """The names of a `ClassLabel` column read as `"labels"`, if there is one."""
    feature = dataset.features.get(columns.get("labels", ""))
    names = getattr(feature, "names", None) if type(feature).__name__ == "ClassLabel" else None
    return tuple(names) if names else None


def _text_documents(dataset: Any, fingerprint: str, name: str, shown: str) -> Documents:
    """The strings of column `name` as a token cache's documents, keyed by the dataset's
    fingerprint and the column."""
    array, feature = _arrow_column(dataset, name, shown)
    text_column(_OWNER, name, array, feature)
    pc = optional("pyarrow.compute", "hf", "dew.data.huggingface")
    size = int(pc.sum(pc.binary_length(array)).as_py() or 0)
    column = dataset.select_columns([name]).with_format("arrow")

    def read(raw: bool, bar: Any) -> Iterator[str]:
        for start in range(0, len(column), _ROWS_A_READ):
            strings = column[start : start + _ROWS_A_READ].column(0).to_pylist()
            for document in strings:
                if document:
                    yield document
            bar.update(sum(len(document.encode()) for document in strings))

    return Documents(
        key=fingerprint_of("huggingface text", fingerprint, name),
        size=size,
        label=f"{len(dataset)} rows",
        read=read,
        raw_ok=False,
        record={"dataset": shown, "fingerprint": fingerprint, "column": name},
        empty=f"the column {name!r} of {shown} ({len(dataset)} rows) holds no text",
    )


def huggingface(
    source: Any,
    *,
    columns: Sequence[str] | Mapping[str, str] | None = None,
    text_column: str | None = None,
    batch: int,
    val_fraction: float = 0.0,
    seed: int = 0,
    split: str | None = None,
    val_split: str | None = None,
    tokenizer: Tokenizer | str | os.PathLike[str] = "bytes",
    seq_len: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> Dataset:
    """A Hugging Face dataset read by index: chosen `columns` as batch arrays, or one
    `text_column` tokenized once into windows of `seq_len + 1` tokens for a language model
    (`{"text": int32 (rows, seq_len + 1)}`, as `dew.data.text` gives). Training batches are a
    function of the step (`dew.data.StepBatches`). Nothing downloads (the `hf` extra: `pip
    install 'dew-ml[hf]'`).

    **Arguments:**

    - `source`: a `datasets.Dataset` or `DatasetDict`; a folder saved with `save_to_disk`;
      or local files (a path, a glob, or a list of them) ending in `.json`/`.jsonl`,
      `.parquet` or `.csv`, read by `datasets.load_dataset` with that builder.
    - `columns`: the columns that become batch keys: a list (each key its column's name) or
      a mapping `{batch key: column}`, e.g. `{"inputs": "pixels", "labels": "label"}`. Each
      holds numbers or booleans (lists of one length at every level become array axes);
      64-bit values are read as 32-bit (integers checked to fit). A `ClassLabel` column read
      as `"labels"` names `Dataset.classes`.
    - `text_column`: instead of `columns`, a column of strings, each row one document,
      tokenized once into a token cache (as `dew.data.text` does files) with `tokenizer`
      and windowed by `seq_len`; the validation split is by row (document).
    - `batch`: the rows (or windows) of one process's batch.
    - `val_fraction`: the share of rows held out for validation, drawn from the dataset's
      fingerprint (the token cache's content for `text_column`) and `seed`.
    - `seed`: the hold-out's and the training order's seed.
    - `split`: the `DatasetDict` split to train on (default `"train"`); `val_split`: a split
      to validate on instead of `val_fraction` (e.g. `"test"`).
    - `tokenizer`, `seq_len`: `text_column` only, as `dew.data.text` takes them.
    - `cache_dir`: the token cache's folder (`text_column`), and the folder under which
      `datasets` keeps the Arrow files it converts data files into (`<cache_dir>/hf`; by
      default its own cache, `$HF_DATASETS_CACHE`).
    - `progress`: the token cache's progress bar (`text_column`).

    The order and split follow the dataset's fingerprint: a `datasets.Dataset`'s own
    `_fingerprint` (`datasets` derives it from the data and each transform; a transform it
    cannot hash gets a random one, and then each run draws another order), or the files'
    paths, sizes and modification times.

    **Raises:** in one line each, naming the value: `FileNotFoundError` for a path with
    nothing there (a Hub name included); `ValueError` for a folder that is not a saved
    dataset, a file ending huggingface does not read, data `datasets` cannot read, a missing
    column or split, a column that is not numbers (strings, images, nulls, lists of different
    lengths), too few rows for the split or the batch; `ImportError` without `datasets`.

    ```python
    >>> import datasets
    >>> from dew.data import Partition
    >>> table = datasets.Dataset.from_dict({"x": [[i, -i] for i in range(10)],
    ...                                     "y": list(range(10))})
    >>> data = huggingface(table, columns={"inputs": "x", "labels": "y"}, batch=4,
    ...                    val_fraction=0.2)
    >>> batch = data.train.batch_at(0, Partition())
    >>> batch["inputs"].shape, batch["labels"].dtype.name, data.records
    ((4, 2), 'int32', 8)

    ```
    """
    batch = check_integer(f"{_OWNER}: batch", batch, minimum=1)
    seed = check_integer(f"{_OWNER}: seed", seed, minimum=0)
    val_fraction = check_fraction(_OWNER, val_fraction)
    if (columns is None) == (text_column is None):
        raise ValueError(
            f"{_OWNER}: pass columns= (columns as batch arrays) or text_column= (a column of "
            "text for a language model), one of them."
        )
    if val_split is not None and val_fraction:
        raise ValueError(
            f"{_OWNER}: give val_fraction or val_split, not both (got val_fraction="
            f"{val_fraction} and val_split={val_split!r})."
        )
    for name, value in (("split", split), ("val_split", val_split)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{_OWNER}: {name} must be a split's name, got {value!r}.")
    windows = None  # a text column's window length and tokenizer
    if text_column is not None:
        if not isinstance(text_column, str) or not text_column:
            raise TypeError(f"{_OWNER}: text_column must be a column name, got {text_column!r}.")
        if seq_len is None:
            raise ValueError(f"{_OWNER}: text_column={text_column!r} needs seq_len=.")
        windows = (
            check_integer(f"{_OWNER}: seq_len", seq_len, minimum=1),
            load_tokenizer(tokenizer),
        )
    elif seq_len is not None or tokenizer != "bytes":
        raise ValueError(f"{_OWNER}: seq_len and tokenizer go with text_column=, not columns=.")
    source_ = _load(source, cache_dir)
    train, fingerprint = _split(source_, split, "training")
    val = _split(source_, val_split, "validation") if val_split is not None else None
    if text_column is not None and windows is not None:
        length, chosen = windows

        def cache(dataset: Any, known_by: str) -> TokenCache:
            documents = _text_documents(dataset, known_by, text_column, source_.shown)
            return documents_cache(
                _OWNER, documents, chosen, cache_dir=cache_dir, progress=progress
            )

        return windows_dataset(
            _OWNER,
            cache(train, fingerprint),
            chosen,
            seq_len=length,
            batch=batch,
            seed=seed,
            val_fraction=val_fraction,
            val_cache=None if val is None else cache(*val),
            more="rows",
        )
    pairs = _columns(columns)
    rows = _column_rows(train, fingerprint, pairs, source_.shown)
    if val is None:
        held = math.ceil(val_fraction * len(rows)) if val_fraction > 0 else 0  # as hold_out
        _check_batch(batch, len(rows) - held, source_.shown, held > 0)
        data = indexed_dataset(rows, batch=batch, seed=seed, val_fraction=val_fraction)
    else:
        _check_batch(batch, len(rows), source_.shown, False)
        validation = _column_rows(val[0], val[1], pairs, source_.shown)
        data = Dataset(
            train=StepBatches(rows, batch, seed),
            val=InOrder(validation, batch) if len(validation) else None,
            records=len(rows),
            batch=batch,
        )
    return dataclasses.replace(data, classes=_class_names(train, pairs))


def _check_batch(batch: int, training: int, shown: str, held: bool) -> None:
    if training < batch:
        raise ValueError(
            f"{_OWNER}: batch={batch} is more than the {training} training row(s) of {shown}; "
            f"lower batch{' or val_fraction' if held else ''}, or add rows."
        )


def huggingface_entry(
    *,
    path: str | Sequence[str],
    columns: Sequence[str] | Mapping[str, str] | None = None,
    text_column: str | None = None,
    val_fraction: float = 0.0,
    split: str | None = None,
    val_split: str | None = None,
    tokenizer: str = "bytes",
    seq_len: int | None = None,
    cache_dir: str | None = None,
    batch_size: int,
    seed: int,
) -> Dataset:
    """`huggingface` as the dataset registry names it (`[data] name = "huggingface"`): a
    saved dataset's folder or local data files by `path`; `batch_size` and `seed` come from
    the trainer, the rest from the configuration, e.g.

    ```toml
    [data]
    name = "huggingface"

    [data.kwargs]
    path = "digits.parquet"        # or a save_to_disk folder, or ["a.jsonl", "b.jsonl"]
    columns = {inputs = "pixels", labels = "label"}   # or ["pixels", "label"]
    val_fraction = 0.1
    ```

    or, for a language model, `text_column = "text"` and `seq_len = 128` (and `tokenizer`).
    """
    return huggingface(
        path,
        columns=columns,
        text_column=text_column,
        batch=batch_size,
        val_fraction=val_fraction,
        seed=seed,
        split=split,
        val_split=val_split,
        tokenizer=tokenizer,
        seq_len=seq_len,
        cache_dir=cache_dir,
    )
