"""The token cache behind dew.data.text: tokenized once and reused, rebuilt when a file changes,
never read after a build that died midway, a progress bar on request."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dew.data import text
from dew.data._token_cache import token_cache
from dew.data.tokenizers import BytesTokenizer


class Counting:
    """The bytes tokenizer's IDs through `encode` alone (text, one call a document), counting
    the calls; it raises on the call after `fail_after`, as a tokenizer that dies midway."""

    vocab_size = 257
    eos_id = 256

    def __init__(self, fail_after: int | None = None, fingerprint: str = "counting-bytes"):
        self.calls = 0
        self.fail_after = fail_after
        self.fingerprint = fingerprint

    def encode(self, text: str) -> np.ndarray:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("the tokenizer died")
        return BytesTokenizer().encode(text)

    def decode(self, ids) -> str:
        return BytesTokenizer().decode(ids)


def _corpus(folder: pathlib.Path, count: int = 4) -> list[pathlib.Path]:
    files = []
    for index in range(count):
        path = folder / "corpus" / f"{index}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"document {index}: " + "some words " * (20 + index))
        files.append(path)
    return files


def _build(files, cache: pathlib.Path, tokenizer, **kwargs):
    return text(files, tokenizer=tokenizer, seq_len=8, batch=2, cache_dir=cache, **kwargs)


def _caches(cache: pathlib.Path) -> list[pathlib.Path]:
    return sorted(cache.glob("tokens-*"))


def test_a_second_build_reads_the_cache_without_tokenizing(tmp_path):
    files = _corpus(tmp_path)
    counting = Counting()
    first = _build(files, tmp_path / "cache", counting)
    assert counting.calls == 4
    (folder,) = _caches(tmp_path / "cache")
    written = (folder / "tokens.bin").stat()
    second = _build(files, tmp_path / "cache", counting)
    assert counting.calls == 4  # read, not tokenized
    assert (folder / "tokens.bin").stat().st_ino == written.st_ino
    assert (folder / "tokens.bin").stat().st_mtime_ns == written.st_mtime_ns
    np.testing.assert_array_equal(
        second.train.rows.read(np.arange(len(second.train.rows)))["text"],
        first.train.rows.read(np.arange(len(first.train.rows)))["text"],
    )
    assert isinstance(second.train.rows.tokens, np.memmap)


def test_a_changed_file_or_tokenizer_rebuilds_the_cache(tmp_path):
    files = _corpus(tmp_path)
    counting = Counting()
    _build(files, tmp_path / "cache", counting)
    files[2].write_text(files[2].read_text() + " and a new sentence")
    data = _build(files, tmp_path / "cache", counting)
    assert counting.calls == 8 and len(_caches(tmp_path / "cache")) == 2
    stream = data.train.rows.read(np.arange(len(data.train.rows)))["text"]
    assert "and a new sentence" in BytesTokenizer().decode(stream[:, :-1].reshape(-1))
    _build(files, tmp_path / "cache", Counting(fingerprint="another tokenizer"))
    assert len(_caches(tmp_path / "cache")) == 3


def test_a_touched_file_rebuilds_unless_the_cache_is_keyed_by_content(tmp_path):
    files = _corpus(tmp_path)
    counting = Counting()
    _build(files, tmp_path / "cache", counting, content_hash=True)
    stat = files[0].stat()
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    _build(files, tmp_path / "cache", counting, content_hash=True)
    assert counting.calls == 4  # same bytes, same cache
    _build(files, tmp_path / "cache", counting)  # keyed by path, size and mtime
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))
    _build(files, tmp_path / "cache", counting)
    assert counting.calls == 12
    files[1].write_text("changed")
    _build(files, tmp_path / "cache", counting, content_hash=True)
    assert counting.calls == 16


def test_a_build_that_dies_midway_leaves_no_cache_and_the_next_build_succeeds(tmp_path):
    files = _corpus(tmp_path)
    with pytest.raises(RuntimeError, match="the tokenizer died"):
        _build(files, tmp_path / "cache", Counting(fail_after=2))
    assert list((tmp_path / "cache").iterdir()) == []  # no cache, no temporary folder
    counting = Counting()  # the same fingerprint: the same key as the build that died
    data = _build(files, tmp_path / "cache", counting)
    assert counting.calls == 4
    fresh = _build(files, tmp_path / "fresh", Counting())
    np.testing.assert_array_equal(
        data.train.rows.read(np.arange(len(data.train.rows)))["text"],
        fresh.train.rows.read(np.arange(len(fresh.train.rows)))["text"],
    )


def test_a_damaged_cache_is_rebuilt_not_read(tmp_path):
    files = _corpus(tmp_path)
    counting = Counting()
    first = _build(files, tmp_path / "cache", counting)
    (folder,) = _caches(tmp_path / "cache")
    with (folder / "tokens.bin").open("r+b") as handle:
        handle.truncate(10)
    again = _build(files, tmp_path / "cache", counting)
    assert counting.calls == 8
    assert len(again.train.rows) == len(first.train.rows)


def test_the_leftover_of_a_killed_build_is_removed_by_the_next(tmp_path):
    files = _corpus(tmp_path)
    cache = tmp_path / "cache"
    _build(files, cache, Counting())
    (folder,) = _caches(cache)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname().replace("-", "_")
    leftover = cache / f".{folder.name}.building-{host}-{dead.pid}-0000"
    leftover.mkdir()
    (leftover / "tokens.bin").write_bytes(b"\x00" * 6)
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    counting = Counting()
    _build(files, cache, counting)
    assert counting.calls == 4 and not leftover.exists()


def test_a_vocabulary_over_65536_ids_is_cached_as_uint32(tmp_path):
    class Wide(Counting):
        vocab_size = 70_000
        eos_id = 69_999

        def encode(self, text):
            return BytesTokenizer().encode(text).astype(np.int64) + 65_536

    data = _build(_corpus(tmp_path, 2), tmp_path / "cache", Wide(fingerprint="wide"))
    assert data.train.rows.tokens.dtype == np.dtype("<u4")
    window = data.train.rows.read(np.arange(1))["text"]
    assert window.min() >= 65_536


def test_a_tokenizer_returning_ids_outside_its_vocabulary_is_named(tmp_path):
    class Liar(Counting):
        vocab_size = 100
        eos_id = 99

    with pytest.raises(ValueError, match="returned ID 119, outside its vocabulary \\[0, 100\\)"):
        _build(_corpus(tmp_path, 1), tmp_path / "cache", Liar(fingerprint="liar"))


def test_the_progress_bar_shows_files_and_bytes_per_second_on_request(tmp_path, capsys):
    files = _corpus(tmp_path)
    _build(files, tmp_path / "cache", Counting(), progress=True)
    shown = capsys.readouterr()
    assert shown.out == ""
    assert "tokenizing 4 files" in shown.err and "B/s" in shown.err and "file 4 of 4" in shown.err
    _build(files, tmp_path / "other", Counting(), progress=False)
    assert capsys.readouterr().err == ""


def test_the_cache_records_what_it_holds(tmp_path):
    files = _corpus(tmp_path, 2)
    cache = token_cache(
        "text", files, BytesTokenizer(), field=None, cache_dir=tmp_path, content_hash=False,
        progress=False,
    )  # fmt: skip
    meta = json.loads((cache.path / "cache.json").read_text())
    assert meta["documents"] == 2 and meta["tokenizer"] == "'bytes'"
    sizes = [path.stat().st_size + 1 for path in files]
    assert cache.offsets.tolist() == [0, sizes[0], sizes[0] + sizes[1]]
    assert cache.built and not token_cache(
        "text", files, BytesTokenizer(), field=None, cache_dir=tmp_path, content_hash=False,
        progress=False,
    ).built  # fmt: skip


@pytest.mark.slow
def test_a_build_killed_by_sigkill_is_never_read(tmp_path):
    files = _corpus(tmp_path)
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
        from test_token_cache import Counting, _build
        import pathlib

        class Killed(Counting):
            def encode(self, text):
                if self.calls == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().encode(text)

        files = [pathlib.Path(p) for p in {[str(f) for f in files]!r}]
        _build(files, pathlib.Path({str(tmp_path / "cache")!r}), Killed())
        """
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (leftover,) = (tmp_path / "cache").iterdir()  # the killed build's temporary folder
    assert leftover.name.startswith(".tokens-") and ".building-" in leftover.name
    assert _caches(tmp_path / "cache") == []
    counting = Counting()
    data = _build(files, tmp_path / "cache", counting)
    assert counting.calls == 4 and len(data.train.rows) > 0
    assert list((tmp_path / "cache").iterdir()) == _caches(tmp_path / "cache")
