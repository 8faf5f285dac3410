"""dew.data.image_folder: rows checked against Pillow's own decode and resize of the same files,
the labels following the class folders, the split disjoint, the cache reused and rebuilt, bad
input in one line, the registry and a run configuration, and scikit-learn's digits written as
PNGs trained to the same accuracy band as through `dew.data.arrays`."""

import math
import os
import pathlib
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import dew.data._image_cache as image_cache_module
from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
from dew.data import Dataset, Partition, image_folder
from dew.registry import datasets

BILINEAR = Image.Resampling.BILINEAR


def _save(path: pathlib.Path, pixels: np.ndarray, mode: str | None = None, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(pixels) if mode is None else Image.fromarray(pixels).convert(mode)
    image.save(path, **kwargs)


def _all_rows(rows) -> dict[str, np.ndarray]:
    return dict(rows.read(np.arange(len(rows))))


def _every_row(data: Dataset) -> dict[str, np.ndarray]:
    """The rows of the whole folder in file order (the training rows when nothing is held
    out)."""
    return _all_rows(data.train.rows)


def _pillow(path: pathlib.Path, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    """Pillow's own decode, conversion and bilinear resize of a file, as float32 in [0, 1]."""
    with Image.open(path) as image:
        converted = image.convert(mode)
    if size is not None:
        converted = converted.resize((size[1], size[0]), BILINEAR)
    pixels = np.asarray(converted, np.float32) / np.float32(255)
    return pixels[..., None] if mode == "L" else pixels


def _mixed_folder(root: pathlib.Path) -> list[pathlib.Path]:
    """Three classes of RGB, greyscale, RGBA, palette and JPEG files of several sizes."""
    rng = np.random.default_rng(0)
    files = []
    for index in range(9):
        height, width = 7 + index, 5 + 2 * index
        colour = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        grey = rng.integers(0, 256, (height, width), dtype=np.uint8)
        alpha = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        kind = ("cat", "dog", "emu")[index % 3]
        choices = [
            (f"{kind}/{index}_rgb.png", colour, None),
            (f"{kind}/nested/{index}_grey.PNG", grey, None),
            (f"{kind}/{index}_alpha.png", alpha, None),
            (f"{kind}/{index}_palette.gif", colour, "P"),
            (f"{kind}/{index}_photo.jpg", colour, None),
        ]
        name, pixels, mode = choices[index % len(choices)]
        _save(root / name, pixels, mode)
        files.append(root / name)
    (root / "cat" / "notes.txt").write_text("not an image")  # left out: no image ending
    (root / ".hidden").mkdir()  # left out: not a class
    _save(root / ".hidden" / "x.png", np.zeros((3, 3), np.uint8))
    return files


def test_the_rows_are_pillows_own_decode_and_bilinear_resize(tmp_path):
    files = _mixed_folder(tmp_path / "images")
    data = image_folder(tmp_path / "images", size=(6, 8), batch=2, cache_dir=tmp_path / "cache")
    assert data.classes == ("cat", "dog", "emu") and data.val is None
    expected = sorted(
        files,
        key=lambda path: (
            path.relative_to(tmp_path / "images").parts[0],
            str(path.parent),  # a folder's files before its sub-folders'
            path.name,
        ),
    )
    rows = _every_row(data)
    assert rows["images"].shape == (9, 6, 8, 3) and rows["images"].dtype == np.float32
    assert rows["labels"].dtype == np.int32
    for row, path in enumerate(expected):
        np.testing.assert_array_equal(rows["images"][row], _pillow(path, "RGB", (6, 8)))
        label = ("cat", "dog", "emu").index(path.relative_to(tmp_path / "images").parts[0])
        assert rows["labels"][row] == label
    batch = data.train.batch_at(0, Partition())
    assert batch["images"].shape == (2, 6, 8, 3) and batch["labels"].shape == (2,)


def test_greyscale_images_keep_one_channel_unless_told(tmp_path):
    rng = np.random.default_rng(1)
    root = tmp_path / "grey"
    _save(root / "a" / "eight.png", rng.integers(0, 256, (5, 5), dtype=np.uint8))
    _save(root / "a" / "bilevel.png", rng.integers(0, 256, (5, 5), dtype=np.uint8), "1")
    _save(root / "b" / "alpha.png", rng.integers(0, 256, (5, 5, 2), dtype=np.uint8), "LA")
    sixteen = rng.integers(0, 65536, (5, 5), dtype=np.uint16)
    _save(root / "b" / "sixteen.png", sixteen)
    assert Image.open(root / "b" / "sixteen.png").mode == "I;16"
    grey = _every_row(image_folder(root, batch=1, cache_dir=tmp_path / "c"))["images"]
    assert grey.shape == (4, 5, 5, 1)
    for row, name in enumerate(["a/bilevel.png", "a/eight.png", "b/alpha.png"]):
        np.testing.assert_array_equal(grey[row], _pillow(root / name, "L", None))
    # 16-bit greyscale is read at 8 bits: round(value / 257), not Pillow's clipping "L".
    np.testing.assert_array_equal(
        grey[3, ..., 0], np.round(sixteen / 257).astype(np.float32) / np.float32(255)
    )
    rgb = _every_row(image_folder(root, batch=1, channels=3, cache_dir=tmp_path / "c"))["images"]
    np.testing.assert_array_equal(
        rgb[:3],
        [
            _pillow(root / name, "RGB", None)
            for name in ["a/bilevel.png", "a/eight.png", "b/alpha.png"]
        ],
    )
    rgba = image_folder(root, batch=1, channels=4, size=3, cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(
        _every_row(rgba)["images"][2], _pillow(root / "b" / "alpha.png", "RGBA", (3, 3))
    )


def _labelled_folder(root: pathlib.Path, counts: dict[str, list[int]]) -> dict[int, tuple]:
    """Class folders holding `counts[name]` files at the given nesting depths; each file's
    pixels are its own number (every pixel), so a row names its file. Returns number ->
    (class name, path)."""
    made = {}
    for name, depths in counts.items():
        for depth in depths:
            number = len(made)
            folder = root / name / pathlib.Path(*(["deeper"] * depth))
            _save(folder / f"{number:03d}.png", np.full((2, 3), number, np.uint8))
            made[number] = (name, folder / f"{number:03d}.png")
    return made


_NAMES = st.text(alphabet="abcdefgXYZ_-0123456789", min_size=1, max_size=6)


@settings(max_examples=15)
@given(
    counts=st.dictionaries(
        _NAMES, st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=2, max_size=4
    ),
    val_fraction=st.sampled_from([0.0, 0.2, 0.5]),
    seed=st.integers(0, 3),
    batch=st.integers(1, 3),
)
def test_labels_follow_the_class_folders_and_the_split_is_disjoint(
    counts, val_fraction, seed, batch
):
    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        made = _labelled_folder(root / "images", counts)
        held = math.ceil(val_fraction * len(made)) if val_fraction else 0
        if len(made) - held < batch:
            return
        data = image_folder(
            root / "images",
            batch=batch,
            val_fraction=val_fraction,
            seed=seed,
            cache_dir=root / "cache",
        )
        classes = sorted(counts)
        assert data.classes == tuple(classes)

        def numbers(rows: dict[str, np.ndarray]) -> list[int]:
            found = np.rint(rows["images"] * 255).astype(int)
            assert (found == found[:, :1, :1]).all()  # one file's pixels per row
            for number, label in zip(found[:, 0, 0, 0], rows["labels"], strict=True):
                assert classes[label] == made[number][0]  # labelled by its class folder
            return found[:, 0, 0, 0].tolist()

        steps = -(-data.records // batch)
        trained = numbers(
            {
                key: np.concatenate(
                    [data.train.batch_at(step, Partition())[key] for step in range(steps)]
                )[: data.records]
                for key in ("images", "labels")
            }
        )
        validated = []
        if data.val is not None:
            for part in data.val(Partition()):
                validated += numbers(part)
        assert len(validated) == held and data.records == len(made) - held
        assert sorted(trained + validated) == sorted(made)  # every file once: disjoint, whole


@settings(max_examples=8)
@given(file=st.integers(0, 5), row=st.integers(0, 3), value=st.integers(0, 255))
def test_the_fingerprint_changes_when_a_files_pixels_do_and_not_when_it_is_touched(
    file, row, value
):
    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        made = _labelled_folder(root / "images", {"a": [0, 0, 1], "b": [0, 1, 1]})

        def fingerprint() -> str:
            data = image_folder(
                root / "images", batch=2, val_fraction=0.3, cache_dir=root / "cache"
            )
            return data.train.rows.fingerprint

        first = fingerprint()
        path = made[file][1]
        status = path.stat()
        os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))
        assert fingerprint() == first  # touched: rebuilt under a new key, the same content
        pixels = np.asarray(Image.open(path)).copy()
        changed = pixels[row % 2, row % 3] != value
        pixels[row % 2, row % 3] = value
        _save(path, pixels)
        assert (fingerprint() != first) == bool(changed)


def test_a_second_call_reads_the_cache_and_a_changed_folder_rebuilds_it(tmp_path, monkeypatch):
    made = _labelled_folder(tmp_path / "images", {"a": [0, 0], "b": [0, 0]})
    decoded = []
    decode = image_cache_module.decode_image

    def counting(*args, **kwargs):
        decoded.append(args[1])
        return decode(*args, **kwargs)

    monkeypatch.setattr(image_cache_module, "decode_image", counting)
    first = image_folder(tmp_path / "images", batch=2, cache_dir=tmp_path / "cache")
    assert len(decoded) == 4
    again = image_folder(tmp_path / "images", batch=2, cache_dir=tmp_path / "cache")
    assert len(decoded) == 4  # read, not decoded
    assert again.train.rows.fingerprint == first.train.rows.fingerprint
    _save(tmp_path / "images" / "b" / "new.png", np.full((2, 3), 99, np.uint8))
    grown = image_folder(tmp_path / "images", batch=2, cache_dir=tmp_path / "cache")
    assert len(decoded) == 9 and grown.records == len(made) + 1
    assert len(list((tmp_path / "cache").glob("images-*"))) == 2
    assert isinstance(grown.train.rows.images, np.memmap)  # memory-mapped, not in memory


def _one_line(error, build, *fragments):
    with pytest.raises(error) as caught:
        build()
    message = str(caught.value)
    assert "\n" not in message and message.startswith("image_folder: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_bad_folders_raise_one_line_naming_the_value(tmp_path):
    def build(path, **kwargs):
        return lambda: image_folder(path, batch=1, cache_dir=tmp_path / "cache", **kwargs)

    root = tmp_path / "images"
    _one_line(FileNotFoundError, build(root), "no folder at", "images'")
    root.mkdir()
    (tmp_path / "file.png").write_bytes(b"")
    _one_line(NotADirectoryError, build(tmp_path / "file.png"), "file.png' is a file")
    _one_line(ValueError, build(root), "has no class folders", os.path.join("cat", "1.png"))
    _save(root / "cat" / "1.png", np.zeros((4, 4), np.uint8))
    _one_line(ValueError, build(root), "has one class folder ('cat')", "two or more")
    (root / "dog").mkdir()
    (root / "dog" / "readme.md").write_text("no images here")
    _one_line(ValueError, build(root), "class folder", "dog' holds no image", ".png")
    _save(root / "dog" / "2.png", np.zeros((5, 4), np.uint8))
    _one_line(
        ValueError, build(root), "differ in size", "1.png' is 4x4", "2.png' is 5x4", "pass size="
    )
    _one_line(
        ValueError,
        build(root, classes=["cat", "cow"]),
        "classes names 'cow'",
        "its class folders: 'cat', 'dog'",
    )
    _one_line(ValueError, build(root, size=(4, 0)), "size must be a positive int", "(4, 0)")
    _one_line(ValueError, build(root, size=(4, 4, 3)), "size must be a positive int", "(4, 4, 3)")
    _one_line(ValueError, build(root, size=4, channels=2), "channels must be 1, 3, 4 or None")
    _one_line(ValueError, build(root, size=4, val_fraction=1.0), "val_fraction must be a number")
    _one_line(
        ValueError,
        lambda: image_folder(root, size=4, batch=3, cache_dir=tmp_path),
        "batch=3 is more than the 2 training image(s)",
    )
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half-built is left


def test_a_file_pillow_cannot_read_or_decode_is_named_and_leaves_no_cache(tmp_path):
    root = tmp_path / "images"
    _save(root / "cat" / "1.png", np.zeros((4, 4), np.uint8))
    _save(
        root / "dog" / "2.png",
        np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) % 251 * np.ones(1, np.uint8),
        "L",
    )
    whole = (root / "dog" / "2.png").read_bytes()
    (root / "dog" / "2.png").write_bytes(whole[: len(whole) // 2])  # a header, half the data
    _one_line(
        ValueError,
        lambda: image_folder(root, size=4, batch=1, cache_dir=tmp_path / "c"),
        "Pillow cannot decode",
        "2.png'",
    )
    (root / "dog" / "3.png").write_bytes(b"not an image at all")
    _one_line(
        ValueError,
        lambda: image_folder(root, size=4, batch=1, cache_dir=tmp_path / "c"),
        "Pillow cannot read",
        "3.png'",
        "UnidentifiedImageError",
    )
    _save(root / "cat" / "float.tif", np.zeros((4, 4), np.float32))
    _one_line(
        ValueError,
        lambda: image_folder(root, size=4, batch=1, cache_dir=tmp_path / "c"),
        "float.tif' is a 32-bit float image",
    )
    assert list((tmp_path / "c").iterdir()) == []


def test_a_run_configuration_names_an_image_folder_and_keeps_its_cache_in_the_run(tmp_path):
    _labelled_folder(tmp_path / "images", {"a": [0, 0, 0], "b": [0, 0, 0]})
    config = datasets["image_folder"](
        path=str(tmp_path / "images"), size=[4, 5], val_fraction=0.3, classes=["b", "a"]
    )
    run = RunConfig(ModelConfig("vit"), config, trainer=TrainerConfig(steps=1, batch_size=2))
    again = RunConfig.from_toml(run.to_toml())
    assert again.data == config and again.data.kwargs["size"] == (4, 5)
    built = again.data.build(batch_size=2, seed=3, cache_dir=tmp_path / "run" / "data-cache")
    direct = image_folder(
        tmp_path / "images",
        size=(4, 5),
        batch=2,
        val_fraction=0.3,
        seed=3,
        classes=["b", "a"],
        cache_dir=tmp_path / "elsewhere",
    )
    assert built.classes == direct.classes == ("b", "a")
    for step in (0, 5):
        a, b = (data.train.batch_at(step, Partition()) for data in (built, direct))
        np.testing.assert_array_equal(a["images"], b["images"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
    assert len(list((tmp_path / "run" / "data-cache").glob("images-*"))) == 1
    assert DataConfig("image_folder", {"path": "x"}).name == "image_folder"
    with pytest.raises(TypeError, match="dataset 'image_folder' does not take 'folder'"):
        datasets["image_folder"](folder="images")


# The proof on data nobody here wrote: scikit-learn's digits, as PNGs in class folders.


def write_digits(root: pathlib.Path) -> int:
    """scikit-learn's `load_digits` (1797 8x8 images of 0..16) as 8-bit greyscale PNGs
    (`round(value * 255 / 16)`), one folder per digit; returns the count."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    for number, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        _save(folder / f"{number:04d}.png", np.round(pixels * 255 / 16).astype(np.uint8))
    return len(digits.target)


@pytest.mark.slow  # about 15 s: writing 1797 PNGs, 600 steps and the compilations
def test_sklearns_digits_as_png_folders_reach_095_validation_accuracy(tmp_path):
    """The model, objective and schedule `dew.data.arrays`' digits proof uses (an MLP
    64-128-10 over the flattened image, the registered classifier objective, 600 steps of 64
    with Adam at 3e-3), on the digits read back from PNG class folders (20% held out).
    Measured on seeds 0-4: see the decision record 0037."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    from dew import Trainer, metrics
    from dew.registry import objectives

    count = write_digits(tmp_path / "digits")
    data = image_folder(
        tmp_path / "digits", batch=64, val_fraction=0.2, cache_dir=tmp_path / "cache"
    )
    assert data.classes == tuple(str(digit) for digit in range(10))
    assert data.records == count - math.ceil(0.2 * count)
    assert data.train.batch_at(0, Partition())["images"].shape == (64, 8, 8, 1)
    key = jax.random.key(0)
    mlp = eqx.nn.MLP(64, 10, width_size=128, depth=1, key=key)
    model = eqx.nn.Sequential([eqx.nn.Lambda(jnp.ravel), mlp])
    objective = objectives["classifier"](model, key=key, classes=10, inputs="images")
    trainer = Trainer(objective, optax.adam(3e-3), key=jax.random.fold_in(key, 1))
    state = trainer.fit(
        data, 600, log_every=100, eval_every=600, metrics=[metrics.accuracy()], progress=False
    )
    assert state.metric_history["classifier/validation/accuracy"][-1][1] >= 0.95


def test_without_pillow_the_error_names_the_extra_as_the_users_to_fix(tmp_path, monkeypatch):
    from dew.cli._errors import _caused_by_user

    _labelled_folder(tmp_path / "images", {"a": [0], "b": [0]})
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # `import PIL.Image` now fails
    with pytest.raises(ImportError, match=r"install dew-ml\[images\]") as caught:
        image_folder(tmp_path / "images", batch=1, cache_dir=tmp_path / "cache")
    assert caught.value.name == "PIL" and _caused_by_user(caught.value)
