"""dew.tracking._preview: previews render once, into neutral pieces every tracker maps; a
`Preview` carries what names its rows."""

import ast
import importlib.util
import io
import json
import pathlib

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from _grids import gif_colours

from dew.artifacts import Artifact, Clips, Images, Representations, TokenRows, TokenScores
from dew.data.tokenizers import BytesTokenizer
from dew.telemetry.records import FitEnded
from dew.tracking import AbstractRunTracker, Preview, preview_files
from dew.tracking._preview import (
    Animation,
    Picture,
    Spread,
    TokenTable,
    Transcript,
    render_preview,
)
from dew.tracking._render import gif_bytes, histogram, png_bytes

RNG = np.random.default_rng(0)
IMAGES = Images(jnp.asarray(RNG.random((2, 4, 3, 3)), jnp.float32), prompts=("a", "b"))
CLIPS = Clips(jnp.asarray(RNG.random((2, 3, 4, 3, 1)), jnp.float32))
TOKENS = TokenRows(jnp.asarray([[1, 2, 3], [4, 5, 6]]), jnp.asarray([[False, True, True]] * 2))
FEATURES = Representations(jnp.asarray(RNG.normal(size=(6, 4)), jnp.float32))
TRACKING = pathlib.Path(__file__).parents[1] / "src" / "dew" / "tracking"


class Masks(Artifact):
    values: jax.Array


def test_images_and_clips_render_to_one_encoded_grid():
    (picture,) = render_preview(IMAGES)
    assert isinstance(picture, Picture) and picture.part == "grid"
    assert picture.png == png_bytes(picture.pixels) and picture.file == ("grid.png", picture.png)
    assert picture.caption == "2 samples, generated rows, captioned a, b"
    (animation,) = render_preview(CLIPS)
    assert isinstance(animation, Animation) and animation.part == "grid"
    assert animation.gif == gif_bytes(animation.frames)
    assert animation.file == ("grid.gif", animation.gif)
    assert animation.frames.shape[0] == CLIPS.generated.shape[1]  # one grid frame a frame


def test_token_rows_render_to_their_ids_and_text_and_representations_to_a_histogram():
    table, transcript = render_preview(TOKENS)
    assert isinstance(table, TokenTable) and table.part == "tokens"
    assert isinstance(transcript, Transcript) and transcript.part == "text"
    # No tokenizer: the text is the IDs, split where the mask says generation began.
    assert json.loads(table.file[1]) == {
        "tokens": [[1, 2, 3], [4, 5, 6]],
        "mask": [[False, True, True]] * 2,
        "text": [{"prompt": "1", "continuation": "2 3"}, {"prompt": "4", "continuation": "5 6"}],
        "tokenizer": None,
    }
    assert transcript.file == ("text.md", transcript.markdown.encode())
    (spread,) = render_preview(FEATURES)
    assert isinstance(spread, Spread) and spread.part == "spread"
    assert spread.summary == histogram(FEATURES.features)
    assert spread.file == ("histogram.json", json.dumps(histogram(FEATURES.features)).encode())


def test_a_preview_carries_an_artifact_with_class_names_and_a_tokenizer(monkeypatch):
    shown = Preview(IMAGES, classes=("disc", "bar"), tokenizer=BytesTokenizer())
    assert shown.artifact is IMAGES and shown.classes == ("disc", "bar")
    assert preview_files(shown) == [piece.file for piece in render_preview(shown)]
    # Its own checks, as a user without the tests' runtime type checker meets them.
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)
    for bad, message in [
        ({"artifact": "samples"}, "Preview.artifact must be a dew artifact (Images, Clips, "
         "TokenRows or Representations previews), got str."),
        ({"artifact": IMAGES, "classes": ["disc"]}, "Preview.classes must be None or a non-empty "
         "tuple of class names, got ['disc']."),
        ({"artifact": IMAGES, "classes": ()}, "Preview.classes must be None or a non-empty "
         "tuple of class names, got ()."),
        ({"artifact": IMAGES, "tokenizer": "bytes"}, "Preview.tokenizer must be None or a "
         "dew.data.tokenizers.Tokenizer, got str."),
    ]:  # fmt: skip
        with pytest.raises(TypeError) as caught:
            Preview(**bad)
        assert str(caught.value) == message


@pytest.mark.parametrize("value", [IMAGES, CLIPS, TOKENS, FEATURES], ids=type)
def test_preview_files_are_the_pieces_files(value):
    assert preview_files(value) == [piece.file for piece in render_preview(value)]


class Shows(AbstractRunTracker):
    """A tracker that shows previews: it reads their pieces, and keeps what it was told."""

    def __init__(self):
        self.shown = []

    def _describe(self):
        return "Shows"

    def _log_params(self, values):
        pass

    def _log_metrics(self, values, *, step):
        pass

    def _log_record(self, name, record, *, step):
        self.shown.append(("record", name, step, record))

    def _log_preview(self, name, pieces, *, step):
        self.shown.append(("preview", name, step, tuple(pieces)))

    def _log_value(self, name, value, *, step):
        self.shown.append(("value", name, step, value))

    def _close(self):
        pass


def test_each_tracker_words_a_refused_preview_in_its_own_terms(tmp_path):
    """`log_artifact` refuses an artifact with no preview form for every tracker, naming the
    tracker (its class) and what it has no form of (TensorBoard: a summary)."""
    scores = TokenScores(jnp.ones((1, 2)), jnp.ones((1, 2)))
    masks = Masks(jnp.ones((2, 3)))
    takes = "Images, Clips, TokenRows or Representations previews."
    shows = Shows()
    reports = {  # render_preview and preview_files word it outside any tracker
        "render_preview": lambda value: render_preview(value, name="masks"),
        "Shows": lambda value: shows.log_artifact("masks", value, step=0),
    }
    expected = {
        "render_preview": (
            f"TokenScores has no preview form; trackers take {takes}",
            f"no preview form for Masks artifact 'masks'; trackers take {takes}",
        ),
        "Shows": (
            f"TokenScores has no preview form; Shows takes {takes}",
            f"no preview form for Masks artifact 'masks'; Shows takes {takes}",
        ),
    }
    if importlib.util.find_spec("tensorboard") is not None:
        from dew.tracking import TensorBoardTracker

        board = TensorBoardTracker(tmp_path)
        reports["TensorBoardTracker"] = lambda value: board.log_artifact("masks", value, step=0)
        expected["TensorBoardTracker"] = (
            "TokenScores has no summary form; TensorBoardTracker takes Images, Clips, "
            "TokenRows or Representations previews.",
            "no summary form for Masks artifact 'masks'; TensorBoardTracker takes Images, "
            "Clips, TokenRows or Representations previews.",
        )
    for reporter, (for_scores, for_masks) in expected.items():
        for value, message in ((scores, for_scores), (masks, for_masks)):
            with pytest.raises(TypeError) as caught:
                reports[reporter](value)
            assert str(caught.value) == message
    assert shows.shown == []
    if "TensorBoardTracker" in reports:
        board.close()
    with pytest.raises(TypeError, match=r"^TokenScores has no preview form; trackers take"):
        preview_files(scores)


def test_a_tracker_gets_each_artifact_sorted_once_with_its_name_and_step_checked():
    tracker = Shows()
    record = FitEnded(status="completed", step=3)
    tracker.log_artifact("fit_ended", record, step=np.int64(3))
    tracker.log_artifact("lm/validation/samples", IMAGES, step=4)
    tracker.log_artifact("notes", {"text": "x"})
    (kind, name, step, seen), preview, value = tracker.shown
    assert (kind, name, step, type(step), seen) == ("record", "fit_ended", 3, int, record)
    assert preview[:3] == ("preview", "lm/validation/samples", 4)
    assert [piece.file for piece in preview[3]] == preview_files(IMAGES)
    assert value == ("value", "notes", None, {"text": "x"})
    with pytest.raises(ValueError, match="a preview's name is stage/split/name, got 'samples'"):
        tracker.log_artifact("samples", IMAGES, step=1)
    with pytest.raises(ValueError, match="artifact name 'a/b' may not contain '/'"):
        tracker.log_artifact("a/b", record, step=1)
    with pytest.raises(TypeError, match="step"):
        tracker.log_artifact("notes", "x", step=1.5)
    assert len(tracker.shown) == 3  # refused before any hook ran


def _imported_names(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "dew.artifacts":
            names.update(alias.name for alias in node.names)
    return names


def test_only_the_preview_module_knows_the_preview_artifact_types():
    kinds = {"Images", "Clips", "TokenRows", "Representations", "TokenScores"}
    knowing = sorted(path.name for path in TRACKING.glob("*.py") if _imported_names(path) & kinds)
    assert knowing == ["_preview.py"]


def _decoded(content: bytes, form: str) -> list[np.ndarray]:
    """Every frame of a PNG or GIF as Pillow reads it back (RGB frames for a GIF)."""
    from PIL import Image, ImageSequence

    image = Image.open(io.BytesIO(content))
    assert image.format == form
    if form == "PNG":
        return [np.asarray(image)]
    return [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]


@pytest.mark.parametrize("channels", [None, 1, 2, 3, 4])
def test_a_png_reads_back_through_pillow_as_the_image(channels):
    shape = (5, 7) if channels is None else (5, 7, channels)
    image = RNG.integers(0, 256, shape, dtype=np.uint8)
    (decoded,) = _decoded(png_bytes(image), "PNG")
    assert decoded.shape == (5, 7, channels)[: 2 if channels in (None, 1) else 3]
    assert np.array_equal(decoded.reshape(image.shape), image)
    with pytest.raises(ValueError, match=r"a PNG needs 1 .* channels, got 5"):
        png_bytes(np.zeros((2, 2, 5), np.uint8))


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_a_gif_reads_back_through_pillow_as_its_palette_shows_the_frames(channels):
    frames = RNG.integers(0, 256, (3, 6, 5, channels), dtype=np.uint8)
    decoded = _decoded(gif_bytes(frames, frame_ms=70), "GIF")
    colour = frames[..., :3] if channels in (3, 4) else np.repeat(frames[..., :1], 3, axis=-1)
    # Grey keeps every level; colour shows 8 levels of red and green and 4 of blue.
    expected = gif_colours(colour) if channels in (3, 4) else colour
    assert len(decoded) == 3 and all(map(np.array_equal, decoded, expected))
    from PIL import Image

    shown = Image.open(io.BytesIO(gif_bytes(frames, frame_ms=70)))
    assert (shown.info["loop"], shown.info["duration"]) == (0, 70)


def test_a_gif_of_a_clip_that_stands_still_is_one_frame_for_the_whole_time():
    frames = np.repeat(RNG.integers(0, 256, (1, 4, 4, 3), dtype=np.uint8), 4, axis=0)
    from PIL import Image

    shown = Image.open(io.BytesIO(gif_bytes(frames)))
    assert (shown.n_frames, shown.info["duration"]) == (1, 400)
    assert np.array_equal(np.asarray(shown.convert("RGB")), gif_colours(frames[0]))
    with pytest.raises(ValueError, match=r"a GIF needs frames shaped .* got \(0, 4, 4, 3\)"):
        gif_bytes(frames[:0])
