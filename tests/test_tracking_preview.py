"""dew.tracking._preview: previews render once, into neutral pieces every tracker maps."""

import ast
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.artifacts import Artifact, Clips, Images, Representations, TokenRows, TokenScores
from dew.tracking import preview_files
from dew.tracking._preview import (
    Animation,
    Picture,
    Spread,
    TokenTable,
    render_preview,
)
from dew.tracking._render import gif_bytes, histogram, png_bytes, to_uint8

RNG = np.random.default_rng(0)
IMAGES = Images(jnp.asarray(RNG.random((2, 4, 3, 3)), jnp.float32), prompts=("a", "b"))
CLIPS = Clips(jnp.asarray(RNG.random((2, 3, 4, 3, 1)), jnp.float32))
TOKENS = TokenRows(jnp.asarray([[1, 2, 3], [4, 5, 6]]), jnp.asarray([[True, False, True]] * 2))
FEATURES = Representations(jnp.asarray(RNG.normal(size=(6, 4)), jnp.float32))
TRACKING = pathlib.Path(__file__).parents[1] / "src" / "dew" / "tracking"


class Masks(Artifact):
    values: jax.Array


def test_images_and_clips_render_to_one_encoded_piece_per_row():
    pictures = render_preview(IMAGES)
    assert [type(piece) for piece in pictures] == [Picture, Picture]
    for index, piece in enumerate(pictures):
        pixels = to_uint8(IMAGES.generated)[index]
        np.testing.assert_array_equal(piece.pixels, pixels)
        assert piece.png == png_bytes(pixels)
        assert (piece.part, piece.caption, piece.file) == (
            str(index),
            "ab"[index],
            (f"{index}.png", piece.png),
        )
    animations = render_preview(CLIPS)
    assert [type(piece) for piece in animations] == [Animation, Animation]
    for index, piece in enumerate(animations):
        assert piece.gif == gif_bytes(to_uint8(CLIPS.generated)[index])
        assert (piece.part, piece.file) == (str(index), (f"{index}.gif", piece.gif))


def test_token_rows_and_representations_render_to_one_table_and_one_histogram():
    (table,) = render_preview(TOKENS)
    assert isinstance(table, TokenTable) and table.part == "tokens"
    assert json.loads(table.file[1]) == {
        "tokens": [[1, 2, 3], [4, 5, 6]],
        "mask": [[True, False, True]] * 2,
    }
    (spread,) = render_preview(FEATURES)
    assert isinstance(spread, Spread) and spread.part == "spread"
    assert spread.summary == histogram(FEATURES.features)
    assert spread.file == ("histogram.json", json.dumps(histogram(FEATURES.features)).encode())


@pytest.mark.parametrize("value", [IMAGES, CLIPS, TOKENS, FEATURES], ids=type)
def test_preview_files_are_the_pieces_files(value):
    assert preview_files(value) == [piece.file for piece in render_preview(value)]


def test_each_tracker_words_a_refused_preview_as_it_always_did():
    from dew.tracking import tensorboard, wandb
    from dew.tracking._preview import Refusal

    scores = TokenScores(jnp.ones((1, 2)), jnp.ones((1, 2)))
    masks = Masks(jnp.ones((2, 3)))
    takes = "take Images, Clips, TokenRows or Representations previews."
    expected = {
        Refusal(): (
            f"TokenScores has no preview form; trackers {takes}",
            f"no preview renderer for Masks; trackers {takes}",
        ),
        tensorboard._REFUSAL: (
            "TokenScores has no summary form; TensorBoardTracker takes Images, Clips, "
            "TokenRows or Representations previews.",
            "no summary form for Masks artifact 'masks'; TensorBoardTracker takes Images, "
            "Clips, TokenRows or Representations previews.",
        ),
        wandb._REFUSAL: (
            "TokenScores has no preview form; WandbTracker takes Images, Clips, TokenRows or "
            "Representations previews.",
            "no preview form for Masks; WandbTracker takes Images, Clips, TokenRows or "
            "Representations previews.",
        ),
    }
    for refusal, (for_scores, for_masks) in expected.items():
        for value, message in ((scores, for_scores), (masks, for_masks)):
            with pytest.raises(TypeError) as caught:
                render_preview(value, name="masks", refusal=refusal)
            assert str(caught.value) == message


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
