"""dew.tracking._grid and the grid pieces: every sample a cell enlarged nearest neighbour, its
class name or prompt under it, the real rows beside the generated ones; read back by Pillow and
checked against a layout computed from the inputs (`_grids`)."""

import jax.numpy as jnp
import numpy as np
import pytest
from _grids import check_gif_grid, check_png_grid, uint8

from dew.artifacts import Clips, Images
from dew.tracking import Preview, preview_files
from dew.tracking._grid import caption_lines, cell_scale, grid_frames
from dew.tracking._preview import Animation, Picture, render_preview

Image = pytest.importorskip("PIL.Image")

CLASSES = ("square", "disc", "bar")
RNG = np.random.default_rng(0)
# Values the GIF palette holds exactly (8 levels of red and green, 4 of blue): a clip's
# grid then reads back from the GIF pixel for pixel.
PALETTE_LEVELS = np.stack(
    np.broadcast_arrays(np.arange(8)[:, None, None] / 7, np.arange(8)[None, :, None] / 7,
                        np.arange(4)[None, None, :] / 3), axis=-1,
).reshape(-1, 3)  # fmt: skip


def _palette_clips(*shape):
    """Clips `(*shape, 3)` whose every pixel is a colour of the GIF palette."""
    return PALETTE_LEVELS[RNG.integers(0, len(PALETTE_LEVELS), shape)].astype(np.float32)


@pytest.mark.parametrize(
    ("height", "width", "scale"), [(16, 16, 4), (5, 7, 10), (64, 8, 1), (90, 9, 1)]
)
def test_a_cell_is_the_least_whole_enlargement_reaching_the_cell_size(height, width, scale):
    assert cell_scale(height, width) == scale


def test_an_image_grid_shows_each_sample_enlarged_with_its_class_under_it_beside_the_real_row():
    generated = RNG.random((3, 16, 16, 3)).astype(np.float32)
    real = RNG.random((3, 16, 16, 3)).astype(np.float32)
    labels = np.array([2, 0, 1], np.int32)
    images = Images(jnp.asarray(generated), jnp.asarray(real), labels=jnp.asarray(labels))
    (picture,) = render_preview(Preview(images, classes=CLASSES))
    assert isinstance(picture, Picture) and picture.file == ("grid.png", picture.png)
    captions = ["bar", "square", "disc"]
    lines = [("generated", uint8(generated)), ("real", uint8(real))]
    pixels = check_png_grid(picture.png, lines, captions)
    np.testing.assert_array_equal(pixels, picture.pixels)
    # The captions are what they say: the same grid under other labels is another picture.
    swapped = Images(jnp.asarray(generated), jnp.asarray(real), labels=jnp.asarray(labels[::-1]))
    (other,) = render_preview(Preview(swapped, classes=CLASSES))
    with pytest.raises(AssertionError, match="caption 0"):
        check_png_grid(other.png, lines, captions)
    assert picture.caption == "3 samples, generated above real rows, captioned bar, square, disc"


def test_labels_without_class_names_are_numbered_and_no_labels_leave_no_caption_band():
    generated = RNG.random((2, 8, 8, 3)).astype(np.float32)
    numbered = Images(jnp.asarray(generated), labels=jnp.asarray([1, 7]))
    (picture,) = render_preview(numbered)  # a bare artifact: no class names
    check_png_grid(picture.png, [("generated", uint8(generated))], ["class 1", "class 7"])
    # Named classes name the labels they have; a label past them keeps its number.
    (named,) = render_preview(Preview(numbered, classes=("cat", "dog")))
    check_png_grid(named.png, [("generated", uint8(generated))], ["dog", "class 7"])
    (bare,) = render_preview(Images(jnp.asarray(generated)))
    check_png_grid(bare.png, [("generated", uint8(generated))], None)


def test_a_prompt_is_the_caption_wrapped_to_two_lines_and_cut_where_longer():
    generated = RNG.random((2, 16, 16, 3)).astype(np.float32)
    prompts = ("a red disc", "a very long prompt about a small green square on black")
    (picture,) = render_preview(Images(jnp.asarray(generated), prompts=prompts))
    # 10 characters of 6 pixels fit in a 64-pixel cell (a pixel of margin each side).
    wrapped = [["a red disc"], ["a very", "long pr..."]]
    assert [caption_lines(prompt, 64) for prompt in prompts] == wrapped
    check_png_grid(picture.png, [("generated", uint8(generated))], wrapped)
    with pytest.raises(AssertionError):  # the whole prompt on one line is not what is drawn
        check_png_grid(picture.png, [("generated", uint8(generated))], list(prompts))


def test_more_samples_than_a_band_holds_wrap_into_further_bands():
    generated = RNG.random((11, 4, 4, 3)).astype(np.float32)
    real = RNG.random((11, 4, 4, 3)).astype(np.float32)
    labels = jnp.asarray(RNG.integers(0, 3, 11), jnp.int32)
    (picture,) = render_preview(Preview(Images(jnp.asarray(generated), jnp.asarray(real),
                                               labels=labels), classes=CLASSES))  # fmt: skip
    captions = [CLASSES[label] for label in np.asarray(labels)]
    check_png_grid(picture.png, [("generated", uint8(generated)), ("real", uint8(real))], captions)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_every_channel_count_shows_as_rgb_grey_repeated_alpha_dropped(channels):
    generated = RNG.random((2, 5, 7, channels)).astype(np.float32)
    (picture,) = render_preview(Images(jnp.asarray(generated)))
    check_png_grid(picture.png, [("generated", uint8(generated))], None)


def test_a_clip_grid_is_one_animated_gif_its_frames_in_step_real_clips_beside():
    generated, real = _palette_clips(3, 5, 12, 10), _palette_clips(3, 5, 12, 10)
    labels = jnp.asarray([1, 1, 2], jnp.int32)
    clips = Clips(jnp.asarray(generated), jnp.asarray(real), labels=labels)
    (animation,) = render_preview(Preview(clips, classes=CLASSES))
    assert isinstance(animation, Animation) and animation.file == ("grid.gif", animation.gif)
    assert animation.frames.shape[0] == 5
    lines = [("generated", uint8(generated)), ("real", uint8(real))]
    assert check_gif_grid(animation.gif, lines, ["disc", "disc", "bar"]) == 5
    # Frames in step: frame f of the grid holds frame f of every clip, none shifted.
    shifted = [(name, np.roll(clips, 1, axis=1)) for name, clips in lines]
    with pytest.raises(AssertionError):
        check_gif_grid(animation.gif, shifted, ["disc", "disc", "bar"])


def test_a_clip_grid_of_any_colours_reads_back_through_the_gif_palette():
    generated = RNG.random((2, 3, 16, 16, 3)).astype(np.float32)
    (animation,) = render_preview(Clips(jnp.asarray(generated)))
    check_gif_grid(animation.gif, [("generated", uint8(generated))], None)


def test_one_file_per_event_and_a_preview_renders_once_for_every_tracker():
    images = Images(jnp.asarray(RNG.random((4, 16, 16, 3)), jnp.float32))
    shown = Preview(images)
    assert [name for name, _ in preview_files(shown)] == ["grid.png"]
    assert render_preview(shown) is render_preview(shown)  # the same pieces, the same bytes
    clips = Clips(jnp.asarray(RNG.random((4, 2, 16, 16, 3)), jnp.float32))
    assert [name for name, _ in preview_files(clips)] == ["grid.gif"]


def test_grid_frames_takes_lines_of_different_sizes():
    """A reference of another size (Images allows it) is enlarged by its own factor, in a
    cell as large as the largest; a line with fewer samples leaves its last cells empty."""
    small = np.full((2, 1, 4, 4, 3), 200, np.uint8)  # enlarged 16 times: 64 pixels
    large = np.full((3, 1, 32, 32, 3), 100, np.uint8)  # enlarged twice: 64 pixels
    (frame,) = grid_frames([("generated", small), ("real", large)], None)
    cell = 64 + 2  # a cell and its gap
    left = frame.shape[1] - 3 * cell  # past the header column
    assert frame.shape[0] == 2 + 2 * cell
    for column in range(3):
        at = left + column * cell
        generated = frame[2 : 2 + 64, at : at + 64]
        assert (generated == 200).all() if column < 2 else not (generated == 200).any()
        assert (frame[2 + cell : 2 + cell + 64, at : at + 64] == 100).all()
