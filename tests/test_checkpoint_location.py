"""Where checkpoints can live: local folders, `file://` URIs and the remote store orbax writes
to (`gs://`), checked against orbax-checkpoint's own path and TensorStore spec builders; every
other URI refused in one line before anything is written; and a directory that is a file
refused at once."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew import Trainer
from dew.checkpoints import Checkpointer
from dew.checkpoints._location import checkpoint_location, is_remote
from dew.config import TrainerConfig
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.steps import TrainState

ALLOWED = "use a local folder, a file:///absolute/path URI or a gs://bucket/folder URI."


def _orbax_writes(location):
    """Whether orbax-checkpoint can write checkpoints at `location`: its path library reads
    it, and its TensorStore spec builder takes it (no network is reached)."""
    from etils import epath
    from orbax.checkpoint._src.serialization import tensorstore_utils

    try:
        epath.Path(location)
        tensorstore_utils.build_kvstore_tspec(location, name="leaf")
    except (KeyError, ValueError):
        return False
    return True


SCHEMES = st.from_regex(r"[a-z][a-z0-9+.-]{0,7}", fullmatch=True).filter(lambda s: s != "file")


@settings(max_examples=20)  # orbax's spec builder takes about 0.1 s an example
@given(scheme=SCHEMES)
def test_a_uri_is_accepted_exactly_when_orbax_writes_to_it(scheme):
    uri = f"{scheme}://bucket/runs"
    if _orbax_writes(uri):
        assert checkpoint_location(uri) == uri and is_remote(uri)
        return
    message = (
        f"checkpoint_dir {uri!r} is a URI of scheme {scheme!r}, which orbax-checkpoint "
        f"cannot write checkpoints to: {ALLOWED}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        checkpoint_location(uri)


def test_gs_is_the_remote_scheme_orbax_writes_to():
    assert _orbax_writes("gs://bucket/runs") and is_remote("gs://bucket/runs")
    assert not any(_orbax_writes(f"{scheme}://bucket/runs") for scheme in ("s3", "az", "hf"))


@pytest.mark.parametrize(
    ("given_path", "expected"),
    [
        ("runs", "runs"),
        ("/abs/runs", "/abs/runs"),
        ("runs/a://b", "runs/a://b"),  # "://" past the start: a local path
        ("file:relative", "file:relative"),  # no "//": a local folder named so
        ("file:///abs/my%20runs", "/abs/my runs"),
        ("file://localhost/abs/runs", "/abs/runs"),
        ("FILE:///abs", "/abs"),
        ("gs://bucket/runs", "gs://bucket/runs"),
        ("GS://bucket/Runs", "gs://bucket/Runs"),  # orbax reads the scheme in lower case
    ],
)
def test_what_is_accepted_and_what_orbax_is_given(given_path, expected):
    location = checkpoint_location(given_path)
    assert location == expected
    absolute = location if is_remote(location) else os.path.abspath(location)
    assert _orbax_writes(absolute)


def test_orbax_itself_takes_no_file_uri_nor_an_upper_case_scheme():
    """Why dew reads `file://` itself and writes the scheme in lower case."""
    assert not _orbax_writes("file:///abs/runs")
    assert not _orbax_writes("GS://bucket/runs")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3://bucket/runs", "is a URI of scheme 's3', which orbax-checkpoint cannot write "),
        ("memory://runs", "is a URI of scheme 'memory'"),
        ("foo://x", "is a URI of scheme 'foo'"),
        ("file://host/runs", "names no local folder: a file:// URI names one by its absolute"),
        ("file://", "names no local folder"),
        ("gs:///runs", "names no bucket: write it as gs://bucket/folder."),
    ],
)
def test_other_uris_are_refused_in_one_line(uri, message):
    with pytest.raises(ValueError, match=r"^checkpoint_dir ") as caught:
        checkpoint_location(uri)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"^TrainerConfig\.checkpoint_dir "):
        TrainerConfig(checkpoint_dir=uri)


@pytest.fixture(scope="module")
def state():
    model = CausalTransformer(4, 16, 1, 2, 32, 16, key=jax.random.key(0))
    return TrainState.create(LMObjective(model, seq_len=8), optax.adam(1e-2), key=jax.random.key(1))


def test_a_trainer_refuses_a_uri_orbax_cannot_write_to(state):
    objective = LMObjective(CausalTransformer(4, 16, 1, 2, 32, 16, key=jax.random.key(0)), 8)
    with pytest.raises(ValueError, match=r"^checkpoint_dir 'foo://x' is a URI of scheme 'foo'"):
        Trainer(objective, optax.adam(1e-2), key=jax.random.key(0), checkpoint_dir="foo://x")
    trainer = Trainer(
        objective, optax.adam(1e-2), key=jax.random.key(0), checkpoint_dir="gs://bucket/runs"
    )
    assert trainer.checkpoint_dir == "gs://bucket/runs"  # accepted; nothing reached yet


def test_a_checkpointer_at_a_file_uri_saves_and_restores_there(state, tmp_path):
    folder = tmp_path / "my runs"
    with Checkpointer(folder.as_uri()) as checkpoints:  # file:///.../my%20runs
        assert checkpoints.directory == str(folder)
        checkpoints.save(3, state)
        checkpoints.wait()
    assert (folder / "3").is_dir()
    with Checkpointer(f"file://{folder}") as checkpoints:
        restored, _ = checkpoints.restore(state)
    assert int(restored.step) == int(state.step)


def test_a_checkpointer_on_a_file_refuses_at_once(tmp_path):
    """Before, orbax's save threads waited on it for ever; now the constructor refuses."""
    (tmp_path / "afile").write_text("not a folder\n")
    with pytest.raises(NotADirectoryError) as caught:
        Checkpointer(tmp_path / "afile")
    assert caught.value.filename == str(tmp_path / "afile")
    with pytest.raises(NotADirectoryError):
        Checkpointer((tmp_path / "afile").as_uri())
    with pytest.raises(ValueError, match=r"^checkpoint directory 'foo://x' is a URI"):
        Checkpointer("foo://x")


@pytest.mark.slow  # a `dew` subprocess
def test_dew_train_refuses_an_unknown_scheme_before_writing_anything(tmp_path):
    command = [sys.executable, "-m", "dew.cli", "train", "--checkpoint-dir", "foo://x/runs"]
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "dew train: trainer.checkpoint_dir 'foo://x/runs' is a URI of scheme 'foo', which "
        f"orbax-checkpoint cannot write checkpoints to: {ALLOWED} (while applying the "
        "override {'trainer.checkpoint_dir': 'foo://x/runs'})\n"
    )
    assert list(pathlib.Path(tmp_path).iterdir()) == []
