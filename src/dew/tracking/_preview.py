"""Previews rendered once into neutral pieces, which each tracker maps to its own API.

`render_preview` is the one place that decides how a preview is shown: `Images` become
one labelled grid (`Picture`, a PNG; the layout is `dew.tracking._grid`'s), `Clips` one
animated grid (`Animation`, a GIF), `TokenRows` their IDs (`TokenTable`) and their text
(`Transcript`, a Markdown page: `dew.tracking._transcript`), `Representations` one
`Spread` histogram. A `Preview` carries an artifact with what names its rows, the class
names and the tokenizer of the data (`Trainer.fit` logs its previews so); a bare artifact
is shown with label numbers and token IDs. Each piece knows the file it is stored as
(`preview_files`: what the local journal and MLflow store, under `preview_folder`) and
the last segment of its tag (`dew.naming.artifact_tag`); TensorBoard and W&B map the
pieces to their own summaries and media. A preview is logged under a preview name,
`stage/split/name` (`dew.naming.preview_name`), so two stages' previews never share a
tag or a folder; `check_artifact_name` is the one check of an artifact's name, which
`AbstractRunTracker.log_artifact` makes for every tracker before it hands a preview's
`Pieces` (rendered when first read) to the tracker's `_log_preview`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any, NamedTuple

import numpy as np

from dew._run_folder import PREVIEWS
from dew.artifacts import Artifact, Clips, Images, Representations, TokenRows, TokenScores
from dew.data.tokenizers._protocol import Tokenizer
from dew.data.tokenizers._readable import tokenizer_name
from dew.naming import check_index, check_path_segment, parse_preview_name
from dew.tracking._grid import grid_frames
from dew.tracking._render import gif_bytes, histogram, png_bytes, to_uint8
from dew.tracking._transcript import TextRow, markdown, text_rows

__all__ = [
    "PREVIEWS",
    "PREVIEW_TYPES",
    "Animation",
    "Piece",
    "Picture",
    "Pieces",
    "Preview",
    "Spread",
    "TokenTable",
    "Transcript",
    "check_artifact_name",
    "is_preview",
    "preview_files",
    "preview_folder",
    "refusal",
    "render_preview",
]

PREVIEW_TYPES = (Images, Clips, TokenRows, Representations)
"""The artifacts that have a preview form."""
_PREVIEWS = "Images, Clips, TokenRows or Representations previews"


@dataclasses.dataclass(frozen=True, eq=False)  # the same preview is the same object
class Preview:
    """A preview artifact and what names its rows: how `Trainer.fit` logs a preview, so
    that every tracker shows class names and decoded text.

    - `artifact`: `Images`, `Clips`, `TokenRows` or `Representations`.
    - `classes`: the class names, label `i` naming `classes[i]` (`dew.data.Dataset.classes`):
      the captions of a grid whose artifact holds `labels` (without them, `class <i>`).
    - `tokenizer`: the `dew.data.tokenizers.Tokenizer` that decodes `TokenRows` to text
      (`dew.data.Dataset.tokenizer`; without one, the text is the IDs).

    A tracker renders it once (`pieces`), however many trackers show it.

    **Raises:** `TypeError` for an `artifact` that is not a dew artifact, `classes` that
    are not a non-empty tuple of names, or a `tokenizer` that is not a `Tokenizer`.
    """

    artifact: Artifact
    classes: tuple[str, ...] | None = None
    tokenizer: Tokenizer | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.artifact, Artifact):
            raise TypeError(
                f"Preview.artifact must be a dew artifact ({_PREVIEWS}), got "
                f"{type(self.artifact).__name__}."
            )
        classes = self.classes
        if classes is not None and (
            not isinstance(classes, tuple)
            or not classes
            or not all(isinstance(name, str) for name in classes)
        ):
            raise TypeError(
                f"Preview.classes must be None or a non-empty tuple of class names, got "
                f"{classes!r}."
            )
        if self.tokenizer is not None and not isinstance(self.tokenizer, Tokenizer):
            raise TypeError(
                "Preview.tokenizer must be None or a dew.data.tokenizers.Tokenizer, got "
                f"{type(self.tokenizer).__name__}."
            )

    @functools.cached_property
    def pieces(self) -> tuple[Piece, ...]:
        """The neutral pieces the preview renders to (`render_preview`), rendered once."""
        return _pieces(self)


def is_preview(value: Any) -> bool:
    """Whether a tracker shows `value` as a preview (or refuses it as one): an artifact, or
    a `Preview` of one."""
    return isinstance(value, Artifact | Preview)


def check_artifact_name(name: Any, value: Any) -> None:
    """Check the name `value` is logged under, before anything is written.

    A preview (`PREVIEW_TYPES`, or a `Preview`) is logged under a preview name,
    `stage/split/name` (`dew.naming.preview_name`); a record or another value under a
    path segment (`dew.naming.check_path_segment`). Another artifact (`TokenScores`)
    passes unchecked: the tracker refuses it for having no preview form.

    **Raises:** `ValueError` naming the bad name and the rule, `TypeError` for a name
    that is not a string.
    """
    if isinstance(value, (*PREVIEW_TYPES, Preview)):
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
    """The grid of a preview's images: its uint8 `(height, width, 3)` pixels, their PNG,
    and a caption saying what it shows."""

    pixels: np.ndarray
    png: bytes
    caption: str

    @property
    def part(self) -> str:
        """The last segment of the piece's tag."""
        return "grid"

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `grid.png`."""
        return "grid.png", self.png


class Animation(NamedTuple):
    """The animated grid of a preview's clips: its uint8 `(frames, height, width, 3)`
    frames, their looping animated GIF, and a caption saying what it shows."""

    frames: np.ndarray
    gif: bytes
    caption: str

    @property
    def part(self) -> str:
        """The last segment of the piece's tag."""
        return "grid"

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `grid.gif`."""
        return "grid.gif", self.gif


class TokenTable(NamedTuple):
    """Generated token rows: `(rows, length)` token IDs, where given the mask of generated
    positions, each row's text (`TextRow`) and the tokenizer that made it (`None`: the
    text is the IDs)."""

    tokens: np.ndarray
    mask: np.ndarray | None
    text: tuple[TextRow, ...]
    tokenizer: str | None

    @property
    def part(self) -> str:
        """The last segment of the piece's tag."""
        return "tokens"

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `tokens.json`, the token rows, the mask, and
        beside them each row's `prompt` and `continuation` text and the `tokenizer`."""
        rows: dict[str, Any] = {"tokens": self.tokens.tolist()}
        if self.mask is not None:
            rows["mask"] = self.mask.tolist()
        rows["text"] = [row._asdict() for row in self.text]
        rows["tokenizer"] = self.tokenizer
        return "tokens.json", json.dumps(rows, ensure_ascii=False).encode()


class Transcript(NamedTuple):
    """Generated token rows as a Markdown page (`dew.tracking._transcript.markdown`)."""

    markdown: str

    @property
    def part(self) -> str:
        """The last segment of the piece's tag."""
        return "text"

    @property
    def file(self) -> tuple[str, bytes]:
        """The file the piece is stored as: `text.md`."""
        return "text.md", self.markdown.encode()


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


Piece = Picture | Animation | TokenTable | Transcript | Spread


def refusal(
    value: Any, name: str | None = None, *, taker: str = "trackers take", form: str = "preview"
) -> TypeError:
    """The `TypeError` refusing `value`, an artifact with no preview form, logged as `name`.

    `taker` says who takes which previews (`"trackers take"`, `"LocalTracker takes"`), `form`
    the word for what `value` lacks (`"preview"`, TensorBoard's `"summary"`):
    `TokenScores has no preview form; LocalTracker takes Images, Clips, TokenRows or
    Representations previews.`, and for another type `no preview form for Masks artifact
    'masks'; ...`.
    """
    if isinstance(value, TokenScores):
        opening = f"TokenScores has no {form} form"
    else:
        logged = "" if name is None else f" artifact {name!r}"
        opening = f"no {form} form for {type(value).__name__}{logged}"
    return TypeError(f"{opening}; {taker} {_PREVIEWS}.")


class Pieces:
    """A preview as it was logged (`value`: an artifact, or a `Preview` of one) and the pieces
    it renders to (`render_preview`), rendered when first read, once: iterate over them, index
    them, or take their `files`.

    `AbstractRunTracker.log_artifact` hands them to a tracker's `_log_preview`. A tracker that
    shows previews reads the pieces before it writes anything: the first read refuses an
    artifact with no preview form (`refusal`, worded by `taker` and `form`). One that keeps or
    forwards what it is told (`InMemoryTracker`, `Trackers`) takes `value` and renders nothing.
    (Not a `Sequence`: a runtime type check of one reads an item, which would render.)
    """

    def __init__(
        self,
        value: Any,
        name: str | None = None,
        *,
        taker: str = "trackers take",
        form: str = "preview",
    ) -> None:
        self.value = value
        self._name, self._taker, self._form = name, taker, form

    @functools.cached_property
    def _rendered(self) -> tuple[Piece, ...]:
        value = self.value
        artifact = value.artifact if isinstance(value, Preview) else value
        if not isinstance(artifact, PREVIEW_TYPES):
            raise refusal(artifact, self._name, taker=self._taker, form=self._form)
        return (value if isinstance(value, Preview) else Preview(artifact)).pieces

    def __iter__(self) -> Iterator[Piece]:
        return iter(self._rendered)

    def __getitem__(self, index: int) -> Piece:
        return self._rendered[index]

    def __len__(self) -> int:
        return len(self._rendered)

    @property
    def files(self) -> list[tuple[str, bytes]]:
        """The files the pieces are stored as, `(name, content)` pairs (`preview_files`)."""
        return [piece.file for piece in self]


def _captions(artifact: Images | Clips, classes: tuple[str, ...] | None) -> list[str] | None:
    """A caption per generated row: its prompt, else its label's class name (`class <i>`
    where no name is known), else none."""
    prompts = getattr(artifact, "prompts", None)
    if prompts is not None:
        return list(prompts)
    if artifact.labels is None:
        return None
    labels = [int(label) for label in np.asarray(artifact.labels).reshape(-1)]
    named = classes or ()
    return [named[label] if 0 <= label < len(named) else f"class {label}" for label in labels]


def _grid(artifact: Images | Clips, classes: tuple[str, ...] | None) -> tuple[np.ndarray, str]:
    """The grid frames of `artifact` and the caption saying what they show."""

    def cells(values: Any) -> np.ndarray:
        pixels = to_uint8(values)
        return pixels[:, None] if isinstance(artifact, Images) else pixels

    lines = [("generated", cells(artifact.generated))]
    if artifact.reference is not None:
        lines.append(("real", cells(artifact.reference)))
    captions = _captions(artifact, classes)
    frames = grid_frames(lines, captions)
    shown = " above ".join(name for name, _ in lines) + " rows"
    labelled = f", captioned {', '.join(captions)}" if captions else ""
    return frames, f"{len(lines[0][1])} samples, {shown}{labelled}"


def _pieces(preview: Preview) -> tuple[Piece, ...]:
    value = preview.artifact
    if isinstance(value, Images):
        frames, caption = _grid(value, preview.classes)
        return (Picture(frames[0], png_bytes(frames[0]), caption),)
    if isinstance(value, Clips):
        frames, caption = _grid(value, preview.classes)
        return (Animation(frames, gif_bytes(frames), caption),)
    if isinstance(value, TokenRows):
        tokens = np.asarray(value.tokens)
        mask = None if value.mask is None else np.asarray(value.mask)
        rows = text_rows(tokens, mask, preview.tokenizer)
        name = None if preview.tokenizer is None else tokenizer_name(preview.tokenizer)
        return (
            TokenTable(tokens, mask, rows, name),
            Transcript(markdown(rows, preview.tokenizer)),
        )
    if not isinstance(value, Representations):  # `Pieces` refuses it before it gets here
        raise refusal(value)
    return (Spread(histogram(value.features)),)


def render_preview(value: Any, *, name: str | None = None) -> tuple[Piece, ...]:
    """The neutral pieces a preview renders to.

    **Arguments:**

    - `value`: `Images`, `Clips`, `TokenRows` or `Representations`, or a `Preview` of one
      (rendered once however often it is asked).
    - `name`: the artifact's name, for the error.

    **Raises:** `TypeError` (`refusal`) for `TokenScores`, which has no preview form, and for
    any other value.
    """
    return Pieces(value, name)._rendered  # a `Preview`'s own pieces: rendered once


def preview_files(value: Any) -> list[tuple[str, bytes]]:
    """The files a preview renders to, as `(name, content)` pairs.

    `Images` become one labelled grid, `grid.png`; `Clips` one animated grid, `grid.gif`;
    `TokenRows` `tokens.json` (the IDs, the mask and each row's text) and `text.md` (the
    text as a Markdown page); `Representations` `histogram.json` of their per-dimension
    spread. `value` is an artifact or a `Preview` of one; `TokenScores` has no preview
    form and raises.
    """
    return [piece.file for piece in render_preview(value)]
