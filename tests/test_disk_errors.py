"""A full or read-only disk: every write dew makes (a journal line, run.json, params.json, a
preview file, a checkpoint) fails as one `OSError` naming the path, and what was written
before stays whole; `dew train` says it in one line and exits 2.

A full disk is the operating system's own: the file size limit (`RLIMIT_FSIZE`, which
Python's ignored `SIGXFSZ` turns into `EFBIG` errors) makes every write past the limit fail
as a full disk does, partway through a write included. Set in this process, the limit is
held only around the write under test.
"""

import contextlib
import errno
import hashlib
import json
import logging
import os
import resource
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _builders import TINY, tiny_lm_objective

from dew import _json
from dew.artifacts import Images
from dew.checkpoints import Checkpointer
from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
from dew.registry import datasets
from dew.steps import TrainState
from dew.tracking import LocalTracker, read_journal


@contextlib.contextmanager
def _disk_full_past(size):
    """Every write past `size` bytes of any file fails with EFBIG while inside."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _files(folder):
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_journal_line_cut_short_by_a_full_disk_is_taken_back(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=1)
        before = (tmp_path / "scalars.jsonl").read_bytes()
        long = {f"lm/train/metric_{index}": float(index) for index in range(40)}
        with (
            _disk_full_past(len(before) + 100),
            pytest.raises(OSError, match="File too large") as caught,
        ):
            tracker.log_metrics(long, step=2)  # its first 100 bytes fit
        assert (caught.value.errno, caught.value.filename) == (
            errno.EFBIG,
            str(tmp_path / "scalars.jsonl"),
        )
        assert (tmp_path / "scalars.jsonl").read_bytes() == before
        tracker.log_metrics({"lm/train/loss": 0.5}, step=3)  # room again: appends whole
    assert read_journal(tmp_path).scalars == {"lm/train/loss": [(1, 1.0), (3, 0.5)]}


def test_a_record_line_that_fails_names_records_jsonl(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        size = (tmp_path / "records.jsonl").stat().st_size
        with _disk_full_past(size + 10), pytest.raises(OSError, match="File too large") as caught:
            tracker.log_artifact("note", {"text": "x" * 200}, step=1)
    assert caught.value.filename == str(tmp_path / "records.jsonl")
    assert (tmp_path / "records.jsonl").stat().st_size == size


def test_params_and_run_json_failing_name_the_file_and_keep_the_old_one(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_params({"lr": 0.1})
        before = _files(tmp_path)
        with _disk_full_past(100), pytest.raises(OSError, match="File too large") as caught:
            tracker.log_params({"long": "y" * 500})
        assert (caught.value.errno, caught.value.filename) == (
            errno.EFBIG,
            str(tmp_path / "params.json"),
        )
        assert _files(tmp_path) == before  # the old params.json, and no temporary file
    before = _files(tmp_path)  # closed: its summary.json written too
    target = tmp_path / "run.json"
    with _disk_full_past(10), pytest.raises(OSError, match="File too large") as caught:
        _json.write_atomic(target, json.dumps({"type": "run_record", "pad": "z" * 100}))
    assert caught.value.filename == str(target) and not target.exists()
    assert _files(tmp_path) == before


def test_a_preview_that_fails_names_its_file_and_journals_nothing(tmp_path):
    images = Images(jnp.linspace(0.0, 1.0, 2 * 16 * 16 * 3).reshape(2, 16, 16, 3))
    with LocalTracker(tmp_path) as tracker:
        before = (tmp_path / "records.jsonl").read_bytes()
        with _disk_full_past(64), pytest.raises(OSError, match="File too large") as caught:
            tracker.log_artifact("lm/validation/samples", images, step=4)
        assert caught.value.errno == errno.EFBIG
        assert caught.value.filename.startswith(
            str(tmp_path / "previews" / "lm" / "validation" / "samples" / "4")
        )
        assert (tmp_path / "records.jsonl").read_bytes() == before
        leftovers = [path for path in (tmp_path / "previews").rglob("*") if path.is_file()]
        assert all(not path.name.startswith(".") for path in leftovers)  # no temporary file


@pytest.fixture(scope="module")
def state():
    return TrainState.create(tiny_lm_objective(8, seed=3), optax.adam(1e-2), key=jax.random.key(1))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_checkpoint_save_on_a_full_disk_is_one_os_error(state, tmp_path):
    shown = _Records()
    for name in ("absl", "asyncio"):
        logging.getLogger(name).addHandler(shown)
    try:
        with Checkpointer(tmp_path) as checkpoints:
            checkpoints.save(2, state)
            checkpoints.wait()
            saved = _files(tmp_path)
            with _disk_full_past(2000):
                checkpoints.save(4, state)  # submitted; orbax's threads write it
                with pytest.raises(OSError, match="File too large") as caught:
                    checkpoints.wait()
            assert checkpoints.all_steps() == [2]
    finally:
        for name in ("absl", "asyncio"):
            logging.getLogger(name).removeHandler(shown)
    assert (caught.value.errno, caught.value.filename) == (errno.EFBIG, str(tmp_path))
    assert caught.value.__notes__ == [
        "Checkpoint step 4 was not saved; the latest complete one is step 2."
    ]
    assert [record.getMessage() for record in shown.records if record.exc_info] == []
    assert {name: data for name, data in _files(tmp_path).items() if name.startswith("2/")} == {
        name: data for name, data in saved.items() if name.startswith("2/")
    }
    restored, _ = Checkpointer(tmp_path).restore(state)
    pairs = zip(jax.tree.leaves(restored.params), jax.tree.leaves(state.params), strict=True)
    assert all(np.array_equal(a, b) for a, b in pairs)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder without write bits")
def test_a_checkpoint_save_into_a_read_only_folder_is_one_os_error(state, tmp_path):
    with Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(2, state)
        checkpoints.wait()
        tmp_path.chmod(0o555)
        try:
            with pytest.raises(PermissionError) as caught:
                checkpoints.save(4, state)
        finally:
            tmp_path.chmod(0o755)
    assert caught.value.filename == str(tmp_path)


def _limited(limit):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return set_limit


def _dew(*arguments, cwd, limit=None):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "dew.cli", *map(str, arguments)],
        cwd=cwd,
        env=environment,
        capture_output=True,  # pipes: the limit cuts files, not the test's view of stderr
        text=True,
        timeout=300,
        preexec_fn=None if limit is None else _limited(limit),
    )


def _digest(folder):
    return {name: hashlib.sha256(data).hexdigest() for name, data in _files(folder).items()}


@pytest.mark.slow  # three `dew train` runs, about 20 s each
def test_dew_train_on_a_full_disk_is_one_line_and_exit_status_2(tmp_path):
    config = RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="tiny",
            checkpoint_dir="runs",
            steps=4,
            batch_size=8,
            log_every=2,
            checkpoint_every=2,
        ),
    )
    config.dump_toml(tmp_path / "run.toml")
    folder = tmp_path / "runs" / "tiny"

    fresh = _dew("train", "run.toml", "--quiet", cwd=tmp_path, limit=500)  # run.json: 1 kB
    assert fresh.returncode == 2
    assert fresh.stderr == "dew train: runs/tiny/run.json: File too large\n"
    assert not (folder / "run.json").exists()
    assert [path.name for path in folder.iterdir() if path.name.startswith(".")] == []
    shutil.rmtree(tmp_path / "runs")

    assert _dew("train", "run.toml", "--quiet", cwd=tmp_path).returncode == 0
    before = _digest(folder)
    journals = {name: (folder / name).read_bytes() for name in ("scalars.jsonl", "records.jsonl")}

    full = _dew("train", "run.toml", "--quiet", "--steps", "8", cwd=tmp_path, limit=12_000)
    assert full.returncode == 2, full.stderr
    assert full.stderr == (
        f"dew train: {folder / 'checkpoints'}: File too large Checkpoint step 6 was not saved; "
        "the latest complete one is step 4.\n"
    )
    after = _digest(folder)
    assert {name: after[name] for name in before if name.startswith("checkpoints/")} == {
        name: digest for name, digest in before.items() if name.startswith("checkpoints/")
    }
    for name, text in journals.items():
        assert (folder / name).read_bytes().startswith(text)
    ended = [record for _, _, record in read_journal(folder).records if record.type == "fit_ended"]
    assert [record.status for record in ended] == ["completed", "failed"]
