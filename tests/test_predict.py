"""`dew predict`: a classifier run's top classes for new rows (`dew._predict`, `dew.cli._predict`):
probabilities against NumPy's softmax of the model's logits, the top k against NumPy's argsort,
one compilation for every batch, and one line for each bad input."""

import csv
import json
import logging

import jax
import numpy as np
import pytest
from _trained_runs import trained

import dew
from dew._predict import input_rows, predict_classes, read_rows
from dew.cli import main
from dew.data import Partition
from dew.registry import SHAPE_KINDS, datasets

SHAPE = (16, 16, 3)
FLOAT = np.dtype(np.float32)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A 2-step tiny_classifier run, loaded, and 10 validation rows with their labels."""
    folder, _ = trained("tiny_classifier", tmp_path_factory.mktemp("classifier"))
    loaded = dew.load_run(folder)
    data = datasets["shapes"](rows=40, val_fraction=0.5).build(batch_size=10, seed=0)
    batch = next(data.val(Partition()))
    return loaded, np.asarray(batch["images"]), np.asarray(batch["labels"])


def _softmax(logits):
    shifted = np.asarray(logits, np.float64) - np.max(logits, axis=-1, keepdims=True)
    return np.exp(shifted) / np.sum(np.exp(shifted), axis=-1, keepdims=True)


@pytest.mark.slow  # loads a trained run: about 10 s
@pytest.mark.parametrize(("top_k", "batch_size"), [(1, 4), (3, 10), (2, 64)])
def test_probabilities_are_numpys_softmax_and_the_classes_numpys_argsort(
    classifier, top_k, batch_size
):
    loaded, rows, labels = classifier
    found = predict_classes(loaded, rows, top_k=top_k, batch_size=batch_size)
    # The logits through the objective's own scoring path, reduced in NumPy.
    batch = {"images": rows, "labels": labels}
    scores = loaded.objective.evaluate(loaded.params, batch, jax.random.key(0))
    probabilities = _softmax(np.asarray(scores.logits))
    ranked = np.argsort(-probabilities, axis=-1, kind="stable")[:, :top_k]
    assert found.classes.shape == found.probabilities.shape == (len(rows), top_k)
    np.testing.assert_array_equal(found.classes, ranked)
    expected = np.take_along_axis(probabilities, ranked, axis=-1)
    np.testing.assert_allclose(found.probabilities, expected, rtol=1e-6, atol=1e-7)


class _Compilations(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Finished XLA compilation of "):
            self.names.append(message.split(" of ")[1].split(" in ")[0])


def _jax_loggers_enabled():
    """Logging at WARNING and every `jax` logger enabled, whatever ran earlier in this xdist
    worker (a `logging.disable`, or a `logging.config.fileConfig`, which disables the loggers
    that exist by then): the compile messages are what this test counts."""
    names = [name for name in logging.root.manager.loggerDict if name.split(".")[0] == "jax"]
    saved = [(logging.root.manager, "disable", logging.root.manager.disable)]
    logging.disable(logging.NOTSET)
    for name in ["jax", *names]:
        logger = logging.getLogger(name)
        saved += [(logger, "disabled", logger.disabled), (logger, "level", logger.level)]
        logger.disabled = False
        if logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
    return saved


@pytest.mark.slow  # loads a trained run: about 10 s
def test_every_batch_runs_one_compiled_function(classifier):
    """Seven rows in batches of 3: two full batches and one padded, one compilation."""
    loaded, rows, _ = classifier
    seen = _Compilations()
    logger = logging.getLogger("jax")
    saved = _jax_loggers_enabled()
    logger.addHandler(seen)
    try:
        with jax.log_compiles(True):
            found = predict_classes(loaded, rows[:7], top_k=2, batch_size=3)
            again = predict_classes(loaded, rows[:7], top_k=3, batch_size=3)
    finally:
        logger.removeHandler(seen)
        for owner, attribute, value in saved:
            setattr(owner, attribute, value)
    assert seen.names.count("jit(_ranked)") == 1, seen.names
    assert found.classes.shape == (7, 2)
    np.testing.assert_array_equal(again.classes[:, :2], found.classes)  # top-k cut on the host
    whole = predict_classes(loaded, rows[:7], top_k=2, batch_size=7)
    np.testing.assert_allclose(found.probabilities, whole.probabilities, rtol=1e-6)


def test_rows_from_npy_npz_and_images_read_as_the_run_reads_them(tmp_path):
    from PIL import Image

    from dew.data._image_cache import decode_image

    rows = np.random.default_rng(0).random((3, *SHAPE), np.float32)
    np.save(tmp_path / "rows.npy", rows)
    np.savez(tmp_path / "rows.npz", images=rows, labels=np.zeros(3, np.int32))
    names, read = read_rows(tmp_path / "rows.npy", "images", SHAPE, FLOAT)
    assert names == ["0", "1", "2"] and np.array_equal(read, rows)
    names, read = read_rows(tmp_path / "rows.npz", "images", SHAPE, FLOAT)
    assert np.array_equal(read, rows)
    np.save(tmp_path / "one.npy", rows[0].astype(np.float64))  # one row, doubles: cast
    assert read_rows(tmp_path / "one.npy", "images", SHAPE, FLOAT)[1].dtype == FLOAT
    folder = tmp_path / "photos"
    (folder / "more").mkdir(parents=True)
    pixels = (rows * 255).astype(np.uint8)
    Image.fromarray(pixels[0]).resize((32, 24)).save(folder / "b.png")  # resized to the run's
    Image.fromarray(pixels[1]).save(folder / "a.png")
    Image.fromarray(pixels[2]).convert("L").save(folder / "more" / "c.png")  # grey: 3 channels
    (folder / "notes.txt").write_text("not an image")
    (folder / ".hidden.png").write_bytes(b"")
    names, read = read_rows(folder, "images", SHAPE, FLOAT)
    assert names == ["a.png", "b.png", "more/c.png"]
    files = [folder / name for name in names]
    expected = np.stack([decode_image("x", path, 3, (16, 16)) for path in files]) / 255
    np.testing.assert_array_equal(read, expected.astype(np.float32))
    assert read_rows(folder / "a.png", "images", SHAPE, FLOAT)[0] == ["a.png"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda path: np.save(path / "x.npy", np.zeros((2, 15, 16, 3), np.float32)),
            "{path}/x.npy: a row has shape (15, 16, 3), but the run's model reads rows of shape "
            "(16, 16, 3) (float32).",
        ),
        (
            lambda path: np.save(path / "x.npy", np.zeros((2, 16, 16, 3), np.uint8)),
            "{path}/x.npy: the rows are uint8, but the run's model reads rows of shape (16, 16, 3) "
            "(float32).",
        ),
        (
            lambda path: np.savez(path / "x.npz", inputs=np.zeros((2, *SHAPE), np.float32)),
            "dew predict: '{path}/x.npz' has no array 'images' (the batch key the run's "
            "classifier reads); it holds inputs.",
        ),
        (
            lambda path: (path / "x.csv").write_text("1,2\n"),
            "dew predict: --input '{path}/x.csv' is neither a .npy or .npz file, an image file",
        ),
        (
            lambda path: (path / "x").mkdir(),
            "dew predict: the folder '{path}/x' holds no image (files ending .bmp, ",
        ),
    ],
    ids=["shape", "dtype", "npz key", "suffix", "empty folder"],
)
def test_rows_the_model_cannot_read_are_one_line_naming_them(tmp_path, make, message):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"x\b") as caught:
        read_rows(path, "images", SHAPE, FLOAT)
    assert "\n" not in str(caught.value)
    assert message.format(path=tmp_path) in str(caught.value)


def _dew(capsys, *arguments):
    code = main(["predict", *map(str, arguments)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow  # the command on a trained run: about 15 s
def test_dew_predict_writes_csv_and_json_lines_with_class_names(classifier, tmp_path, capsys):
    loaded, rows, _ = classifier
    np.save(tmp_path / "rows.npy", rows)
    found = predict_classes(loaded, rows, top_k=2)
    code, out, err = _dew(
        capsys,
        loaded.folder,
        "--input",
        tmp_path / "rows.npy",
        "--out",
        tmp_path / "p.csv",
        "--top-k",
        2,
        "--batch-size",
        4,
    )
    assert (code, err) == (0, "")
    assert out == (
        f"wrote 10 predictions (top 2) to {tmp_path / 'p.csv'}: {loaded.folder}, step 2, "
        "live weights\n"
    )
    with (tmp_path / "p.csv").open() as file:
        table = list(csv.DictReader(file))
    assert list(table[0]) == ["row", "class_1", "probability_1", "class_2", "probability_2"]
    assert [row["row"] for row in table] == [str(index) for index in range(10)]
    names = [[row["class_1"], row["class_2"]] for row in table]
    assert names == [[SHAPE_KINDS[index] for index in ranked] for ranked in found.classes]
    shown = np.array([[float(row["probability_1"]), float(row["probability_2"])] for row in table])
    np.testing.assert_allclose(shown, found.probabilities, rtol=1e-5)
    code, _, _ = _dew(
        capsys, loaded.folder, "--input", tmp_path / "rows.npy", "--out", tmp_path / "p.jsonl"
    )
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert code == 0 and len(lines) == 10
    assert lines[0] == {
        "row": "0",
        "classes": [SHAPE_KINDS[found.classes[0, 0]]],
        "labels": [int(found.classes[0, 0])],
        "probabilities": [pytest.approx(float(found.probabilities[0, 0]), rel=1e-6)],
    }
    code, out, _ = _dew(capsys, loaded.folder, "--input", tmp_path / "rows.npy")  # to stdout
    assert code == 0 and out.splitlines()[0] == "row,class_1,probability_1"
    assert len(out.splitlines()) == 11
    assert input_rows(loaded) == (SHAPE, FLOAT)


@pytest.mark.slow  # the command on a trained run: about 10 s
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--input", "{rows}", "--out", "{tmp}/p.txt"],
            "--out '{tmp}/p.txt' must end .csv or .jsonl.",
        ),
        (["--input", "{tmp}/none.npy"], "--input '{tmp}/none.npy': no such file or folder."),
        (["--input", "{rows}", "--top-k", "4"], "--top-k 4 is more than the run's 3 classes."),
        (["--input", "{rows}", "--top-k", "0"], "--top-k must be an integer >= 1, got 0."),
        (
            ["--input", "{rows}", "--batch-size", "0"],
            "--batch-size must be an integer >= 1, got 0.",
        ),
        (["--input", "{rows}", "--step", "9"], "no checkpoint for step 9 under "),
        (["--input", "{rows}", "--weights", "ema"], "weights='ema', but the run keeps no EMA"),
        (["--input", "{rows}", "--out", "{tmp}/no/p.csv"], "--out '{tmp}/no/p.csv': no folder"),
    ],
)
def test_dew_predict_refuses_bad_input_in_one_line(
    classifier, tmp_path, capsys, arguments, message
):
    loaded, rows, _ = classifier
    np.save(tmp_path / "rows.npy", rows)
    values = {"rows": tmp_path / "rows.npy", "tmp": tmp_path}
    code, out, err = _dew(capsys, loaded.folder, *[value.format(**values) for value in arguments])
    assert code == 2 and out == ""
    assert err.startswith("dew predict: ") and err.count("\n") == 1
    assert message.format(**values) in err
    assert not (tmp_path / "p.txt").exists()


def test_dew_predict_without_a_run_folder_or_input_exits_2(tmp_path, capsys):
    assert _dew(capsys, tmp_path / "none", "--input", tmp_path)[:2] == (2, "")
    with pytest.raises(SystemExit) as leaving:
        main(["predict", str(tmp_path)])
    assert leaving.value.code == 2
    assert "the following arguments are required: --input" in capsys.readouterr().err
