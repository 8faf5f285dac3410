"""Hostile names and steps: every tracker refuses them before writing anything, and nothing
lands outside the run folder.

The calls go past the test session's runtime type checker (`inspect.unwrap`), as a user
without it calls them, so it is dew's own checks that refuse the bad values.
"""

import inspect
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from dew.artifacts import Images, TokenRows
from dew.telemetry.records import FitEnded, FitStarted
from dew.tracking import InMemoryTracker, LocalTracker, Trackers, read_journal

IMAGES = Images(jnp.linspace(0.0, 1.0, 2 * 4 * 4 * 3).reshape(2, 4, 4, 3))
TOKENS = TokenRows(jnp.asarray([[1, 2, 3]]))


def _hostile_names(root):
    return [
        "../x",
        "../../../escaped",
        str(root / "absolute-escaped"),
        "/etc/escaped",
        "a/b",
        "a\\b",
        "..\\..\\escaped",
        "",
        " ",
        ".",
        "..",
        "a\x00b",
        "\x00",
        "line\nbreak",
        "x" * 256,
        "é" * 128,  # 256 UTF-8 bytes
        "\udcff",  # a lone surrogate: not UTF-8
    ]


def _hostile_steps(root):
    return [
        "../../../escaped",
        str(root / "absolute-step"),
        "/etc/escaped",
        "3",
        3.0,
        True,
        -1,
        np.int64(-2),
        1.5,
        [3],
    ]


def _call(tracker, method, *args, **kwargs):
    """Call `tracker.method` past the session's runtime type checker."""
    return inspect.unwrap(getattr(type(tracker), method))(tracker, *args, **kwargs)


def _files(root):
    return sorted(path for path in pathlib.Path(root).rglob("*") if path.is_file())


def _snapshot(folder):
    return {path: path.stat().st_size for path in _files(folder)}


def _local(run):
    return LocalTracker(run)


def _tensorboard(run):
    pytest.importorskip("tensorboard")
    from dew.tracking import TensorBoardTracker

    return TensorBoardTracker(run)


def _mlflow(run):
    pytest.importorskip("mlflow")
    from dew.tracking import MLflowTracker

    return MLflowTracker("hostile", "run", uri=str(run / "mlruns"))


def _wandb(run):
    pytest.importorskip("wandb")
    from dew.tracking import WandbTracker

    return WandbTracker("hostile", "run", offline=True, dir=run)


def _fanout(run):
    return Trackers(LocalTracker(run / "local"), InMemoryTracker())


TRACKERS = {
    "local": _local,
    "tensorboard": _tensorboard,
    "mlflow": _mlflow,
    "wandb": _wandb,
    "trackers": _fanout,
}
# W&B's own service writes its log in the background, so only the others are checked
# byte for byte for "nothing written".
STILL = {"local", "tensorboard", "mlflow", "trackers"}


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run folder three levels down, so `../../..` stays inside `tmp_path`; W&B's
    own folders live inside it too."""
    folder = tmp_path / "a" / "b" / "c" / "run"
    folder.mkdir(parents=True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(name, str(folder / name.lower()))
    return folder


@pytest.mark.parametrize("kind", sorted(TRACKERS))
def test_hostile_names_and_steps_are_refused_before_anything_is_written(kind, run, tmp_path):
    tracker = TRACKERS[kind](run)
    try:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=1)  # something to keep
        before = _snapshot(run)
        refused = []
        for name in _hostile_names(tmp_path):
            for value in (IMAGES, TOKENS, FitEnded("completed", 1), {"note": 1}):
                with pytest.raises((ValueError, TypeError)) as caught:
                    _call(tracker, "log_artifact", name, value, step=2)
                refused.append(str(caught.value))
            for preview in (f"{name}/validation/samples", f"lm/{name}/x", f"lm/validation/{name}"):
                for value in (IMAGES, TOKENS):  # a hostile part of a preview's name
                    with pytest.raises((ValueError, TypeError)) as caught:
                        _call(tracker, "log_artifact", preview, value, step=2)
                    refused.append(str(caught.value))
        for step in _hostile_steps(tmp_path):
            for name, value in (
                ("lm/validation/samples", IMAGES),
                ("fit_ended", FitEnded("completed", 1)),
                ("notes", {"note": 1}),
            ):
                with pytest.raises((ValueError, TypeError)) as caught:
                    _call(tracker, "log_artifact", name, value, step=step)
                refused.append(str(caught.value))
            with pytest.raises((ValueError, TypeError)) as caught:
                _call(tracker, "log_metrics", {"lm/train/loss": 2.0}, step=step)
            refused.append(str(caught.value))
        if kind in STILL:
            assert _snapshot(run) == before
        named = ("artifact name", "step must", "a preview's name", "stage", "split", "preview")
        unnamed = [m for m in refused if not m.startswith(named)]
        assert unnamed == []
    finally:
        tracker.close()
    outside = [path for path in _files(tmp_path) if not path.is_relative_to(run)]
    assert outside == []
    assert not any("escaped" in str(path) for path in _files(tmp_path))


@pytest.mark.parametrize("kind", sorted(TRACKERS))
def test_numpy_integer_steps_are_steps(kind, run):
    with TRACKERS[kind](run) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=np.int64(3))
        tracker.log_artifact("lm/validation/samples", IMAGES, step=np.int32(4))
        tracker.log_artifact("fit_started", FitStarted("lm", 0, 5), step=np.uint8(5))
    if kind in ("local", "trackers"):
        folder = run if kind == "local" else run / "local"
        journal = read_journal(folder)
        assert journal.scalars == {"lm/train/loss": [(3, 1.0)]}
        assert journal.artifacts[0][:2] == ("lm/validation/samples", 4)
        assert journal.records[0][:2] == ("fit_started", 5)
        assert (folder / "previews" / "lm" / "validation" / "samples" / "4" / "grid.png").is_file()


def test_a_long_parameter_uploaded_to_a_path_from_its_key_is_checked_first(run):
    pytest.importorskip("mlflow")
    with _mlflow(run) as tracker:
        with pytest.raises(ValueError, match=r"params/\.\./\.\./x\.txt.*may not be '\.' or"):
            tracker.log_params({"..": {"..": {"x": "y" * 7000}}})
        assert tracker.client.list_artifacts(tracker.run_id) == []
        assert tracker.client.get_run(tracker.run_id).data.params == {}
    assert [path for path in _files(run.parent) if not path.is_relative_to(run)] == []


def test_the_path_segment_rule_names_the_value_and_what_is_allowed():
    from dew.naming import check_index, check_path_segment

    with pytest.raises(ValueError, match=r"^step must be an integer >= 0, got -1\.$"):
        check_index("step", -1)
    with pytest.raises(TypeError, match=r"^step must be an integer >= 0, got '3'\.$"):
        check_index("step", "3")
    assert check_index("step", np.int64(7)) == 7 and type(check_index("step", np.int64(7))) is int
    with pytest.raises(ValueError, match=r"artifact name '\.\.' may not be '\.' or '\.\.'; a path"):
        check_path_segment("artifact name", "..")
    long = "x" * 300
    with pytest.raises(ValueError, match=r"is 300 UTF-8 bytes long; .* at most 255 UTF-8 bytes"):
        check_path_segment("artifact name", long)
    assert check_path_segment("artifact name", "x" * 255) == "x" * 255
    assert check_path_segment("artifact name", "samples-1.v2 (copy)") == "samples-1.v2 (copy)"


def test_the_journal_line_of_a_refused_preview_is_not_written(run):
    message = r"preview name '\.\.' may not be"
    with LocalTracker(run) as tracker, pytest.raises(ValueError, match=message):
        tracker.log_artifact("lm/validation/..", IMAGES, step=1)
    assert (run / "records.jsonl").read_text() == ""
    assert not (run / "previews").exists()
