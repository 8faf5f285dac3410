"""Generated token rows as text: each row's prompt and continuation, decoded through the
run's tokenizer (`dew.data.tokenizers._readable.readable_text`), and the Markdown page that
shows them.

A row's *prompt* is its IDs before the first generated position (the mask's first true
one), its *continuation* the generated positions; a row without a mask is all
continuation, with no prompt (so is a masked-diffusion row, generated whole). Without a
tokenizer the IDs are written as numbers joined by spaces.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from dew.data.tokenizers._protocol import Tokenizer
from dew.data.tokenizers._readable import readable_text, tokenizer_name

__all__ = ["BOUNDARY", "TextRow", "decoded_with", "markdown", "text_rows"]

BOUNDARY = "⟨|⟩"
"""Where the Markdown page shows a row's prompt end and its continuation begin."""


class TextRow(NamedTuple):
    """One generated row as text: its prompt (`None` where the row has none) and its
    continuation."""

    prompt: str | None
    continuation: str


def decoded_with(tokenizer: Tokenizer | None) -> str:
    """How the text was made: `"decoded with the tokenizer <name>"` (its file, or its
    name), or `"written as token IDs (no tokenizer)"`."""
    if tokenizer is None:
        return "written as token IDs (no tokenizer)"
    return f"decoded with the tokenizer {tokenizer_name(tokenizer)}"


def text_rows(
    tokens: np.ndarray, mask: np.ndarray | None, tokenizer: Tokenizer | None
) -> tuple[TextRow, ...]:
    """Each row of `tokens` `(rows, length)` as a `TextRow`, split by `mask` (true where a
    position was generated)."""
    rows = []
    for index, row in enumerate(np.asarray(tokens)):
        if mask is None:
            rows.append(TextRow(None, readable_text(tokenizer, row)))
            continue
        generated = np.asarray(mask[index], bool)
        first = int(np.argmax(generated)) if generated.any() else len(row)
        prompt = readable_text(tokenizer, row[:first]) if first else None
        rows.append(TextRow(prompt, readable_text(tokenizer, row[generated])))
    return tuple(rows)


def _fenced(text: str) -> str:
    """`text` in a fenced code block: shown as it is (spaces, `*`, `<`), its fence of tildes
    longer than any run of tildes in it."""
    longest = max((len(run) for run in re.findall(r"~+", text)), default=0)
    fence = "~" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def markdown(rows: tuple[TextRow, ...], tokenizer: Tokenizer | None) -> str:
    """The Markdown page of `rows`: a line saying how they were decoded, then for each row
    a heading and one code block, `prompt⟨|⟩continuation` (`prompt ⟨|⟩ continuation` for
    IDs; the continuation alone for a row with no prompt)."""
    prompted = any(row.prompt is not None for row in rows)
    shape = f"prompt {BOUNDARY} continuation" if prompted else "generated rows"
    count = f"{len(rows)} sample{'' if len(rows) == 1 else 's'}"
    lines = [f"{count} ({shape}), {decoded_with(tokenizer)}.", ""]
    # Decoded text is shown as it is; IDs keep a space either side of the boundary.
    boundary = BOUNDARY if tokenizer is not None else f" {BOUNDARY} "
    for index, row in enumerate(rows):
        text = row.continuation if row.prompt is None else row.prompt + boundary + row.continuation
        lines += [f"**row {index}**", "", _fenced(text), ""]
    return "\n".join(lines)
