"""The shapes classifier behind `class_accuracy`: accurate on real shapes it never saw,
deterministic, and trained once into the cache folder."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from dew._shape_drawing import SHAPE_KINDS
from dew.data import Partition
from dew.metrics import _shape_classifier as module
from dew.metrics import shape_classifier
from dew.metrics._shape_classifier import drawn_shapes, held_out_accuracy
from dew.registry import moving_shapes, shapes

CHEAP = dataclasses.replace(module.RECIPE, steps=3, train_rows=64, held_out_rows=32)


def _accuracy(classifier, images, labels):
    predicted = np.asarray(classifier(images)).argmax(axis=-1)
    return float(np.mean(predicted == np.asarray(labels)))


@pytest.mark.slow  # trains the classifier once a test session (about 15 s of CPU)
def test_the_classifier_names_the_kind_of_real_shapes_it_never_saw():
    classifier = shape_classifier()
    # Its recorded accuracy is on the recipe's own held-out pool ...
    images, labels = drawn_shapes(2048, 16, module.RECIPE.held_out_seed)
    assert classifier.held_out_accuracy == pytest.approx(_accuracy(classifier, images, labels))
    assert classifier.held_out_accuracy >= 0.95
    # ... and it names the kind of the rows a `shapes` run validates on, and of every frame
    # of `moving_shapes` clips (another pool, shapes that move across the frames).
    batch = next(shapes(rows=1024, val_fraction=0.0625, batch_size=64, seed=0).val(Partition()))
    assert _accuracy(classifier, batch["images"], batch["labels"]) >= 0.95
    clips = next(
        moving_shapes(rows=1024, val_fraction=0.0625, batch_size=64, seed=0).val(Partition())
    )
    frames = clips["clips"].reshape(-1, 16, 16, 3)
    assert _accuracy(classifier, frames, np.repeat(clips["labels"], 4)) >= 0.95
    assert held_out_accuracy(classifier, frames=4) >= 0.95
    # Every kind, not one kind well: each kind's recall on the held-out pool.
    predicted = np.asarray(classifier(images)).argmax(axis=-1)
    for kind in range(len(SHAPE_KINDS)):
        assert np.mean(predicted[labels == kind] == kind) >= 0.9, SHAPE_KINDS[kind]


@pytest.mark.slow  # about 8 s: two compiled trainings of three steps
def test_training_is_deterministic():
    first = module.train_shape_classifier(16, CHEAP)
    second = module.train_shape_classifier(16, CHEAP)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert first.held_out_accuracy == second.held_out_accuracy
    assert first.recipe_sha256 == CHEAP.digest(16) != module.RECIPE.digest(16)


@pytest.fixture
def cheap_recipe(monkeypatch):
    """The module's recipe made cheap, and a count of the trainings it runs."""
    trained = []
    train = module.train_shape_classifier

    def counted(image_size, recipe):
        trained.append(image_size)
        return train(image_size, recipe)

    monkeypatch.setattr(module, "RECIPE", CHEAP)
    monkeypatch.setattr(module, "train_shape_classifier", counted)
    return trained


def _cached(folder):
    (path,) = [path for path in folder.iterdir() if path.suffix == ".npz"]
    return path


def test_the_first_call_trains_and_keeps_the_weights_later_ones_read_them(cheap_recipe, tmp_path):
    first = shape_classifier(cache_dir=tmp_path)
    assert cheap_recipe == [16]
    path = _cached(tmp_path)
    assert path.name == f"shape-classifier-{CHEAP.digest(16)[:16]}.npz"
    again = shape_classifier(cache_dir=tmp_path)
    assert cheap_recipe == [16]  # read, not trained
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert again.held_out_accuracy == first.held_out_accuracy
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]  # no temporary left


def test_the_cache_folder_defaults_to_dew_cache_dir(cheap_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("DEW_CACHE_DIR", str(tmp_path))
    shape_classifier()
    assert _cached(tmp_path).name.startswith("shape-classifier-")


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(b"not an npz"),
        lambda path: path.write_bytes(path.read_bytes()[:100]),
        lambda path: np.savez(path, recipe_sha256=np.str_("another recipe")),
    ],
    ids=["garbage", "truncated", "another recipe"],
)
def test_a_damaged_or_foreign_file_is_trained_again_and_replaced(cheap_recipe, tmp_path, damage):
    shape_classifier(cache_dir=tmp_path)
    path = _cached(tmp_path)
    damage(path)
    shape_classifier(cache_dir=tmp_path)
    assert cheap_recipe == [16, 16]
    shape_classifier(cache_dir=tmp_path)  # the replaced file reads back
    assert cheap_recipe == [16, 16]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_cache_folder_is_one_error_naming_it(cheap_recipe, tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OSError, match=f"cannot write its weights under '{folder}'"):
            shape_classifier(cache_dir=folder)
        assert cheap_recipe == []
    finally:
        folder.chmod(0o700)


def test_a_cache_folder_under_a_file_is_one_error_naming_it_before_training(cheap_recipe, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match=f"cannot write its weights under '{blocker / 'cache'}'"):
        shape_classifier(cache_dir=blocker / "cache")
    assert cheap_recipe == []  # refused before the training, not after it


def test_an_image_size_below_the_shapes_datasets_is_refused():
    with pytest.raises(ValueError, match="image_size must be an integer >= 12, got 8"):
        shape_classifier(8)


@pytest.mark.parametrize("terminal", [True, False])
def test_the_training_says_so_in_one_line_on_a_terminal_and_a_read_says_nothing(
    cheap_recipe, tmp_path, monkeypatch, capsys, terminal
):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    shape_classifier(cache_dir=tmp_path)
    said = capsys.readouterr().err
    path = _cached(tmp_path)
    expected = (
        "training the shapes classifier that class_accuracy reads (16x16, once: about 10 s); "
        f"it is kept at {path}\n"
    )
    assert said == (expected if terminal else "")
    shape_classifier(cache_dir=tmp_path)
    assert capsys.readouterr().err == ""
