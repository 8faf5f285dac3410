"""The CLIP tokenizer on IDs derived by hand from the vocabulary file dew ships (parity with
open_clip's own tokenizer is in tests/parity/test_clip_parity.py).

How the IDs below follow from `bpe_simple_vocab_16e6.txt.gz`: the vocabulary is the 256 byte
symbols (printable bytes from "!" first, so a printable ASCII character c is ID ord(c) - 33),
the same 256 with "</w>" (a word's last symbol: ID 256 + ord(c) - 33), then one ID per merge
line in file order (ID 512 + line - 1; line 0 is the header), then <start_of_text> 49406 and
<end_of_text> 49407."""

import gzip
import hashlib
import sys

import numpy as np
import pytest

from dew.nn.clip import END_OF_TEXT, START_OF_TEXT, VOCABULARY_PATH, CLIPTokenizer, tokenize

pytest.importorskip("ftfy")
pytest.importorskip("regex")


@pytest.fixture(scope="module")
def merges():
    return gzip.decompress(VOCABULARY_PATH.read_bytes()).decode("utf-8").split("\n")


def _word_end(character: str) -> int:
    return 256 + ord(character) - 33


def _merge_id(merges, pieces: str) -> int:
    return 512 + merges.index(pieces) - 1


def test_a_photo_of_a_cat_from_the_vocabulary_file(merges):
    # "a" and the word-final byte symbols; "photo</w>", "of</w>", "cat</w>" are merge lines.
    expected = [
        _word_end("a"),
        _merge_id(merges, "pho to</w>"),
        _merge_id(merges, "o f</w>"),
        _word_end("a"),
        _merge_id(merges, "c at</w>"),
    ]
    assert expected == [320, 1125, 539, 320, 2368]
    assert CLIPTokenizer().encode("a photo of a cat") == expected
    row = tokenize("a photo of a cat")
    assert row.shape == (1, 77) and row.dtype == np.int32
    assert row[0, :7].tolist() == [START_OF_TEXT, *expected, END_OF_TEXT]
    assert not row[0, 7:].any()  # padded with 0


def test_each_digit_is_its_own_token():
    assert CLIPTokenizer().encode("2024") == [_word_end(d) for d in "2024"]


def test_html_entities_are_unescaped_twice_and_text_lowered(merges):
    ampersand = _word_end("&")
    tom, jerry = _merge_id(merges, "to m</w>"), _merge_id(merges, "jer ry</w>")
    tokenizer = CLIPTokenizer()
    assert tokenizer.encode("Tom &amp;amp; Jerry") == [tom, ampersand, jerry]
    assert tokenizer.encode("  TOM\t&\n jerry ") == [tom, ampersand, jerry]


def test_empty_and_blank_text_is_start_and_end_only():
    rows = tokenize(["", " \t\n "])
    assert rows[:, :2].tolist() == [[START_OF_TEXT, END_OF_TEXT]] * 2
    assert not rows[:, 2:].any()


def test_long_text_is_cut_to_the_context_ending_in_end_of_text():
    rows = tokenize(["x " * 100, "y " * 75, "z " * 76])
    assert (rows[:, -1] == END_OF_TEXT).all()
    assert (rows[0, 1:-1] == rows[0, 1]).all()  # 75 x's kept, the 76th replaced by EOT
    assert (rows[1, 1:-1] == rows[1, 1]).all()  # exactly full: nothing cut
    short = CLIPTokenizer(context_length=4)(["a photo of a cat"])
    assert short.tolist() == [[START_OF_TEXT, 320, 1125, END_OF_TEXT]]


def test_special_token_text_maps_to_the_special_ids():
    assert CLIPTokenizer().encode("<start_of_text>hi<END_OF_TEXT>")[::2] == [
        START_OF_TEXT,
        END_OF_TEXT,
    ]


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="context_length must be at least 2"):
        CLIPTokenizer(context_length=1)
    # (Under the tests' runtime type checker the TypeErrors come from beartype.)
    with pytest.raises(TypeError, match="context_length"):
        CLIPTokenizer(context_length=7.0)
    with pytest.raises(TypeError, match="text"):
        CLIPTokenizer().encode(3)
    with pytest.raises(FileNotFoundError, match="No CLIP vocabulary file"):
        CLIPTokenizer(tmp_path / "missing.txt.gz")
    short = tmp_path / "short.txt.gz"
    short.write_bytes(gzip.compress(b"header\na b\n"))
    with pytest.raises(ValueError, match="is not CLIP's vocabulary"):
        CLIPTokenizer(short)


@pytest.mark.parametrize("package", ["ftfy", "regex"])
def test_without_its_packages_the_error_names_the_extra(package, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ImportError, match=rf"needs the package '{package}'.*dew-ml\[clip\]"):
        CLIPTokenizer()


def test_the_shipped_vocabulary_is_open_clips_file():
    digest = hashlib.sha256(VOCABULARY_PATH.read_bytes()).hexdigest()
    assert digest == "924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a"
    assert VOCABULARY_PATH.with_name("bpe_simple_vocab_16e6.LICENSE.txt").is_file()
