"""dew.data.text: windows over the documents of text files (checked against the files' own
bytes), the split by document, bad input in one line, the registry and the recipe, and a
byte-level LM trained on the Python standard library's sources."""

import dataclasses
import itertools
import json
import math
import os
import pathlib
import sysconfig
import tempfile
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.config import DataConfig, RunConfig
from dew.data import Partition, text
from dew.data.tokenizers import BytesTokenizer, train_tokenizer
from dew.registry import datasets

STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
EOS = BytesTokenizer.eos_id


def _all_windows(split) -> np.ndarray:
    rows = split.rows
    return np.asarray(rows.read(np.arange(len(rows)))["text"])


def _stream_windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    count = (stream.size - 1) // seq_len
    return np.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(count)])


def _write(folder: pathlib.Path, name: str, content: str | bytes) -> pathlib.Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return path


def test_the_windows_are_the_files_bytes_each_followed_by_the_end_of_document(tmp_path):
    names = ("textwrap.py", "string.py", "shlex.py")
    files = [_write(tmp_path, name, (STDLIB / name).read_bytes()) for name in names]
    data = text(files, seq_len=64, batch=8, cache_dir=tmp_path / "cache", progress=False)
    stream = np.concatenate(
        [np.append(np.frombuffer(f.read_bytes(), np.uint8), EOS) for f in files]
    )
    windows = _all_windows(data.train)
    assert windows.dtype == np.int32
    np.testing.assert_array_equal(windows, _stream_windows(stream.astype(np.int32), 64))
    assert data.records == len(windows) == (stream.size - 1) // 64
    assert data.val is None and data.batch == 8
    batch = next(data.train(Partition()))["text"]
    assert batch.shape == (8, 65) and batch.dtype == np.int32


def test_a_glob_expands_in_sorted_order_and_a_file_named_twice_is_read_once(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        _write(tmp_path, name, f"<{name}>" * 5)
    data = text(
        [tmp_path / "**" / "*.txt", tmp_path / "a.txt"], seq_len=4, batch=1, cache_dir=tmp_path
    )
    stream = _all_windows(data.train)[:, :-1].reshape(-1)
    decoded = BytesTokenizer().decode(stream[stream != EOS])
    assert decoded.startswith("<a.txt><a.txt>")
    assert decoded.index("<b.txt>") < decoded.index("<sub/c.txt>")
    assert decoded.count("<a.txt>") == 5


def _documents_jsonl(folder: pathlib.Path, lengths: list[int]) -> pathlib.Path:
    """Document `i` is `lengths[i]` copies of the character `chr(33 + i)` (one byte each)."""
    rows = [json.dumps({"text": chr(33 + i) * length, "id": i}) for i, length in enumerate(lengths)]
    return _write(folder, "docs.jsonl", "\n".join(rows) + "\n")


@settings(max_examples=30)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=2, max_size=60),
    seq_len=st.integers(1, 12),
    val_fraction=st.sampled_from([0.1, 0.25, 0.5]),
    seed=st.integers(0, 3),
)
def test_a_held_out_document_never_reaches_a_training_window(
    tmp_path_factory, lengths, seq_len, val_fraction, seed
):
    folder = tmp_path_factory.mktemp("split")
    path = _documents_jsonl(folder, lengths)
    try:
        data = text(
            path,
            seq_len=seq_len,
            batch=1,
            val_fraction=val_fraction,
            seed=seed,
            field="text",
            cache_dir=folder,
        )
    except ValueError as error:  # a split too small for one window is refused, saying so
        refused = str(error)
    else:
        refused = None
    if refused is not None:
        assert "fewer than one window" in refused or "no training document" in refused
        return
    train_documents, val_documents = data.train.rows.documents, data.val.rows.documents
    assert not set(train_documents) & set(val_documents)
    assert sorted([*train_documents, *val_documents]) == list(range(len(lengths)))
    assert val_documents.size == math.ceil(val_fraction * len(lengths))
    # each split's stream is its documents in file order, cut into windows striding seq_len
    train, val = _all_windows(data.train), _all_windows(data.val)
    for windows, documents in ((train, train_documents), (val, val_documents)):
        stream = np.concatenate([[33 + i] * lengths[i] + [EOS] for i in documents])
        np.testing.assert_array_equal(windows, _stream_windows(stream.astype(np.int32), seq_len))
    assert not set(np.unique(train[train != EOS]) - 33) & set(val_documents)


def test_the_split_is_fixed_by_the_content_and_seed_not_by_modification_times(tmp_path):
    path = _documents_jsonl(tmp_path, [30] * 20)

    def build(seed):
        return text(path, seq_len=8, batch=4, val_fraction=0.2, seed=seed, field="text",
                    cache_dir=tmp_path)  # fmt: skip

    first = build(0)
    batches = [first.train.batch_at(step, Partition()) for step in range(5)]
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: the cache rebuilds
    again = build(0)
    assert len(list(tmp_path.glob("tokens-*"))) == 2
    np.testing.assert_array_equal(_all_windows(again.val), _all_windows(first.val))
    for step, batch in enumerate(batches):
        np.testing.assert_array_equal(
            again.train.batch_at(step, Partition())["text"], batch["text"]
        )
    other = _all_windows(build(1).val)
    assert other.shape != _all_windows(first.val).shape or (other != _all_windows(first.val)).any()


def test_a_tokenizer_json_tokenizes_the_documents_as_the_library_does(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    files = [STDLIB / name for name in ("textwrap.py", "shlex.py")]
    trained = train_tokenizer(files, 500, tmp_path / "tok.json", progress=False)
    data = text(files, tokenizer=tmp_path / "tok.json", seq_len=32, batch=2, cache_dir=tmp_path)
    reference = tokenizers.Tokenizer.from_file(str(tmp_path / "tok.json"))
    stream = np.concatenate(
        [[*reference.encode(f.read_text(), add_special_tokens=False).ids, trained.eos_id]
         for f in files]
    )  # fmt: skip
    np.testing.assert_array_equal(_all_windows(data.train), _stream_windows(stream, 32))
    assert data.tokenizer.vocab_size == 500


# -- bad input, one line each --------------------------------------------------------------


def _one_line(kind, call, *fragments):
    with pytest.raises(kind) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_files_globs_and_folders_are_named(tmp_path):
    def build(paths, **kwargs):
        return lambda: text(paths, seq_len=4, batch=1, cache_dir=tmp_path, **kwargs)

    _one_line(FileNotFoundError, build(tmp_path / "nope.txt"), "no file at", "nope.txt")
    _one_line(FileNotFoundError, build(str(tmp_path / "*.md")), "the glob", "matches no file")
    _one_line(FileNotFoundError, build(tmp_path), "is a folder", "**")
    _one_line(TypeError, build([]), "paths must be a file path or glob")


def test_an_empty_corpus_is_refused_and_leaves_no_cache(tmp_path):
    files = [_write(tmp_path, name, "") for name in ("a.txt", "b.txt")]
    _one_line(ValueError, lambda: text(files, seq_len=4, batch=1, cache_dir=tmp_path / "c"),
              "the corpus is empty: 2 file(s)", "a.txt")  # fmt: skip
    assert list((tmp_path / "c").iterdir()) == []


def test_json_lines_errors_name_the_file_and_line(tmp_path):
    def build(content, field="text"):
        path = _write(tmp_path, "data.jsonl", content)
        return lambda: text(path, seq_len=2, batch=1, field=field, cache_dir=tmp_path)

    good = json.dumps({"text": "hello"})
    _one_line(ValueError, build(f"{good}\n\n{json.dumps({'body': 'x'})}\n"),
              "data.jsonl' line 3 has no field 'text' (its fields: 'body')")  # fmt: skip
    _one_line(ValueError, build(f"{good}\n{{oops\n"), "line 2 is not JSON")
    _one_line(ValueError, build(f"{good}\n[1, 2]\n"), "line 2 is a list, not an object")
    _one_line(ValueError, build(json.dumps({"text": 3}) + "\n"),
              "line 1: the field 'text' is a number, not a string")  # fmt: skip
    _one_line(ValueError, build(f"{good}\n", field=None), "is JSON Lines: pass field=")


def test_a_file_that_is_not_utf8_reads_as_bytes_and_fails_other_tokenizers_at_its_line(tmp_path):
    latin = _write(tmp_path, "latin.txt", "first line\ncaf\xe9 au lait\n".encode("latin-1"))
    data = text(latin, seq_len=4, batch=1, cache_dir=tmp_path)
    assert 0xE9 in _all_windows(data.train)
    pytest.importorskip("tokenizers")
    train_tokenizer(STDLIB / "textwrap.py", 300, tmp_path / "tok.json", progress=False)
    _one_line(
        ValueError,
        lambda: text(latin, tokenizer=tmp_path / "tok.json", seq_len=4, batch=1,
                     cache_dir=tmp_path),
        "latin.txt' line 2 is not UTF-8", "the bytes tokenizer reads any bytes",
    )  # fmt: skip


def test_too_little_text_for_the_split_or_the_window_is_refused(tmp_path):
    one = _write(tmp_path, "one.txt", "a single document")
    _one_line(ValueError, lambda: text(one, seq_len=4, batch=1, val_fraction=0.5,
                                       cache_dir=tmp_path),
              "1 document(s) leave no training document", "split is by document")  # fmt: skip
    _one_line(ValueError, lambda: text(one, seq_len=64, batch=1, cache_dir=tmp_path),
              "hold 18 token(s), fewer than one window of seq_len + 1 = 65")  # fmt: skip
    _one_line(ValueError, lambda: text(one, seq_len=4, batch=8, cache_dir=tmp_path),
              "batch=8 is more than the 4 training window(s)")  # fmt: skip
    _one_line(ValueError, lambda: text(one, seq_len=4, batch=1, val_fraction=1.0),
              "val_fraction must be a number in [0, 1), got 1.0")  # fmt: skip


# -- the registry, a run configuration and the recipe --------------------------------------


def test_a_run_configuration_names_text_by_its_paths(tmp_path):
    corpus = _write(tmp_path, "corpus/a.txt", (STDLIB / "textwrap.py").read_text())
    config = datasets["text"](paths=[str(tmp_path / "corpus" / "*.txt")], seq_len=16)
    assert config == DataConfig("text", {"paths": [str(tmp_path / "corpus" / "*.txt")],
                                         "seq_len": 16})  # fmt: skip
    data = config.build(batch_size=4, seed=0, cache_dir=tmp_path / "run-cache")
    assert next(data.train(Partition()))["text"].shape == (4, 17)
    assert len(list((tmp_path / "run-cache").glob("tokens-*"))) == 1
    named = DataConfig("text", {"paths": str(corpus), "seq_len": 16, "cache_dir": str(tmp_path)})
    named.build(batch_size=4, seed=0, cache_dir=tmp_path / "ignored")
    assert not (tmp_path / "ignored").exists()
    with pytest.raises(TypeError, match="does not take 'path'"):
        datasets["text"](path="a.txt", seq_len=4)


def _lm_config(tmp_path, vocab_size: int, paths: list[str]) -> RunConfig:
    toml = f"""
[model]
name = "causal_transformer"
[model.kwargs]
vocab_size = {vocab_size}
emb_features = 32
num_layers = 1
num_heads = 2
mlp_features = 64
max_seq_len = 16

[data]
name = "text"
[data.kwargs]
paths = {json.dumps(paths)}
tokenizer = "bytes"
seq_len = 16
val_fraction = 0.1

[optim]
optimizer = "adamw"
learning_rate = 0.003

[trainer]
name = "bytes-lm"
checkpoint_dir = {json.dumps(str(tmp_path / "runs"))}
steps = 2
batch_size = 4
log_every = 1
"""
    return RunConfig.from_toml(toml)


@pytest.mark.slow  # the model's eager initialisation compiles about 20 ops: 8 s here
def test_the_recipe_refuses_a_model_smaller_than_the_tokenizer_before_training(tmp_path):
    files = [str(STDLIB / name) for name in ("textwrap.py", "shlex.py")]
    config = _lm_config(tmp_path, 16, files)
    message = _one_line(ValueError, lambda: config.train(progress=False),
                        "the model 'causal_transformer' has vocab_size=16",
                        "tokenizer 'bytes' has vocab_size=257")  # fmt: skip
    assert "257 or more" in message
    run = tmp_path / "runs" / "bytes-lm"
    assert not (run / "run.json").exists() and not (run / "checkpoints").exists()
    assert len(list((run / "data-cache").glob("tokens-*"))) == 1  # kept for the fixed rerun


# -- proof on real data: the Python standard library's own sources --------------------------


def stdlib_corpus(megabytes: float) -> list[pathlib.Path]:
    """The standard library's top-level `*.py` files in sorted order, as many as fit in
    `megabytes` (1 MB = 10**6 bytes)."""
    chosen, total = [], 0
    for path in sorted(STDLIB.glob("*.py")):
        size = path.stat().st_size
        if total + size > megabytes * 10**6:
            break
        chosen.append(path)
        total += size
    return chosen


@pytest.mark.slow
def test_a_byte_level_lm_learns_the_standard_librarys_sources():
    """tiny_lm's transformer (the quickstart's sizes and optimizer, vocab 257) trained for 200
    steps on the first 1 MB of the standard library's top-level sources (`stdlib_corpus`), 5%
    of the files held out: the validation bits per byte (log2 of the perplexity over every
    target, each file's one end-of-document token included: 2 in 40,000) falls from the
    uniform rate (8.0, the untrained model's) to well below it."""
    import jax

    from dew import Trainer, metrics
    from dew.config import builtin
    from dew.config._recipe import build_objective
    from dew.evaluation import evaluate

    base = builtin("tiny_lm")
    config = dataclasses.replace(
        base, model=dataclasses.replace(base.model, kwargs={**base.model.kwargs, "vocab_size": 257})
    )
    steps = 200
    with tempfile.TemporaryDirectory() as cache:
        data = text(stdlib_corpus(1.0), seq_len=32, batch=32, val_fraction=0.05, cache_dir=cache,
                    progress=False)  # fmt: skip
        objective = build_objective(config, None, jax.random.key(0))
        first_batches = list(itertools.islice(data.val(Partition()), 4))
        before = evaluate(objective, objective.init_params(), first_batches,
                          metrics=[metrics.perplexity()], key=jax.random.key(1))  # fmt: skip
        trainer = Trainer(objective, config.optim.build(steps), key=jax.random.key(2))
        state = trainer.fit(data, steps, log_every=25, eval_every=steps,
                            metrics=[metrics.perplexity()], progress=False)  # fmt: skip
    start = math.log2(before.scores["perplexity"])
    end = math.log2(state.metric_history["lm/validation/perplexity"][-1][1])
    assert 7.5 < start < 8.5, start
    assert end < 4.0, end
    losses = [value for _, value in state.metric_history["lm/train/loss"]]
    assert losses[-1] < losses[0] - 1.0, losses
