"""Previews rendered once into neutral pieces, which each tracker maps to its own API.

`render_preview` is the one place that decides how an artifact is shown: `Images`
become one `Picture` (PNG) per generated row, `Clips` one `Animation` (GIF) per
row, `TokenRows` one `TokenTable`, `Representations` one `Spread` histogram.
Each piece knows the file it is stored as (`preview_files`: what the local journal
and MLflow store, under `preview_folder`) and the last segment of its tag
(`dew.naming.artifact_tag`); TensorBoard and W&B map the pieces to their own
summaries and media. A preview is logged under a preview name,
`stage/split/name` (`dew.naming.preview_name`), so two stages' previews never
share a tag or a folder; `check_artifact_name` is the one check of an artifact's
name every tracker makes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import PurePosixPath
from typing import Any, NamedTuple

import numpy as np

from dew.artifacts import Artifact, Clips, Images, Representations, TokenRows, TokenScores
from dew.naming import check_index, check_path_segment, parse_preview_name
from dew.tracking._render import gif_bytes, histogram, png_bytes, to_uint8

__all__ = [
    "PREVIEWS",
    "PREVIEW_TYPES",
    "Animation",
    "Piece",
    "Picture",
    "Refusal",
    "Spread",
    "TokenTable",
    "check_artifact_name",
    "preview_files",
    "preview_folder",
    "render_preview",
]

PREVIEWS = "previews"
"""The folder under which the local journal and MLflow store preview files."""
PREVIEW_TYPES = (Images, Clips, TokenRows, Representations)
"""The artifacts that have a preview form."""
_PREVIEWS = "Images, Clips, TokenRows or Representations previews"


def check_artifact_name(name: Any, value: Any) -> None:
    """Check the name `value` is logged under, before anything is written.

    A preview (`PREVIEW_TYPES`) is logged under a preview name, `stage/split/name`
    (`dew.naming.preview_name`); a record or another value under a path segment
    (`dew.naming.check_path_segment`). Another artifact (`TokenScores`) passes
    unchecked: the tracker refuses it for having no preview form.

    **Raises:** `ValueError` naming the bad name and the rule, `TypeError` for a name
    that is not a string.
    """
    if isinstance(value, PREVIEW_TYPES):
        parse_preview_name(name)
    elif not isinstance(value, Artifact):
        check_path_segment("artifact name", name)


def preview_folder(name: str, step: Any) -> PurePosixPath:
    """`previews/<stage>/<split>/<name>/<step>`: where the files of the preview logged as
    `name` (a preview name) go (`none` for `step=None`), relative to a run's folder or
    an MLflow run's artifacts."""
    parsed = parse_preview_name(name)
    shown = "none" if step is None else str(check_index("step", step))
    return PurePosixPath(PREVIEWS, parsed.stage, parsed.split.value, parsed.name, shown)


class Picture(NamedTuple):
    """One generated image: its row, its uint8 `(height, width, channels)` pixels, the
    PNG of them, and its prompt (`None` without one)."""

    index: int
    pixels: np.ndarray
    png: bytes
    caption: str | None

    @property
    def part(self) -> str:
        """The last segment of the piece's tag: the row."""
        return str(self.index)

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `<row>.png`."""
        return f"{self.part}.png", self.png


class Animation(NamedTuple):
    """One generated clip: its row, its uint8 `(frames, height, width, channels)`
    frames and the looping animated GIF of them."""

    index: int
    frames: np.ndarray
    gif: bytes

    @property
    def part(self) -> str:
        """The last segment of the piece's tag: the row."""
        return str(self.index)

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `<row>.gif`."""
        return f"{self.part}.gif", self.gif


class TokenTable(NamedTuple):
    """Generated token rows: `(rows, length)` token IDs and, where given, the mask of
    generated positions."""

    tokens: np.ndarray
    mask: np.ndarray | None

    @property
    def part(self) -> str:
        """The last segment of the piece's tag."""
        return "tokens"

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `tokens.json`, the token rows and the mask."""
        rows = {"tokens": self.tokens.tolist()}
        if self.mask is not None:
            rows["mask"] = self.mask.tolist()
        return "tokens.json", json.dumps(rows).encode()


class Spread(NamedTuple):
    """The histogram of per-dimension spread of representations
    (`dew.tracking._render.histogram`)."""

    summary: dict[str, Any]

    @property
    def part(self) -> str:
        """The last segment of the piece's tag."""
        return "spread"

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `histogram.json`."""
        return "histogram.json", json.dumps(self.summary).encode()


Piece = Picture | Animation | TokenTable | Spread


@dataclasses.dataclass(frozen=True)
class Refusal:
    """How a tracker words a preview it cannot show.

    - `takes`: who takes which previews (`"trackers take"`).
    - `form`: the word for what `TokenScores` lacks (`"preview"`, `"summary"`).
    - `unknown`: the opening for any other value; `{kind}` is its type's name and
      `{name}` the artifact's name.
    """

    takes: str = "trackers take"
    form: str = "preview"
    unknown: str = "no preview renderer for {kind}"

    def error(self, value: Any, name: str | None) -> TypeError:
        """The `TypeError` refusing `value`, logged as `name`."""
        if isinstance(value, TokenScores):
            opening = f"TokenScores has no {self.form} form"
        else:
            opening = self.unknown.format(kind=type(value).__name__, name=repr(name))
        return TypeError(f"{opening}; {self.takes} {_PREVIEWS}.")


def render_preview(
    value: Any, *, name: str | None = None, refusal: Refusal = Refusal()
) -> tuple[Piece, ...]:
    """The neutral pieces a preview artifact renders to.

    **Arguments:**

    - `value`: `Images`, `Clips`, `TokenRows` or `Representations`.
    - `name`: the artifact's name, for the error.
    - `refusal`: how the error is worded.

    **Raises:** `TypeError` (worded by `refusal`) for `TokenScores`, which has no
    preview form, and for any other value.
    """
    if isinstance(value, Images):
        pixels = to_uint8(value.generated)
        prompts = value.prompts or (None,) * len(pixels)
        return tuple(
            Picture(index, image, png_bytes(image), prompt)
            for index, (image, prompt) in enumerate(zip(pixels, prompts, strict=True))
        )
    if isinstance(value, Clips):
        videos = to_uint8(value.generated)
        return tuple(
            Animation(index, video, gif_bytes(video)) for index, video in enumerate(videos)
        )
    if isinstance(value, TokenRows):
        mask = None if value.mask is None else np.asarray(value.mask)
        return (TokenTable(np.asarray(value.tokens), mask),)
    if isinstance(value, Representations):
        return (Spread(histogram(value.features)),)
    raise refusal.error(value, name)


def preview_files(value: Any) -> list[tuple[str, bytes]]:
    """The files a preview artifact renders to, as `(suffix, content)` pairs.

    `Images` become one PNG per generated row, `Clips` one animated GIF per row,
    `TokenRows` one JSON file of token rows, `Representations` one JSON histogram
    of their per-dimension spread. `TokenScores` has no preview form and raises.
    """
    return [piece.file for piece in render_preview(value)]
