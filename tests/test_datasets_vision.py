"""The built-in synthetic vision datasets, `shapes` and `moving_shapes`."""

import itertools
import math

import numpy as np
import pytest
from _checks import rejects
from hypothesis import given
from hypothesis import strategies as st

from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
from dew.data import Dataset, Partition
from dew.registry import SHAPE_KINDS, datasets, moving_shapes, shapes

SQUARE, DISC, BAR = (SHAPE_KINDS.index(kind) for kind in ("square", "disc", "bar"))


def every_row(data, partition=None):
    """One batch holding every training row of `partition`'s first epoch, in order."""
    return next(data.train(partition or Partition()))


def masks(pixels):
    """Where a shape is: the background is exactly 0 and every shape channel is >= 0.3."""
    return pixels.max(axis=-1) > 0


def boxes(mask):
    """Per image `(rows, size, size)`: the bounding box's height and width and the pixel count."""
    return mask.any(axis=2).sum(axis=1), mask.any(axis=1).sum(axis=1), mask.sum(axis=(1, 2))


def centroids(mask):
    """The mean pixel position (row, column) of each mask `(..., size, size)`."""
    size = mask.shape[-1]
    count = mask.sum(axis=(-2, -1))
    down = (mask * np.arange(size)[:, None]).sum(axis=(-2, -1)) / count
    across = (mask * np.arange(size)).sum(axis=(-2, -1)) / count
    return np.stack([down, across], axis=-1)


def row_keys(batch, key):
    return [
        pixels.tobytes() + bytes([label])
        for pixels, label in zip(batch[key], batch["labels"], strict=True)
    ]


# Layout and values.


def test_shapes_batches_are_float_images_in_the_unit_range_with_int32_labels():
    data = shapes(rows=100, batch_size=8, seed=0)
    assert isinstance(data, Dataset) and data.batch == 8 and data.records == 90
    batch = next(data.train(Partition()))
    assert set(batch) == {"images", "labels"}
    assert batch["images"].shape == (8, 16, 16, 3) and batch["images"].dtype == np.float32
    assert batch["labels"].shape == (8,) and batch["labels"].dtype == np.int32
    assert batch["images"].min() >= 0 and batch["images"].max() <= 1
    assert set(batch["labels"].tolist()) <= {0, 1, 2}
    assert SHAPE_KINDS == ("square", "disc", "bar")
    images = next(shapes(image_size=12, batch_size=2, seed=0).train(Partition()))["images"]
    assert images.shape == (2, 12, 12, 3)


def test_moving_shapes_batches_are_float_clips_in_the_unit_range_with_int32_labels():
    data = moving_shapes(rows=40, frames=3, val_fraction=0.25, batch_size=4, seed=0)
    assert data.batch == 4 and data.records == 30
    batch = next(data.train(Partition()))
    assert set(batch) == {"clips", "labels"}
    assert batch["clips"].shape == (4, 3, 16, 16, 3) and batch["clips"].dtype == np.float32
    assert batch["labels"].shape == (4,) and batch["labels"].dtype == np.int32
    assert batch["clips"].min() >= 0 and batch["clips"].max() <= 1
    assert [len(batch["labels"]) for batch in data.val(Partition())] == [4, 4, 2]


def test_each_image_is_one_coloured_shape_on_a_black_background():
    images = every_row(shapes(rows=600, val_fraction=0, batch_size=600, seed=0))["images"]
    mask = masks(images)
    assert mask.any(axis=(1, 2)).all()
    assert (images[~mask] == 0).all()
    shape_pixels = images[mask]
    assert shape_pixels.min() >= 0.3
    # One colour per shape: every pixel of an image's shape equals its first one.
    first = images.reshape(600, -1, 3)[np.arange(600), mask.reshape(600, -1).argmax(axis=1)]
    np.testing.assert_array_equal(
        np.where(mask[..., None], images, 0), mask[..., None] * first[:, None, None]
    )
    # Dark on the whole: a shape covers at most a quarter of the image.
    assert mask.mean(axis=(1, 2)).max() <= 0.25
    assert images.mean() < 0.15
    assert len(np.unique(first, axis=0)) == 600


def test_each_label_names_the_kind_of_shape_drawn():
    batch = every_row(shapes(rows=1500, val_fraction=0, batch_size=1500, seed=0))
    height, width, count = boxes(masks(batch["images"]))
    labels = batch["labels"]
    assert [np.mean(labels == kind) for kind in (SQUARE, DISC, BAR)] == pytest.approx(
        [1 / 3] * 3, abs=0.05
    )
    square, disc, bar = (labels == kind for kind in (SQUARE, DISC, BAR))
    # Squares fill a square box, 4 to 8 pixels a side.
    assert (height[square] == width[square]).all()
    assert (count[square] == height[square] * width[square]).all()
    assert set(height[square].tolist()) == set(range(4, 9))
    # Discs: a square box they do not fill, and about pi r^2 pixels for a radius of 3 to 4.
    assert (height[disc] == width[disc]).all()
    assert (count[disc] < height[disc] * width[disc]).all()
    radius = width[disc] / 2
    assert (np.abs(count[disc] / (math.pi * radius**2) - 1) < 0.2).all()
    assert count[disc].min() >= 28 and count[disc].max() <= 1.1 * math.pi * 4**2
    # Bars fill a box at least 8/3 times as long as it is thick, upright or lying.
    long, short = np.maximum(height[bar], width[bar]), np.minimum(height[bar], width[bar])
    assert (count[bar] == height[bar] * width[bar]).all()
    assert (3 * long >= 8 * short).all()
    assert set(long.tolist()) == set(range(8, 15)) and set(short.tolist()) == {2, 3}
    assert 0 < np.mean(height[bar] > width[bar]) < 1


def test_clips_move_one_shape_at_a_constant_velocity_inside_the_frame():
    for size, frames in [(16, 4), (16, 9), (12, 2), (32, 5)]:
        data = moving_shapes(
            rows=300, image_size=size, frames=frames, val_fraction=0, batch_size=300, seed=0
        )
        clips = every_row(data)["clips"]
        mask = masks(clips)
        counts = mask.sum(axis=(2, 3))
        # The shape never leaves (nor wraps): every frame holds all of its pixels.
        assert (counts == counts[:, :1]).all() and (counts > 0).all()
        centre = centroids(mask)
        velocity = centre[:, 1] - centre[:, 0]
        times = np.arange(frames)[None, :, None]
        np.testing.assert_allclose(centre, centre[:, :1] + times * velocity[:, None], atol=1e-9)
        np.testing.assert_allclose(velocity, np.round(velocity), atol=1e-9)
        velocity = np.round(velocity)
        assert (np.abs(velocity).max(axis=1) > 0).all()
        assert np.abs(velocity).max() <= max(1, size // 8)
        # Each frame is the first one moved by whole pixels, colours and all.
        for row in range(0, 300, 37):
            for time in range(frames):
                shift = (time * velocity[row]).astype(int)
                moved = np.roll(clips[row, 0], shift, axis=(0, 1))
                np.testing.assert_array_equal(clips[row, time], moved)


def test_clips_are_labelled_by_their_shape_kind():
    batch = every_row(moving_shapes(rows=900, val_fraction=0, batch_size=900, seed=0))
    height, width, count = boxes(masks(batch["clips"][:, 0]))
    labels = batch["labels"]
    full = count == height * width
    assert set(labels.tolist()) == {SQUARE, DISC, BAR}
    assert (full[labels != DISC]).all() and not full[labels == DISC].any()
    aspect = np.maximum(height, width) / np.minimum(height, width)
    assert (aspect[labels == BAR] >= 8 / 3).all() and (aspect[labels != BAR] == 1).all()


# Seeds.


@pytest.mark.parametrize(("builder", "key"), [(shapes, "images"), (moving_shapes, "clips")])
def test_the_data_is_reproducible_and_the_seed_shuffles_its_order(builder, key):
    def first(seed):
        return list(
            itertools.islice(builder(rows=64, batch_size=8, seed=seed).train(Partition()), 3)
        )

    for a, b in zip(first(3), first(3), strict=True):
        np.testing.assert_array_equal(a[key], b[key])
        np.testing.assert_array_equal(a["labels"], b["labels"])
    data = builder(rows=64, batch_size=8, seed=3)
    np.testing.assert_array_equal(next(data.train(Partition()))[key], first(3)[0][key])
    assert not np.array_equal(first(3)[0][key], first(4)[0][key])
    # The rows themselves are the same for every seed: only the order differs.
    everything = [
        every_row(builder(rows=64, val_fraction=0, batch_size=64, seed=s)) for s in (3, 4)
    ]
    assert sorted(row_keys(everything[0], key)) == sorted(row_keys(everything[1], key))
    assert row_keys(everything[0], key) != row_keys(everything[1], key)
    val = [next(builder(rows=64, batch_size=8, seed=s).val(Partition())) for s in (3, 4)]
    np.testing.assert_array_equal(val[0][key], val[1][key])


# Partitions.


@given(
    count=st.integers(1, 6),
    extra=st.integers(0, 20),
    val_fraction=st.sampled_from([0, 0.25]),
    moving=st.booleans(),
)
def test_partitions_see_disjoint_rows_that_together_are_all_rows(
    count, extra, val_fraction, moving
):
    builder, key = (moving_shapes, "clips") if moving else (shapes, "images")
    rows = 2 * count + 1 + extra
    data = builder(rows=rows, image_size=12, val_fraction=val_fraction, batch_size=1, seed=5)
    train_rows = rows - math.ceil(val_fraction * rows)
    assert data.records == train_rows
    everything = row_keys(
        every_row(
            builder(
                rows=rows, image_size=12, val_fraction=val_fraction, batch_size=train_rows, seed=5
            )
        ),
        key,
    )
    assert len(set(everything)) == train_rows
    shares = []
    for index in range(count):
        mine = len(range(index, train_rows, count))
        batches = itertools.islice(data.train(Partition(index, count)), mine)
        shares.append([key_ for batch in batches for key_ in row_keys(batch, key)])
    assert sum(len(share) for share in shares) == train_rows
    assert set().union(*shares) == set(everything)
    if val_fraction:
        val = [
            [key_ for batch in data.val(Partition(index, count)) for key_ in row_keys(batch, key)]
            for index in range(count)
        ]
        whole = [key_ for batch in data.val(Partition()) for key_ in row_keys(batch, key)]
        assert sum(len(share) for share in val) == len(whole) == rows - train_rows
        assert set().union(*val) == set(whole) and set(whole).isdisjoint(everything)
    else:
        assert data.val is None


# Configs.


def test_data_configs_and_toml_build_the_vision_datasets():
    assert {"shapes", "moving_shapes"} <= set(datasets)
    assert datasets.builder("shapes") is shapes
    assert datasets.builder("moving_shapes") is moving_shapes
    config = datasets["moving_shapes"](rows=32, frames=3, image_size=12)
    assert config == DataConfig("moving_shapes", {"rows": 32, "frames": 3, "image_size": 12})
    run = RunConfig(ModelConfig("any_model"), config, trainer=TrainerConfig(steps=1, batch_size=4))
    again = RunConfig.from_toml(run.to_toml())
    assert again == run
    clips = next(again.data.build(batch_size=4, seed=0).train(Partition()))["clips"]
    assert clips.shape == (4, 3, 12, 12, 3)
    direct = next(
        moving_shapes(rows=32, frames=3, image_size=12, batch_size=4, seed=0).train(Partition())
    )
    np.testing.assert_array_equal(clips, direct["clips"])
    images = DataConfig("shapes", {"rows": 16}).build(batch_size=2, seed=1)
    assert next(images.train(Partition()))["images"].shape == (2, 16, 16, 3)
    with pytest.raises(TypeError, match="dataset 'shapes' does not take 'frames'"):
        datasets["shapes"](frames=4)


# Bad arguments.


@pytest.mark.parametrize(
    ("builder", "kwargs", "message"),
    [
        (shapes, {"rows": 0}, r"^shapes: rows must be an integer >= 1, got 0\.$"),
        (shapes, {"rows": True}, r"^shapes: rows must be an integer >= 1, got True\.$"),
        (shapes, {"image_size": 8}, r"^shapes: image_size must be an integer >= 12, got 8\.$"),
        (shapes, {"val_fraction": 1}, r"^shapes: val_fraction must be a number in \[0, 1\), got 1"),
        (shapes, {"batch_size": 0}, r"^shapes: batch_size must be an integer >= 1, got 0\.$"),
        (shapes, {"seed": -1}, r"^shapes: seed must be an integer >= 0, got -1\.$"),
        (
            shapes,
            {"rows": 1, "val_fraction": 0.5},
            r"^shapes: 1 row\(s\) leave no training row after holding out val_fraction=0\.5",
        ),
        (moving_shapes, {"frames": 1}, r"^moving_shapes: frames must be an integer >= 2, got 1\.$"),
        (
            moving_shapes,
            {"frames": 10},
            r"^moving_shapes: frames must be at most image_size // 2 \+ 1 = 9 \(so that every "
            r"shape can move a pixel a frame inside the 16x16 image\), got 10\.$",
        ),
        (moving_shapes, {"image_size": 12, "frames": 8}, r"at most image_size // 2 \+ 1 = 7"),
        (moving_shapes, {"image_size": 11}, r"^moving_shapes: image_size must be an integer >= 12"),
        (moving_shapes, {"rows": -3}, r"^moving_shapes: rows must be an integer >= 1, got -3\.$"),
    ],
)
def test_bad_arguments_raise_naming_the_value_and_what_is_allowed(builder, kwargs, message):
    with pytest.raises(ValueError, match=message):
        builder(**{"batch_size": 2, "seed": 0, **kwargs})


def test_a_fractional_row_count_is_refused():
    with rejects(ValueError, r"shapes: rows must be an integer >= 1, got 2\.5\.", parameter="rows"):
        shapes(rows=2.5, batch_size=2, seed=0)
    with rejects(ValueError, r"moving_shapes: frames must be an integer", parameter="frames"):
        moving_shapes(frames=3.0, batch_size=2, seed=0)


def test_more_partitions_than_training_rows_raise():
    data = shapes(rows=4, val_fraction=0, batch_size=1, seed=0)
    with pytest.raises(
        ValueError,
        match=r"^shapes: a global batch of 5 rows \(5 process\(es\) x 1\) is more than the 4",
    ):
        data.train(Partition(4, 5))
