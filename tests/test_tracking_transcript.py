"""dew.tracking._transcript: generated token rows as text, each row's prompt and continuation
decoded by the run's tokenizer (checked against the tokenizer's own `decode`), and the
Markdown page TensorBoard's own renderer shows as it is."""

import functools
import html
import pathlib
import sysconfig

import numpy as np
import pytest

from dew.data.tokenizers import BytesTokenizer, HFTokenizer, train_tokenizer
from dew.tracking._transcript import BOUNDARY, TextRow, markdown, text_rows

STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
TEXTS = ["The quick brown fox jumps over the lazy dog.", "def wrap(text, width=70):"]


@functools.cache
def _bpe(folder: str) -> HFTokenizer:
    out = pathlib.Path(folder) / "bpe.json"
    return train_tokenizer([STDLIB / "textwrap.py"], 300, out, progress=False)


@pytest.fixture(params=["bytes", "bpe"])
def tokenizer(request, tmp_path_factory):
    if request.param == "bytes":
        return BytesTokenizer()
    pytest.importorskip("tokenizers")
    return _bpe(str(tmp_path_factory.getbasetemp()))


def _rows(tokenizer, length):
    ids = [list(tokenizer.encode(text))[:length] for text in TEXTS]
    assert all(len(row) == length for row in ids)
    return np.array(ids, np.int64)


def test_each_row_is_its_prompt_and_continuation_as_the_tokenizer_decodes_them(tokenizer):
    tokens = _rows(tokenizer, 8)
    starts = [3, 5]  # where each row's generated positions begin
    mask = np.arange(8)[None, :] >= np.array(starts)[:, None]
    rows = text_rows(tokens, mask, tokenizer)
    assert rows == tuple(
        TextRow(tokenizer.decode(row[:start].tolist()), tokenizer.decode(row[start:].tolist()))
        for row, start in zip(tokens, starts, strict=True)
    )
    assert all(row.prompt and row.continuation for row in rows)


def test_rows_generated_whole_or_without_a_mask_have_no_prompt(tokenizer):
    tokens = _rows(tokenizer, 6)
    whole = text_rows(tokens, np.ones(tokens.shape, bool), tokenizer)  # masked diffusion
    assert whole == text_rows(tokens, None, tokenizer)
    assert whole == tuple(TextRow(None, tokenizer.decode(row.tolist())) for row in tokens)


def test_without_a_tokenizer_the_text_is_the_ids_and_odd_ids_are_marked_not_fatal():
    tokens = np.array([[3, 1, 4, 1, 5]])
    assert text_rows(tokens, np.array([[0, 0, 1, 1, 1]], bool), None) == (TextRow("3 1", "4 1 5"),)
    # A model may hold more IDs than its tokenizer (vocab_size padded up) and sample one.
    tokens = np.array([[104, 105, 256, 33, 300]])
    assert text_rows(tokens, None, BytesTokenizer()) == (TextRow(None, "hi<eos>!<id 300>"),)


def test_the_markdown_page_shows_each_row_verbatim_where_tensorboard_renders_it():
    plugin_util = pytest.importorskip("tensorboard.plugin_util")
    tricky = "a *b* <i>c</i> ``` d ~~~~ e\n  f"  # emphasis, HTML, fences, line breaks, spaces
    rows = (TextRow("The prompt", " " + tricky), TextRow(None, "alone"))
    page = markdown(rows, BytesTokenizer())
    assert page.splitlines()[0] == (
        f"2 samples (prompt {BOUNDARY} continuation), decoded with the tokenizer bytes."
    )
    rendered = plugin_util.markdown_to_safe_html(page)
    for shown in ("The prompt" + BOUNDARY + " " + tricky, "alone"):
        assert f"<pre><code>{html.escape(shown, quote=False)}\n</code></pre>" in rendered
    assert "<em>" not in rendered and "<i>" not in rendered
    assert "\n~~~~~text\n" in page  # a fence longer than the text's own run of tildes
    assert markdown((TextRow(None, "1 2"),), None).splitlines()[0] == (
        "1 sample (generated rows), written as token IDs (no tokenizer)."
    )
