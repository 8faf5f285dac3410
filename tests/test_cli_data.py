"""`dew data inspect` and `dew data tokenizer`, and the bad input of a run configuration's text
source through the command (one line naming the value, exit status 2)."""

import json
import textwrap

import numpy as np
import pytest
from _ledgers import ledger_json

from dew.cli import main
from dew.cli._contact_sheet import CAPTION, COLUMNS, GAP, tile_scale
from dew.config import builtin, override
from dew.data import Partition
from dew.tracking._render import to_uint8

EOS = 256  # the bytes tokenizer's end of document


def _corpus(folder, count=6):
    """Text files of different lengths, each with its own words; returns them in sorted
    (read) order."""
    folder.mkdir(exist_ok=True)
    files = []
    for number in range(count):
        path = folder / f"{number:02d}.txt"
        path.write_text(f"File {number} says: " + f"word{number} and more, " * (20 + 7 * number))
        files.append(path)
    return files


def _text_toml(tmp_path, *, kwargs="", model_vocab=257, seq_len=16, name="text-run", extra=""):
    path = tmp_path / "run.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [model]
            name = "causal_transformer"

            [model.kwargs]
            vocab_size = {model_vocab}
            emb_features = 16
            num_layers = 1
            num_heads = 2
            mlp_features = 32
            max_seq_len = {seq_len}

            [data]
            name = "text"

            [data.kwargs]
            seq_len = {seq_len}
            """
        )
        + textwrap.dedent(kwargs)
        + textwrap.dedent(
            f"""
            [optim]
            optimizer = "adam"
            learning_rate = 0.01

            [trainer]
            name = "{name}"
            checkpoint_dir = "{tmp_path / "runs"}"
            steps = 4
            batch_size = 4
            log_every = 2
            """
        )
        + textwrap.dedent(extra)
    )
    return path


def _windows(files, seq_len):
    """The windows of `seq_len + 1` byte IDs over the files' documents in order, each
    followed by the end-of-document ID: computed from the files' bytes alone."""
    stream = np.concatenate(
        [
            np.append(np.frombuffer(path.read_bytes(), np.uint8).astype(np.int64), EOS)
            for path in files
        ]
    )
    count = (stream.size - 1) // seq_len
    return stream, np.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(count)])


def _as_text(ids):
    pieces = np.split(ids, np.flatnonzero(ids == EOS))
    return "<eos>".join(bytes(piece[piece != EOS].astype(np.uint8)).decode() for piece in pieces)


def test_inspect_a_text_configuration_counts_what_the_files_hold_and_decodes_the_batch(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    files = _corpus(tmp_path / "corpus")
    config = _text_toml(tmp_path, kwargs='paths = ["corpus/*.txt"]\n')
    assert main(["data", "inspect", str(config), "--json", "--rows", "4", "--step", "2"]) == 0
    found = json.loads(capsys.readouterr().out)
    _, windows = _windows(files, 16)
    train = found["splits"]["train"]
    assert (train["rows"], train["documents"], train["tokens"]) == (
        len(windows),
        len(files),
        len(windows) * 16 + 1,
    )
    assert set(found["splits"]) == {"train"}  # no val_fraction: no validation split
    assert found["tokenizer"] == {"name": "bytes", "vocab_size": 257, "eos_id": EOS}
    batch = found["batch"]
    assert (batch["split"], batch["step"], batch["rows"]) == ("train", 2, 4)
    # Step 2's rows are the windows the text source's step order gives, decoded as the files'
    # own bytes at those places.
    rows = batch["row_indices"]
    chosen = windows[rows]
    assert batch["fields"] == {
        "text": {"dtype": "int32", "shape": [4, 17], "min": chosen.min(), "max": chosen.max()}
    }
    assert batch["text"] == [_as_text(windows[row]) for row in rows]
    assert "<eos>" in "".join(_as_text(window) for window in windows)  # boundaries are shown
    from dew.data import text

    data = text(
        "corpus/*.txt", seq_len=16, batch=4, cache_dir=tmp_path / "runs" / "text-run" / "data-cache"
    )
    np.testing.assert_array_equal(data.train.batch_at(2, Partition())["text"], windows[rows])
    # The token cache is where `dew train` keeps it for this run, so the run reuses it.
    assert [
        path.name[:7] for path in (tmp_path / "runs" / "text-run" / "data-cache").iterdir()
    ] == ["tokens-"]


def test_inspect_prints_the_split_table_and_a_validation_batch(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus", count=8)
    config = _text_toml(tmp_path, kwargs='paths = ["corpus/*.txt"]\nval_fraction = 0.25\n')
    assert main(["data", "inspect", str(config), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (
        main(["data", "inspect", str(config), "--split", "val", "--step", "1", "--rows", "1"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    splits = found["splits"]
    assert (splits["train"]["documents"], splits["validation"]["documents"]) == (6, 2)
    assert lines[:5] == [
        "dataset      text",
        "tokenizer    bytes  vocab_size 257  end of document 256",
        "split       rows  documents  tokens  fingerprint",
        f"train       {splits['train']['rows']:<4}  6          {splits['train']['tokens']:<6,}  "
        f"{splits['train']['fingerprint']}",
        f"validation  {splits['validation']['rows']:<4}  2          "
        f"{splits['validation']['tokens']:<6,}  {splits['validation']['fingerprint']}",
    ]
    assert lines[5] == "batch        validation batch 1: 4 rows (rows 4, 5, 6, 7)"
    assert lines[7] == "--- row 0 (row 4)"


def test_inspect_a_batch_of_images_writes_a_contact_sheet_of_them_with_their_labels(
    tmp_path, monkeypatch, capsys
):
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    arguments = ["data", "inspect", "tiny_classifier", "--split", "val", "--json"]
    assert main([*arguments, "--set", "data.kwargs.rows=64", "--set", "trainer.batch_size=6"]) == 0
    found = json.loads(capsys.readouterr().out)
    sheet = found["batch"]["contact_sheet"]
    assert sheet == {"path": "shapes-val-step0.png", "field": "images", "values": "[0, 1]"}
    point = {"data.kwargs.rows": 64, "trainer.batch_size": 6}
    config = override(builtin("tiny_classifier"), point)
    data = config.data.build(batch_size=6, seed=config.trainer.seed)
    batch = next(data.val(Partition()))
    assert found["batch"]["labels"] == batch["labels"].tolist()
    # Read back by Pillow: each tile is its image enlarged by a whole factor, pixel for pixel.
    picture = np.asarray(Image.open(tmp_path / sheet["path"]).convert("RGB"))
    rows, height, width, _ = batch["images"].shape
    factor = tile_scale(height, width)
    columns = min(COLUMNS, rows)
    for row in range(rows):
        line, column = divmod(row, columns)
        top = GAP + line * (height * factor + CAPTION + GAP)
        left = GAP + column * (width * factor + GAP)
        tile = picture[top : top + height * factor, left : left + width * factor]
        expected = to_uint8(batch["images"][row]).repeat(factor, 0).repeat(factor, 1)
        np.testing.assert_array_equal(tile, expected)
        caption = picture[
            top + height * factor : top + height * factor + CAPTION, left : left + width * factor
        ]
        assert (caption.max(axis=-1) > 128).any()  # a label is written under each tile


def test_out_is_for_images_and_a_png(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "inspect", "tiny_lm", "--out", "sheet.png"]) == 2
    assert capsys.readouterr().err == (
        "dew data inspect: --out writes a contact sheet of images, but the dataset "
        "'token_windows' has no image field (its batch holds text).\n"
    )
    assert main(["data", "inspect", "tiny_classifier", "--out", "sheet.jpg"]) == 2
    assert capsys.readouterr().err == (
        "dew data inspect: --out names the contact sheet, a .png file; got 'sheet.jpg'.\n"
    )


def test_a_validation_batch_past_the_pass_names_the_batches_there_are(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus", count=8)
    config = _text_toml(tmp_path, kwargs='paths = ["corpus/*.txt"]\nval_fraction = 0.25\n')
    assert main(["data", "inspect", str(config), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["splits"]["validation"]["rows"]
    batches = -(-rows // 4)
    assert main(["data", "inspect", str(config), "--split", "val", "--step", str(batches)]) == 2
    assert capsys.readouterr().err == (
        f"dew data inspect: --step {batches} is past the validation split's {batches} batch(es) "
        f"of 4 rows ({rows} rows): pick a step from 0 to {batches - 1}.\n"
    )


@pytest.mark.parametrize(
    ("kwargs", "files", "message"),
    [
        ('paths = ["missing.txt"]\n', {}, "text: no file at 'missing.txt'."),
        (
            'paths = ["corpus/*.md"]\n',
            {"corpus/a.txt": "x"},
            "text: the glob 'corpus/*.md' matches no file.",
        ),
        (
            'paths = ["corpus/*.txt"]\n',
            {"corpus/a.txt": "", "corpus/b.txt": ""},
            "text: the corpus is empty: 2 file(s) ('corpus/a.txt', 'corpus/b.txt') hold no text.",
        ),
        (
            'paths = ["notes.jsonl"]\nfield = "body"\n',
            {"notes.jsonl": '{"body": "one"}\n{"text": "two"}\n'},
            "text: 'notes.jsonl' line 2 has no field 'body' (its fields: 'text').",
        ),
    ],
    ids=["missing file", "glob matching nothing", "empty corpus", "JSONL line without field"],
)
def test_a_text_source_s_bad_input_is_one_line_naming_the_value(
    tmp_path, monkeypatch, capsys, kwargs, files, message
):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(content)
    config = _text_toml(tmp_path, kwargs=kwargs)
    assert main(["data", "inspect", str(config)]) == 2
    error = capsys.readouterr().err
    assert error == f"dew data inspect: {message}\n"
    # dew train says the same, its paths absolute as the run records them.
    assert main(["train", str(config), "--quiet"]) == 2
    absolute = error.replace("dew data inspect:", "dew train:")
    for name in ("missing.txt", "corpus/*.md", "corpus/a.txt", "corpus/b.txt", "notes.jsonl"):
        absolute = absolute.replace(f"'{name}'", repr(str(tmp_path / name)))
    assert capsys.readouterr().err == absolute
    assert not (tmp_path / "runs" / "text-run" / "run.json").exists()


def test_dew_train_refuses_a_model_vocabulary_smaller_than_the_tokenizer_s(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus")
    config = _text_toml(tmp_path, kwargs='paths = ["corpus/*.txt"]\n', model_vocab=200)
    assert main(["train", str(config), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "dew train: the model 'causal_transformer' has vocab_size=200, but the tokenizer 'bytes' "
        "has vocab_size=257 (IDs 0 to 256): set the model's vocab_size to 257 or more.\n"
    )
    assert not (tmp_path / "runs" / "text-run" / "run.json").exists()


def test_dew_data_tokenizer_trains_a_tokenizer_json_the_tokenizers_library_reads(
    tmp_path, monkeypatch, capsys
):
    import tokenizers

    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus")
    arguments = ["data", "tokenizer", "corpus/*.txt", "--vocab-size", "300", "--out", "tok.json"]
    assert main(arguments) == 0
    printed = capsys.readouterr().out.splitlines()
    trained = tokenizers.Tokenizer.from_file("tok.json")
    size = trained.get_vocab_size()
    assert (
        printed[0] == f"wrote tok.json: vocab_size {size:,}, end of document '<|endoftext|>' (ID 0)"
    )
    assert printed[-1] == (
        f'  train on it: [data.kwargs] tokenizer = "tok.json" and [model.kwargs] vocab_size = '
        f"{size} or more"
    )
    assert trained.id_to_token(0) == "<|endoftext|>"
    text = "File 3 says: word3 and more, "
    assert trained.decode(trained.encode(text).ids) == text

    before = (tmp_path / "tok.json").read_bytes()
    assert main(arguments) == 2  # an existing file is kept
    assert (
        capsys.readouterr().err
        == "dew data tokenizer: 'tok.json' exists; pass --force to replace it.\n"
    )
    assert (tmp_path / "tok.json").read_bytes() == before
    assert main([*arguments, "--force", "--min-frequency", "50"]) == 0
    assert "no more pairs that occur 50 times or more" in capsys.readouterr().out
    assert tokenizers.Tokenizer.from_file("tok.json").get_vocab_size() < size


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["nothing.txt"], "train_tokenizer: no file at 'nothing.txt'."),
        (["corpus/*.md"], "train_tokenizer: the glob 'corpus/*.md' matches no file."),
        (["empty.txt"], "train_tokenizer: the corpus is empty: 1 file(s) hold no text."),
        (
            ["notes.jsonl", "--field", "body"],
            "train_tokenizer: 'notes.jsonl' line 1 has no field 'body' (its fields: 'text').",
        ),
        (
            ["corpus/*.txt", "--vocab-size", "100"],
            "train_tokenizer: vocab_size must be at least 257 (the 256 byte symbols and "
            "'<|endoftext|>'), got 100.",
        ),
    ],
    ids=[
        "missing file",
        "glob matching nothing",
        "empty corpus",
        "JSONL line without field",
        "vocabulary",
    ],
)
def test_dew_data_tokenizer_s_bad_input_is_one_line(
    tmp_path, monkeypatch, capsys, arguments, message
):
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus", count=2)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "notes.jsonl").write_text('{"text": "one"}\n')
    size = [] if "--vocab-size" in arguments else ["--vocab-size", "300"]
    assert main(["data", "tokenizer", *arguments, *size]) == 2
    assert capsys.readouterr().err == f"dew data tokenizer: {message}\n"
    assert not (tmp_path / "tokenizer.json").exists()


@pytest.mark.slow  # two fits of 6 steps, a sweep of two, three evaluations: about 40 s
def test_a_text_run_configuration_trains_evaluates_inspects_and_sweeps_unchanged(
    tmp_path, monkeypatch, capsys
):
    from dew.tracking import read_journal

    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus", count=8)
    config = _text_toml(
        tmp_path,
        kwargs='paths = ["corpus/*.txt"]\nval_fraction = 0.25\n',
        extra="eval_every = 3\ncheckpoint_every = 3\n",
    )
    config.write_text(config.read_text().replace("steps = 4", "steps = 6"))
    assert main(["data", "inspect", str(config), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    cache = tmp_path / "runs" / "text-run" / "data-cache"
    built = sorted(cache.iterdir())

    assert main(["train", str(config), "--quiet"]) == 0
    folder = tmp_path / "runs" / "text-run"
    assert sorted(cache.iterdir()) == built  # the run read the cache inspect built
    logged = read_journal(folder).scalars["lm/validation/perplexity"][-1]
    capsys.readouterr()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the run recorded its corpus absolute: any directory reads it
    assert main(["eval", str(folder)]) == 0
    assert capsys.readouterr().out.startswith(f"step 6  perplexity {logged[1]:.4f}  ")
    assert main(["eval", str(folder), "--split", "train", "--batches", "2"]) == 0
    assert capsys.readouterr().out.startswith("step 6  (training split)  perplexity ")
    assert main(["data", "inspect", str(folder), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["splits"] == before["splits"] and again["batch"] == before["batch"]
    assert sorted(cache.iterdir()) == built

    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.01, 0.003]\n')
    sweep = ["sweep", str(config), str(space), "--trials", "2", "--search", "grid"]
    assert main([*sweep, "--name", "lr", "--quiet"]) == 0
    ledger = ledger_json(tmp_path / "runs" / "lr" / "ledger.json")
    assert sorted(trial["index"] for trial in ledger["trials"]) == [0, 1]
    for index, rate in enumerate((0.01, 0.003)):
        trial = json.loads((tmp_path / "runs" / "lr" / f"trial-{index}" / "run.json").read_text())
        assert trial["data"]["name"] == "text" and trial["optim"]["learning_rate"] == rate
        assert trial["data"]["kwargs"]["paths"] == [str(tmp_path / "corpus" / "*.txt")]


def test_cache_dir_keeps_the_token_cache_there_and_a_run_resumes_from_another(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus")
    config = _text_toml(tmp_path, kwargs='paths = ["corpus/*.txt"]\n')
    assert main(["train", str(config), "--quiet", "--cache-dir", "first"]) == 0
    assert [path.name[:7] for path in (tmp_path / "first").iterdir()] == ["tokens-"]
    run = tmp_path / "runs" / "text-run"
    recorded = json.loads((run / "run.json").read_text())["data"]["kwargs"]
    assert recorded["cache_dir"] == str(tmp_path / "first")
    assert not (run / "data-cache").exists()
    # Another cache folder is the same run: it extends from step 4 and builds the cache there.
    assert main(["train", str(config), "--quiet", "--cache-dir", "second", "--steps", "6"]) == 0
    assert (tmp_path / "second").is_dir()
    assert sorted(path.name for path in (run / "checkpoints").iterdir())[-1] == "6"
    capsys.readouterr()


def test_cache_dir_for_a_source_that_keeps_no_cache_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "tiny_classifier", "--cache-dir", "x", "--steps", "1"]) == 2
    assert capsys.readouterr().err == (
        "dew train: --cache-dir 'x': the dataset 'shapes' keeps no cache (its builder takes no "
        "cache_dir); the text, image_folder and huggingface sources do.\n"
    )
    assert not (tmp_path / "runs").exists()
