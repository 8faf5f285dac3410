"""`dew._lock`: one holder per folder at a time, named by its PID; the operating system
releases a dead holder's lock."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import dew
from dew._lock import LOCK_FILE, FolderLockedError, check_unlocked, folder_lock

HOLDER = textwrap.dedent(
    """
    import sys, time, types
    # dew._lock and dew._files alone: the dew package's __init__ imports JAX (slow).
    package = types.ModuleType("dew")
    package.__path__ = [sys.argv[2]]
    sys.modules["dew"] = package
    from dew._lock import folder_lock
    with folder_lock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(600)
    """
)


def test_a_second_holder_is_refused_naming_the_folder_and_the_holder(tmp_path):
    with folder_lock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(FolderLockedError) as caught, folder_lock(tmp_path):
            pass
        assert caught.value.pid == os.getpid()
        assert caught.value.filename == str(tmp_path)
        assert f"in use by process {os.getpid()} (this process)" in caught.value.strerror
        with pytest.raises(FolderLockedError):
            check_unlocked(tmp_path)
    # Released with the block: the next holder takes it, and no stale PID is left.
    assert (tmp_path / LOCK_FILE).read_text() == ""
    check_unlocked(tmp_path)
    with folder_lock(tmp_path):
        pass


def test_check_unlocked_creates_nothing(tmp_path):
    check_unlocked(tmp_path / "absent")  # no folder: nobody holds it
    check_unlocked(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_holder_s_lock_is_released(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), os.path.dirname(dew.__file__)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderLockedError, match=f"in use by process {holder.pid},") as caught:
            check_unlocked(tmp_path)
        assert caught.value.pid == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops a dead process's locks with its files
        try:
            with folder_lock(tmp_path):
                assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
            break
        except FolderLockedError:
            assert time.monotonic() < deadline, "the killed holder's lock was never released"
            time.sleep(0.05)


def test_a_lock_file_that_is_a_link_is_refused(tmp_path):
    (tmp_path / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="is a symbolic link"), folder_lock(tmp_path):
        pass
    assert not (tmp_path / "elsewhere").exists()
