"""dew.data.huggingface: columns read by index checked against the `datasets` library's own row
access, every source form (a Dataset, a DatasetDict, a save_to_disk folder, JSON, Parquet and CSV
files) with nothing touching the network, a text column through the token cache, bad input in
one line, the registry, and a causal LM trained on a dataset built from a local JSON file."""

import json
import math
import pathlib
import socket
import sysconfig

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

datasets = pytest.importorskip("datasets")

from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig  # noqa: E402
from dew.data import Partition, huggingface, text  # noqa: E402
from dew.data.tokenizers import BytesTokenizer  # noqa: E402
from dew.registry import datasets as dataset_registry  # noqa: E402

STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
ROWS = 40


def _table() -> "datasets.Dataset":
    """Forty rows of the feature kinds a batch array can come from."""
    rng = np.random.default_rng(0)
    features = datasets.Features(
        {
            "pixels": datasets.Array2D((3, 2), "float64"),
            "vector": datasets.List(datasets.Value("int64")),
            "fixed": datasets.List(datasets.Value("float32"), length=4),
            "flag": datasets.Value("bool"),
            "label": datasets.ClassLabel(names=["cat", "dog", "emu"]),
            "text": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "pixels": rng.normal(size=(ROWS, 3, 2)).tolist(),
            "vector": rng.integers(-(2**31), 2**31, (ROWS, 5)).tolist(),
            "fixed": rng.normal(size=(ROWS, 4)).astype(np.float32).tolist(),
            "flag": (rng.random(ROWS) < 0.5).tolist(),
            "label": rng.integers(0, 3, ROWS).tolist(),
            "text": [f"row {index}: " + "words " * index for index in range(ROWS)],
        },
        features=features,
    )


COLUMNS = {
    "images": "pixels",
    "vector": "vector",
    "fixed": "fixed",
    "flag": "flag",
    "labels": "label",
}
DTYPES = {
    "images": np.float32,
    "vector": np.int32,
    "fixed": np.float32,
    "flag": np.bool_,
    "labels": np.int32,
}


@settings(max_examples=25)
@given(indices=st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=12))
def test_columns_are_the_datasets_librarys_own_rows(indices):
    table = _table()
    data = huggingface(table, columns=COLUMNS, batch=4)
    read = data.train.rows.read(np.asarray(indices, np.int64))
    assert set(read) == set(COLUMNS)
    for key, column in COLUMNS.items():
        own = np.stack([np.asarray(table[index][column]) for index in indices])  # row access
        assert read[key].dtype == DTYPES[key] and read[key].shape == own.shape
        np.testing.assert_array_equal(read[key], own.astype(DTYPES[key]))


def test_a_list_of_columns_keeps_their_names_and_a_class_label_names_the_classes():
    table = _table()
    data = huggingface(table, columns=["flag", "label"], batch=8, val_fraction=0.25, seed=2)
    assert data.records == 30 and data.classes is None  # "label", not read as "labels"
    batch = data.train.batch_at(3, Partition())
    assert set(batch) == {"flag", "label"} and batch["label"].shape == (8,)
    named = huggingface(table, columns={"labels": "label"}, batch=8)
    assert named.classes == ("cat", "dog", "emu")
    held = np.concatenate([part["label"] for part in data.val(Partition())])
    assert held.shape == (10,)


def _files(folder: pathlib.Path, table) -> dict[str, pathlib.Path]:
    plain = table.select_columns(["flag", "label", "text"]).cast_column(
        "label", datasets.Value("int64")
    )
    folder.mkdir(parents=True, exist_ok=True)
    rows = plain.to_list()
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    plain.to_parquet(folder / "rows.parquet")
    plain.to_csv(folder / "rows.csv", index=False)
    plain.save_to_disk(folder / "saved")
    datasets.DatasetDict({"train": plain, "test": plain.select(range(5))}).save_to_disk(
        folder / "splits"
    )
    return {name: folder / name for name in ("rows.jsonl", "rows.parquet", "rows.csv", "saved")}


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_every_source_form_reads_the_same_rows_without_the_network(tmp_path, no_network):
    table = _table()
    files = _files(tmp_path / "data", table)
    expected = np.asarray(table["label"], np.int32)
    for name, path in files.items():
        data = huggingface(
            path, columns={"labels": "label", "flag": "flag"}, batch=4, cache_dir=tmp_path / "cache"
        )
        rows = data.train.rows.read(np.arange(ROWS))
        np.testing.assert_array_equal(rows["labels"], expected, err_msg=name)
        np.testing.assert_array_equal(rows["flag"], np.asarray(table["flag"]), err_msg=name)
    assert (tmp_path / "cache" / "hf").is_dir()  # datasets' Arrow files went under cache_dir
    globbed = huggingface(
        str(tmp_path / "data" / "*.jsonl"), columns=["label"], batch=4, cache_dir=tmp_path / "cache"
    )
    assert globbed.records == ROWS
    splits = huggingface(tmp_path / "data" / "splits", columns=["label"], batch=4, val_split="test")
    assert splits.records == ROWS
    assert sum(len(part["label"]) for part in splits.val(Partition())) == 5
    test_only = huggingface(tmp_path / "data" / "splits", columns=["label"], batch=5, split="test")
    assert test_only.records == 5 and test_only.val is None


def test_the_order_follows_the_fingerprint(tmp_path):
    table = _table()
    first, same = (huggingface(table, columns=["label"], batch=4, seed=1) for _ in range(2))
    changed = table.map(lambda row: {"label": (row["label"] + 1) % 3})
    other = huggingface(changed, columns=["label"], batch=4, seed=1)
    order = [first.train.indices(step, Partition()) for step in range(10)]
    np.testing.assert_array_equal(order, [same.train.indices(s, Partition()) for s in range(10)])
    assert not np.array_equal(order, [other.train.indices(s, Partition()) for s in range(10)])
    path = _files(tmp_path / "data", table)["rows.jsonl"]
    from_file = huggingface(path, columns=["label"], batch=4, cache_dir=tmp_path / "c")
    path.write_text(path.read_text() + json.dumps({"flag": True, "label": 2, "text": "x"}) + "\n")
    grown = huggingface(path, columns=["label"], batch=4, cache_dir=tmp_path / "c")
    assert grown.records == ROWS + 1
    assert grown.train.rows.fingerprint != from_file.train.rows.fingerprint


def test_a_text_column_is_tokenized_once_like_the_same_json_lines_through_text(tmp_path):
    table = _table()
    path = _files(tmp_path / "data", table)["rows.jsonl"]
    data = huggingface(path, text_column="text", seq_len=16, batch=4, cache_dir=tmp_path / "c")
    windows = data.train.rows.read(np.arange(len(data.train.rows)))["text"]
    stream = np.concatenate(
        [
            np.append(np.frombuffer(row.encode(), np.uint8), BytesTokenizer.eos_id)
            for row in table["text"]
        ]  # the library's own column access, in row order
    ).astype(np.int32)
    count = (stream.size - 1) // 16
    expected = np.stack([stream[i * 16 : i * 16 + 17] for i in range(count)])
    np.testing.assert_array_equal(windows, expected)
    assert data.tokenizer.vocab_size == 257 and data.val is None
    same = text(path, field="text", seq_len=16, batch=4, cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(same.train.rows.read(np.arange(count))["text"], windows)
    caches = sorted((tmp_path / "c").glob("tokens-*"))
    again = huggingface(path, text_column="text", seq_len=16, batch=4, cache_dir=tmp_path / "c")
    assert sorted((tmp_path / "c").glob("tokens-*")) == caches and len(caches) == 2
    np.testing.assert_array_equal(again.train.batch_at(2)["text"], data.train.batch_at(2)["text"])


def test_a_held_out_row_never_reaches_a_training_window(tmp_path):
    rows = [{"text": chr(65 + index) * (20 + index)} for index in range(12)]
    table = datasets.Dataset.from_list(rows)
    data = huggingface(
        table, text_column="text", seq_len=8, batch=2, val_fraction=0.25, seed=3, cache_dir=tmp_path
    )

    def letters(rows) -> set[int]:
        found = rows.read(np.arange(len(rows)))["text"]
        return set(found[found != BytesTokenizer.eos_id].tolist())

    training, validation = letters(data.train.rows), letters(data.val.rows)
    assert len(validation) == math.ceil(0.25 * 12) and not training & validation
    assert len(training | validation) == 12
    splits = datasets.DatasetDict({"train": table, "test": table.select([0, 1])})
    held = huggingface(
        splits, text_column="text", seq_len=8, batch=2, val_split="test", cache_dir=tmp_path
    )
    assert letters(held.val.rows) == {65, 66} and len(letters(held.train.rows)) == 12


def _one_line(error, build, *fragments):
    with pytest.raises(error) as caught:
        build()
    message = str(caught.value)
    assert "\n" not in message and message.startswith("huggingface: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_bad_input_is_one_line_naming_the_value(tmp_path, no_network):
    table = _table()
    files = _files(tmp_path / "data", table)

    def build(source, **kwargs):
        kwargs.setdefault("columns", ["label"])
        return lambda: huggingface(source, batch=2, cache_dir=tmp_path / "c", **kwargs)

    _one_line(
        FileNotFoundError,
        build("imdb"),
        "no file or folder at 'imdb'",
        "nothing downloads",
        "datasets.load_dataset('imdb')",
    )
    _one_line(ValueError, build(tmp_path), "is a folder but no dataset saved with save_to_disk")
    (tmp_path / "notes.txt").write_text("x")
    _one_line(
        ValueError,
        build(tmp_path / "notes.txt"),
        "notes.txt' is not a file",
        "for text files use dew.data.text",
    )
    _one_line(ValueError, build([files["rows.csv"], files["rows.jsonl"]]), "mix formats")
    (tmp_path / "bad.jsonl").write_text('{"label": 1}\n{oops\n')
    _one_line(
        ValueError,
        build(tmp_path / "bad.jsonl"),
        "datasets cannot read",
        "bad.jsonl' as json",
        "JSON parse error",
    )
    _one_line(ValueError, build(table, columns=["lable"]), "no column 'lable'", "'label'")
    _one_line(
        ValueError,
        build(table, columns=["text"]),
        "column 'text' holds strings",
        "text_column='text'",
    )
    _one_line(ValueError, build(table, columns=None), "pass columns= (")
    _one_line(ValueError, build(table, text_column="text", columns=None), "needs seq_len=")
    _one_line(
        ValueError,
        build(table, text_column="label", seq_len=4, columns=None),
        "text_column 'label' holds int64 values",
    )
    _one_line(
        ValueError,
        build(table, val_fraction=0.1, val_split="test"),
        "val_fraction or val_split, not both",
    )
    _one_line(ValueError, build(table, split="train"), "is one dataset, not a DatasetDict")
    _one_line(
        ValueError,
        build(tmp_path / "data" / "splits", val_split="validation"),
        "split 'validation' is not in",
        "'train', 'test'",
    )
    _one_line(
        ValueError,
        build(table.select(range(1)), val_fraction=0.5),
        "batch=2 is more than the 0 training row(s)",
    )
    odd = datasets.Dataset.from_dict(
        {
            "ragged": [[1, 2], [3]],
            "gap": [1.0, None],
            "huge": [2**40, 0],
            "nested": [[[1], [2, 3]], [[4], [5]]],
        }
    )
    _one_line(
        ValueError,
        build(odd, columns=["ragged"]),
        "column 'ragged' holds lists of different lengths (rows 1 and 0 hold 1 and 2 items)",
    )
    _one_line(ValueError, build(odd, columns=["gap"]), "column 'gap' holds a null at row 1")
    _one_line(
        ValueError,
        build(odd, columns=["huge"]),
        "column 'huge' holds 1099511627776",
        "outside int32",
    )
    _one_line(ValueError, build(odd, columns=["nested"]), "lists at depth 1 hold 1 and 2")
    images = datasets.Dataset.from_dict(
        {"image": [None]}, features=datasets.Features({"image": datasets.Image()})
    )
    _one_line(
        ValueError,
        build(images, columns=["image"]),
        "datasets.Image values",
        "dew.data.image_folder",
    )
    stream = table.to_iterable_dataset()
    _one_line(TypeError, build(stream), "IterableDataset streams")


def test_a_run_configuration_names_a_dataset_by_its_path(tmp_path):
    files = _files(tmp_path / "data", _table())
    config = dataset_registry["huggingface"](
        path=str(files["rows.parquet"]), columns={"labels": "label"}, val_fraction=0.25
    )
    run = RunConfig(ModelConfig("any"), config, trainer=TrainerConfig(steps=1, batch_size=4))
    again = RunConfig.from_toml(run.to_toml())
    assert again.data == config
    built = again.data.build(batch_size=4, seed=5, cache_dir=tmp_path / "run" / "data-cache")
    direct = huggingface(
        files["rows.parquet"],
        columns={"labels": "label"},
        batch=4,
        val_fraction=0.25,
        seed=5,
        cache_dir=tmp_path / "x",
    )
    for step in (0, 9):
        np.testing.assert_array_equal(
            built.train.batch_at(step)["labels"], direct.train.batch_at(step)["labels"]
        )
    assert (tmp_path / "run" / "data-cache" / "hf").is_dir()
    assert DataConfig("huggingface", {"path": "x"}).name == "huggingface"


# The proof on data nobody here wrote: the standard library's sources as a JSON dataset.


@pytest.mark.slow  # about 25 s: 150 steps of a byte-level transformer
def test_a_causal_lm_trains_on_a_dataset_built_from_a_local_json_file(tmp_path):
    """tiny_lm's transformer (vocab 257) trained through a run configuration naming
    `huggingface` with a JSON Lines file the test writes (each row one of the standard
    library's top-level sources, the first 400 kB), its `text` column tokenized by bytes:
    the training loss falls, and the validation perplexity ends well below the untrained
    model's (the uniform rate over 257 IDs, about 257)."""
    import dataclasses

    import jax

    from dew import metrics
    from dew.config import builtin
    from dew.config._recipe import build_objective
    from dew.evaluation import evaluate

    rows, total = [], 0
    for path in sorted(STDLIB.glob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        if total + len(source) > 400_000:
            break
        rows.append({"file": path.name, "text": source})
        total += len(source)
    corpus = tmp_path / "stdlib.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    base = builtin("tiny_lm")
    config = dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, kwargs={**base.model.kwargs, "vocab_size": 257}),
        data=DataConfig(
            "huggingface",
            {"path": str(corpus), "text_column": "text", "seq_len": 32, "val_fraction": 0.1},
        ),
        trainer=dataclasses.replace(
            base.trainer,
            name="hf-lm",
            checkpoint_dir=str(tmp_path),
            steps=150,
            log_every=10,
            eval_every=150,
            checkpoint_every=150,
        ),
    )
    data = config.data.build(batch_size=32, seed=0, cache_dir=tmp_path / "hf-lm" / "data-cache")
    objective = build_objective(config, None, jax.random.key(0))
    before = evaluate(
        objective,
        objective.init_params(),
        data.val(Partition()),
        metrics=[metrics.perplexity()],
        key=jax.random.key(1),
    )
    state = config.train(metrics=[metrics.perplexity()], progress=False)
    after = state.metric_history["lm/validation/perplexity"][-1][1]
    losses = [value for _, value in state.metric_history["lm/train/loss"]]
    assert before.scores["perplexity"] > 200
    assert after < before.scores["perplexity"] / 8, (after, before.scores["perplexity"])
    assert losses[0] > 4.0 and losses[-1] < losses[0] - 2.0, losses
