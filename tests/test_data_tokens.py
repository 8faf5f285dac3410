"""`dew.data.tokens`: windows of a token file (`.npy`, or a raw `.bin` of uint16/uint32),
memory-mapped, as a step-indexed dataset; `token_windows` reads a file through it."""

import shutil

import numpy as np
import pytest

from dew.config import DataConfig
from dew.data import Partition, tokens
from dew.data import _tokens as token_module
from dew.registry import datasets, token_windows


@pytest.fixture
def counting(tmp_path):
    """401 token IDs 0..400 as .npy (int64), uint16 .bin and uint32 .bin: window `i` of
    seq_len 4 starts with token `4 * i`, so rows name themselves."""
    ids = np.arange(401)
    np.save(tmp_path / "ids.npy", ids)
    ids.astype(np.uint16).tofile(tmp_path / "ids16.bin")
    ids.astype(np.uint32).tofile(tmp_path / "ids32.bin")
    return tmp_path


def starts(batch):
    return (batch["text"][:, 0] // 4).tolist()


def test_windows_of_seq_len_plus_one_stride_seq_len_as_int32(counting):
    data = tokens(counting / "ids.npy", seq_len=4, batch=5, val_fraction=0.2, seed=0)
    assert (data.records, data.batch) == (80, 5)
    assert isinstance(data.train.rows.tokens, np.memmap)
    batch = data.train.batch_at(0, Partition())
    assert batch["text"].dtype == np.int32 and batch["text"].shape == (5, 5)
    np.testing.assert_array_equal(batch["text"] - batch["text"][:, :1], [[0, 1, 2, 3, 4]] * 5)
    epoch = [row for step in range(16) for row in starts(data.train.batch_at(step, Partition()))]
    assert sorted(epoch) == list(range(80)) and epoch != sorted(epoch)
    # The validation windows are the last ones, one stretch at the file's end, in order.
    val = [row for batch in data.val(Partition()) for row in starts(batch)]
    assert val == list(range(80, 100))


@pytest.mark.parametrize(("name", "dtype"), [("ids16.bin", "uint16"), ("ids32.bin", "uint32")])
def test_a_raw_file_with_its_dtype_reads_as_the_same_windows_in_the_same_order(
    counting, name, dtype
):
    """The order follows the tokens, not the file: the same IDs in another file type (and
    another dtype) give other fingerprints, but the same windows."""
    raw = tokens(counting / name, dtype=dtype, seq_len=4, batch=8, seed=2)
    assert raw.train.rows.tokens.dtype == np.dtype(dtype)
    batch = raw.train.batch_at(3, Partition())
    np.testing.assert_array_equal(batch["text"] - batch["text"][:, :1], [[0, 1, 2, 3, 4]] * 8)
    assert batch["text"].dtype == np.int32


def test_the_order_follows_the_contents_never_the_path(counting, tmp_path):
    shutil.copy(counting / "ids16.bin", tmp_path / "moved.bin")
    first = tokens(counting / "ids16.bin", dtype="uint16", seq_len=4, batch=8, seed=2)
    moved = tokens(tmp_path / "moved.bin", dtype="uint16", seq_len=4, batch=8, seed=2)
    assert first.train.fingerprint == moved.train.fingerprint
    np.arange(1, 402, dtype=np.uint16).tofile(tmp_path / "changed.bin")
    changed = tokens(tmp_path / "changed.bin", dtype="uint16", seq_len=4, batch=8, seed=2)
    assert first.train.fingerprint != changed.train.fingerprint


def test_the_vocabulary_is_checked_in_chunks_naming_the_first_bad_id(counting, monkeypatch):
    monkeypatch.setattr(token_module, "_CHUNK", 64)  # several chunks over 401 tokens
    tokens(counting / "ids.npy", seq_len=4, batch=1, vocab_size=401)
    with pytest.raises(
        ValueError,
        match=r"^tokens: '.*ids\.npy' holds token ID 300 at position 300; valid IDs are 0 to "
        r"299 \(vocab_size=300\)\.$",
    ):
        tokens(counting / "ids.npy", seq_len=4, batch=1, vocab_size=300)
    np.save(counting / "negative.npy", np.array([0, 1, 2, -5, 3]))
    with pytest.raises(ValueError, match="holds token ID -5 at position 3; valid IDs are 0 to 9"):
        tokens(counting / "negative.npy", seq_len=2, batch=1, vocab_size=10)


def test_token_windows_reads_a_file_as_tokens_does(counting):
    old = token_windows(
        seq_len=4, path=counting / "ids.npy", vocab_size=401, val_fraction=0.1, batch_size=3, seed=5
    )
    new = tokens(counting / "ids.npy", seq_len=4, batch=3, vocab_size=401, val_fraction=0.1, seed=5)
    assert old.records == new.records
    for step in (0, 1, 50):
        np.testing.assert_array_equal(
            old.train.batch_at(step, Partition())["text"],
            new.train.batch_at(step, Partition())["text"],
        )


def test_the_registered_tokens_dataset_builds_from_a_config(counting):
    config = datasets["tokens"](path=str(counting / "ids16.bin"), dtype="uint16", seq_len=4)
    assert config == DataConfig(
        "tokens", {"path": str(counting / "ids16.bin"), "dtype": "uint16", "seq_len": 4}
    )
    data = config.build(batch_size=6, seed=1)
    direct = tokens(counting / "ids16.bin", dtype="uint16", seq_len=4, batch=6, seed=1)
    np.testing.assert_array_equal(
        data.train.batch_at(9, Partition())["text"], direct.train.batch_at(9, Partition())["text"]
    )
    with pytest.raises(TypeError, match="dataset 'tokens' needs 'seq_len'"):
        datasets["tokens"](path="x.bin")


def test_bad_token_files_raise_one_line_naming_the_value(counting, tmp_path):
    with pytest.raises(
        ValueError, match=r"^tokens: '.*ids16\.bin' is a raw token file \(not \.npy"
    ):
        tokens(counting / "ids16.bin", seq_len=4, batch=1)
    with pytest.raises(
        ValueError, match=r"^tokens: dtype must be 'uint16' or 'uint32', got 'int8'"
    ):
        tokens(counting / "ids16.bin", dtype="int8", seq_len=4, batch=1)
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(ValueError, match=r"holds 7 bytes, not a whole number of uint16 token IDs"):
        tokens(tmp_path / "odd.bin", dtype="uint16", seq_len=1, batch=1)
    with pytest.raises(ValueError, match=r"is a \.npy file of int64 token IDs, but dtype='uint16'"):
        tokens(counting / "ids.npy", dtype="uint16", seq_len=4, batch=1)
    np.save(tmp_path / "floats.npy", np.zeros(10, np.float32))
    with pytest.raises(ValueError, match=r"1-D array of integer token IDs, got shape \(10,\) and"):
        tokens(tmp_path / "floats.npy", seq_len=4, batch=1)
    with pytest.raises(FileNotFoundError, match=r"^tokens: no file at 'nowhere\.bin', expected a"):
        tokens("nowhere.bin", dtype="uint16", seq_len=4, batch=1)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^tokens: 0 token\(s\) hold no window of seq_len \+ 1"):
        tokens(tmp_path / "empty.bin", dtype="uint16", seq_len=4, batch=1)
    with pytest.raises(ValueError, match=r"^tokens: 100 window\(s\) leave no training row after"):
        tokens(counting / "ids.npy", seq_len=4, batch=1, val_fraction=0.999)
    with pytest.raises(ValueError, match=r"^tokens: seq_len must be an integer >= 1, got 0"):
        tokens(counting / "ids.npy", seq_len=0, batch=1)
