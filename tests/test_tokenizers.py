"""dew.data.tokenizers: the protocol, the bytes tokenizer, a Hugging Face tokenizer.json and a
SentencePiece model (checked against the libraries' own encoders), BPE training, the
model-vocabulary check."""

import functools
import json
import pathlib
import sysconfig

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dew.data.tokenizers import (
    END_OF_TEXT,
    BytesTokenizer,
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    check_vocabulary,
    load_tokenizer,
    train_tokenizer,
)
from dew.data.tokenizers._readable import END_OF_DOCUMENT, readable_text

tokenizers = pytest.importorskip("tokenizers")
sentencepiece = pytest.importorskip("sentencepiece")

STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
CORPUS = ("textwrap.py", "string.py", "shlex.py")  # about 45 kB of real text nobody here wrote


@functools.cache
def _workdir() -> pathlib.Path:
    import tempfile

    return pathlib.Path(tempfile.mkdtemp(prefix="dew-test-tokenizers-"))


@functools.cache
def _trained_bpe() -> pathlib.Path:
    out = _workdir() / "bpe.json"
    train_tokenizer([STDLIB / name for name in CORPUS], 600, out, progress=False)
    return out


@functools.cache
def _trained_sentencepiece() -> pathlib.Path:
    corpus = _workdir() / "corpus.txt"
    corpus.write_text("".join((STDLIB / name).read_text() for name in CORPUS))
    prefix = _workdir() / "spm"
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=300, minloglevel=2
    )
    return prefix.with_suffix(".model")


# -- bytes --------------------------------------------------------------------------------


@given(st.text())
def test_the_bytes_tokenizer_round_trips_any_text(text):
    tokenizer = BytesTokenizer()
    ids = tokenizer.encode(text)
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(np.append(ids, tokenizer.eos_id)) == text  # EOS left out


@given(st.lists(st.lists(st.integers(0, 255), max_size=12), min_size=1, max_size=4))
def test_readable_text_decodes_each_document_and_marks_where_one_ends(documents):
    """A row crossing documents reads as each document's decode, `<eos>` between: what
    previews and `dew data inspect` show (the tokenizer's own decode would join them)."""
    tokenizer = BytesTokenizer()
    ids = [token for document in documents for token in [*document, tokenizer.eos_id]][:-1]
    expected = END_OF_DOCUMENT.join(tokenizer.decode(document) for document in documents)
    assert readable_text(tokenizer, np.array(ids, np.int64)) == expected
    assert readable_text(None, ids) == " ".join(map(str, ids))


@given(st.lists(st.integers(-3, 400), max_size=20))
def test_readable_text_marks_ids_no_tokenizer_decodes_instead_of_raising(ids):
    tokenizer = BytesTokenizer()  # IDs 0 to 256; a model may sample past them
    outside = [token for token in ids if not 0 <= token < tokenizer.vocab_size]
    text = readable_text(tokenizer, ids)
    assert text.count("<id ") == len(outside)
    assert all(f"<id {token}>" in text for token in outside)


@given(st.binary())
def test_the_bytes_tokenizer_decodes_any_bytes_as_python_does_with_replacement(data):
    tokenizer = BytesTokenizer()
    assert tokenizer.encode_bytes(data).tolist() == list(data)
    assert tokenizer.decode(tokenizer.encode_bytes(data)) == data.decode("utf-8", "replace")


def test_the_bytes_tokenizer_refuses_ids_outside_its_vocabulary():
    with pytest.raises(ValueError, match=r"ID 257 at position 1 is outside \[0, 257\)"):
        BytesTokenizer().decode([65, 257])
    with pytest.raises(ValueError, match="ID -1 at position 0"):
        BytesTokenizer().decode([-1])


def test_the_tokenizers_have_the_protocol():
    for tokenizer in (BytesTokenizer(), HFTokenizer(_trained_bpe())):
        assert isinstance(tokenizer, Tokenizer)
    assert not isinstance(object(), Tokenizer)


# -- Hugging Face tokenizers ----------------------------------------------------------------


@functools.cache
def _bpe_pair() -> tuple[HFTokenizer, "tokenizers.Tokenizer"]:
    path = _trained_bpe()
    return HFTokenizer(path), tokenizers.Tokenizer.from_file(str(path))


@functools.cache
def _sentencepiece_pair() -> tuple[SentencePieceTokenizer, "sentencepiece.SentencePieceProcessor"]:
    path = _trained_sentencepiece()
    return SentencePieceTokenizer(path), sentencepiece.SentencePieceProcessor(model_file=str(path))


@given(st.lists(st.text(max_size=60), min_size=1, max_size=6))
def test_hf_encode_is_the_librarys_own(texts):
    ours, reference = _bpe_pair()
    for text in texts:
        assert list(ours.encode(text)) == reference.encode(text, add_special_tokens=False).ids
    assert [list(ids) for ids in ours.encode_batch(texts)] == [
        encoding.ids for encoding in reference.encode_batch(texts, add_special_tokens=False)
    ]


@given(st.text(max_size=200))
def test_a_trained_byte_level_bpe_round_trips_any_text(text):
    tokenizer, _ = _bpe_pair()
    assert tokenizer.decode([*tokenizer.encode(text), tokenizer.eos_id]) == text


def test_a_trained_tokenizer_has_its_end_of_text_token_and_size():
    tokenizer = HFTokenizer(_trained_bpe())
    reference = tokenizers.Tokenizer.from_file(str(_trained_bpe()))
    assert tokenizer.eos_id == reference.token_to_id(END_OF_TEXT) == 0
    assert tokenizer.vocab_size == reference.get_vocab_size() == 600
    ids = np.concatenate([tokenizer.encode((STDLIB / name).read_text()) for name in CORPUS])
    assert ids.max() < tokenizer.vocab_size
    assert ids.size < sum((STDLIB / name).stat().st_size for name in CORPUS) / 2  # merges learned


def _word_level(tmp_path, special: list[str], post: bool = False) -> pathlib.Path:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2} | {name: 3 + i for i, name in enumerate(special)}
    built = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    built.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    built.add_special_tokens(special)
    if post:
        built.post_processor = tokenizers.processors.TemplateProcessing(
            single=f"$A {special[0]}", special_tokens=[(special[0], vocab[special[0]])]
        )
    path = tmp_path / "word.json"
    built.save(str(path))
    return path


def test_hf_finds_the_end_of_document_token_and_leaves_post_processing_out(tmp_path):
    path = _word_level(tmp_path, ["<pad>", "</s>"], post=True)
    tokenizer = HFTokenizer(path)
    assert tokenizer.eos_id == 4
    reference = tokenizers.Tokenizer.from_file(str(path))
    assert reference.encode("hello world").ids == [1, 2, 3]  # the post-processor's token
    assert tokenizer.encode("hello world") == [1, 2]  # dew appends eos_id itself
    assert tokenizer.decode([1, 2, 4]) == "hello world"
    assert HFTokenizer(path, eos="<pad>").eos_id == 3
    assert HFTokenizer(path, eos=1).eos_id == 1


def test_hf_without_an_end_of_document_token_names_its_special_tokens(tmp_path):
    path = _word_level(tmp_path, ["<pad>"])
    with pytest.raises(ValueError, match=r"no end-of-document token .*'<pad>'.*eos=TOKEN"):
        HFTokenizer(path)
    with pytest.raises(ValueError, match="has no token '<end>'"):
        HFTokenizer(path, eos="<end>")
    with pytest.raises(ValueError, match=r"eos=9 is outside .* \[0, 4\)"):
        HFTokenizer(path, eos=9)


def test_hf_refuses_a_file_that_is_no_tokenizer(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match=r"tokenizer.json' is not a Hugging Face tokenizer.json"):
        HFTokenizer(bad)
    with pytest.raises(FileNotFoundError, match=r"'missing.json' is no such file"):
        HFTokenizer("missing.json")


def test_the_fingerprint_follows_the_files_bytes(tmp_path):
    first = _word_level(tmp_path, ["</s>"])
    fingerprint = HFTokenizer(first).fingerprint
    assert HFTokenizer(first).fingerprint == fingerprint
    assert HFTokenizer(first, eos="hello").fingerprint != fingerprint
    first.write_text(first.read_text().replace('"world"', '"earth"'))
    assert HFTokenizer(first).fingerprint != fingerprint


# -- SentencePiece ------------------------------------------------------------------------


@given(st.lists(st.text(max_size=60), min_size=1, max_size=6))
def test_sentencepiece_encode_is_the_librarys_own(texts):
    ours, reference = _sentencepiece_pair()
    for text in texts:
        assert list(ours.encode(text)) == reference.encode(text)
    assert [list(ids) for ids in ours.encode_batch(texts)] == reference.encode(texts)


def test_sentencepiece_reads_the_models_own_eos_and_size():
    path = _trained_sentencepiece()
    reference = sentencepiece.SentencePieceProcessor(model_file=str(path))
    tokenizer = SentencePieceTokenizer(path)
    assert (tokenizer.vocab_size, tokenizer.eos_id) == (300, reference.eos_id())
    ids = tokenizer.encode("def f(x): return x")
    assert tokenizer.decode([*ids, tokenizer.eos_id]) == reference.decode(ids)
    with pytest.raises(ValueError, match="has no piece '<nope>'"):
        SentencePieceTokenizer(path, eos="<nope>")


def test_sentencepiece_without_eos_asks_for_one(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((STDLIB / "textwrap.py").read_text())
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "noeos"), vocab_size=200, eos_id=-1,
        minloglevel=2,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"no end-of-document piece \(its eos ID is -1"):
        SentencePieceTokenizer(tmp_path / "noeos.model")
    assert SentencePieceTokenizer(tmp_path / "noeos.model", eos="<unk>").eos_id == 0


def test_sentencepiece_refuses_a_file_that_is_no_model(tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"bad.model' is not a SentencePiece model"):
        SentencePieceTokenizer(bad)


# -- load_tokenizer -------------------------------------------------------------------------


def test_load_tokenizer_reads_names_paths_and_objects():
    assert load_tokenizer("bytes") == BytesTokenizer()
    assert isinstance(load_tokenizer(_trained_bpe()), HFTokenizer)
    assert isinstance(load_tokenizer(str(_trained_sentencepiece())), SentencePieceTokenizer)
    mine = BytesTokenizer()
    assert load_tokenizer(mine) is mine


def test_load_tokenizer_names_what_it_accepts():
    with pytest.raises(ValueError, match=r"'bytes', a Hugging Face .* got 'gpt2'"):
        load_tokenizer("gpt2")
    with pytest.raises(TypeError, match=r"Tokenizer protocol .* got int"):
        load_tokenizer(3)
    with pytest.raises(FileNotFoundError, match=r"'nowhere.model' is no such file"):
        load_tokenizer("nowhere.model")


# -- train_tokenizer ------------------------------------------------------------------------


def test_train_tokenizer_reads_json_lines_and_refuses_to_overwrite(tmp_path):
    lines = tmp_path / "docs.jsonl"
    rows = [{"body": text} for text in ("hello world", "hello there", "world of text") * 20]
    lines.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    out = tmp_path / "tok.json"
    trained = train_tokenizer(lines, 270, out, field="body", progress=False)
    assert trained.decode(trained.encode("hello world")) == "hello world"
    assert len(trained.encode("hello world")) < len("hello world")
    with pytest.raises(FileExistsError, match=r"tok.json' exists; pass overwrite=True"):
        train_tokenizer(lines, 270, out, field="body")
    assert train_tokenizer(lines, 300, out, field="body", overwrite=True).vocab_size <= 300
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


def test_train_tokenizer_refuses_bad_input_in_one_line(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("some text")
    with pytest.raises(ValueError, match=r"vocab_size must be at least 257 .* got 100"):
        train_tokenizer(text, 100, tmp_path / "t.json")
    with pytest.raises(FileNotFoundError, match=r"the glob '.*\*.md' matches no file"):
        train_tokenizer(tmp_path / "*.md", 300, tmp_path / "t.json")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"the corpus is empty: 1 file\(s\) hold no text"):
        train_tokenizer(empty, 300, tmp_path / "t.json")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9\nna\xefve")
    with pytest.raises(ValueError, match=r"latin.txt' line 1 is not UTF-8"):
        train_tokenizer(latin, 300, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


# -- the model's vocabulary -----------------------------------------------------------------


def test_check_vocabulary_refuses_a_smaller_model_in_one_line():
    with pytest.raises(ValueError, match="vocab_size") as raised:
        check_vocabulary(256, BytesTokenizer(), model="the model 'causal_transformer'")
    message = str(raised.value)
    assert "\n" not in message
    assert "vocab_size=256" in message and "vocab_size=257" in message
    assert "'bytes'" in message
    check_vocabulary(257, BytesTokenizer())
    check_vocabulary(320, BytesTokenizer())  # a padded embedding is fine
