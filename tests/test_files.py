"""`dew._files`: the files dew writes in place are never opened through a symbolic link."""

import errno
import os

import pytest

from dew._files import open_descriptor, open_for_writing


@pytest.mark.parametrize("mode", ["a", "w", "ab", "wb"])
def test_a_dangling_link_is_refused_and_nothing_is_created_where_it_points(tmp_path, mode):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "run"
    folder.mkdir()
    link = folder / "scalars.jsonl"
    link.symlink_to(outside / "scalars.jsonl")
    with pytest.raises(OSError, match="is a symbolic link") as caught:
        open_for_writing(link, mode)
    assert caught.value.errno == errno.ELOOP
    assert caught.value.filename == str(link)
    assert str(outside / "scalars.jsonl") in caught.value.strerror  # where it points
    assert list(outside.iterdir()) == []  # nothing created outside the folder
    assert link.is_symlink()  # and the link itself is left as it was


def test_a_link_to_an_existing_file_is_neither_appended_to_nor_truncated(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me\n")
    link = tmp_path / "records.jsonl"
    link.symlink_to(target)
    for mode in ("a", "w", "r+b"):
        with pytest.raises(OSError, match="never writes through a link"):
            open_for_writing(link, mode)
    with pytest.raises(OSError, match="is a symbolic link"):
        open_descriptor(link, os.O_RDWR | os.O_CREAT)
    assert target.read_text() == "keep me\n"


def test_regular_files_open_as_asked(tmp_path):
    path = tmp_path / "journal.jsonl"
    with open_for_writing(path, "a", encoding="utf-8") as file:
        file.write("one\n")
    with open_for_writing(path, "a", encoding="utf-8") as file:
        file.write("two\n")
    assert path.read_text() == "one\ntwo\n"
    with open_for_writing(path, "r+b") as file:
        file.truncate(4)
    assert path.read_text() == "one\n"
    with open_for_writing(path, "wb") as file:
        file.write(b"new\n")
    assert path.read_bytes() == b"new\n"
    # A folder above the file may be a link: only the final component is never followed.
    (tmp_path / "linked").symlink_to(tmp_path, target_is_directory=True)
    with open_for_writing(tmp_path / "linked" / "journal.jsonl", "a") as file:
        file.write("three\n")
    assert path.read_text() == "new\nthree\n"


def test_an_unknown_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mode 'a', 'w' or 'r\\+'"):
        open_for_writing(tmp_path / "x", "x")
