"""The vision configs' default FID: scored once pytorch-fid's weights are at the default
place, skipped with one line naming the missing file when they are not.

The weights here are random (the shapes of pytorch-fid's 470 arrays) in a `.safetensors`
file that `$DEW_FID_WEIGHTS` names. The default weights are checked by their SHA-256
prefix, and `$DEW_FID_WEIGHTS` is still the default (it says where the published file is,
not that another network is wanted), so a random file there is refused: the tests that
score set the expected prefix to their file's own digest instead of skipping the check.

The configs here leave out their shape scores (`objective.kwargs.shape_scores=false`), FID
alone being under test (tests/test_sample_quality.py scores the built-in runs)."""

import contextlib
import io
import warnings

import numpy as np
import pytest
from _weights import random_inception_weights

from dew.cli import main
from dew.config import builtin, evaluate_run, objective_shapes, override
from dew.io import sha256_of
from dew.metrics._fid import FID
from dew.nn import inception
from dew.objectives.base import SkipsMetrics

FID_URL = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/"


def _fid_only(name):
    """The built-in configuration `name` without its shape scores."""
    return override(builtin(name), {"objective.kwargs.shape_scores": False})


def _run(arguments):
    """`dew ARGUMENTS` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(arguments)
    return status, out.getvalue(), err.getvalue()


def test_without_weights_image_diffusion_skips_fid_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("DEW_FID_WEIGHTS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    objective = objective_shapes(_fid_only("tiny_diffusion"))
    assert objective.default_metrics() == ()
    assert isinstance(objective, SkipsMetrics)
    assert not isinstance(objective_shapes(builtin("tiny_lm")), SkipsMetrics)
    cached = tmp_path / ".cache" / "dew" / "pt_inception-2015-12-05-6726825d.pth"
    assert objective.skipped_metrics() == {
        "fid": f"no weights at {cached} (save pytorch-fid's {FID_URL}"
        "pt_inception-2015-12-05-6726825d.pth there, or point $DEW_FID_WEIGHTS at a copy)"
    }


def test_clips_get_no_fid_to_skip(tmp_path, monkeypatch):
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"not read")  # present, but clips never load it
    monkeypatch.setenv("DEW_FID_WEIGHTS", str(weights))
    objective = objective_shapes(_fid_only("tiny_video_diffusion"))
    assert objective.default_metrics() == () and objective.skipped_metrics() == {}


def test_weights_that_are_not_the_published_file_are_an_error_not_a_skip(tmp_path, monkeypatch):
    weights = tmp_path / "other.pth"
    weights.write_bytes(b"another network")
    monkeypatch.setenv("DEW_FID_WEIGHTS", str(weights))
    objective = objective_shapes(_fid_only("tiny_diffusion"))
    assert objective.skipped_metrics() == {}
    with pytest.raises(ValueError, match=r"other\.pth.*does not start with '6726825d'"):
        objective.default_metrics()


@pytest.mark.slow
def test_without_weights_dew_eval_and_evaluate_run_say_fid_was_skipped(tmp_path, monkeypatch):
    missing = tmp_path / "absent.pth"
    monkeypatch.setenv("DEW_FID_WEIGHTS", str(missing))
    folder = _tiny_diffusion_run(tmp_path)
    status, out, err = _run(["eval", str(folder)])
    assert status == 0, err
    lines = out.splitlines()
    skipped = (
        f"fid skipped: no weights at {missing}, named by $DEW_FID_WEIGHTS (save pytorch-fid's "
        f"{FID_URL}pt_inception-2015-12-05-6726825d.pth there)"
    )
    assert lines[0] == skipped
    assert lines[1] == (
        "step 1  no scores: fid skipped (restored the step-1 checkpoint's EMA params)"
    )
    # The library call with the default metrics says it too, in one warning line.
    with pytest.warns(UserWarning, match="^fid skipped: no weights at ") as caught:
        result = evaluate_run(folder)
    assert [str(warning.message) for warning in caught] == [skipped]
    assert result.step == 1 and result.scores == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # metrics chosen: nothing skipped, nothing said
        assert evaluate_run(folder, metrics=[]).scores == {}


def _tiny_diffusion_run(root):
    """A one-step tiny_diffusion run (CI-sized DiT) with 4 validation rows in one batch;
    trained in this process under whatever FID weights the environment names."""
    arguments = [
        "train",
        "--config",
        "tiny_diffusion",
        "--checkpoint-dir",
        str(root),
        "--steps",
        "1",
        "--quiet",
    ]
    sets = [
        "model.kwargs.width=32",
        "model.kwargs.depth=1",
        "model.kwargs.heads=2",
        "data.kwargs.rows=32",
        "data.kwargs.val_fraction=0.125",
        "trainer.batch_size=4",
        "trainer.eval_every=1000",
        "trainer.checkpoint_every=1",
        "trainer.log_every=1",
        "trainer.preview=false",
        "objective.kwargs.sampling.steps=2",
        "objective.kwargs.shape_scores=false",
    ]
    status, _, err = _run([*arguments, *[part for item in sets for part in ("--set", item)]])
    assert status == 0, err
    return root / "tiny-diffusion"


@pytest.mark.slow
def test_dew_eval_with_weights_scores_fid_loading_them_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DEW_FID_WEIGHTS", str(tmp_path / "absent.pth"))
    folder = _tiny_diffusion_run(tmp_path)  # trained without weights: no FID while training
    weights = tmp_path / "random_inception.safetensors"
    random_inception_weights(weights)
    monkeypatch.setenv("DEW_FID_WEIGHTS", str(weights))
    monkeypatch.setattr(inception, "_FID_WEIGHTS_SHA256_PREFIX", sha256_of(weights)[:8])
    loads = []
    load = inception.FIDInceptionV3.load.__func__

    def counted(cls, *args, **kwargs):
        loads.append(args)
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(inception.FIDInceptionV3, "load", classmethod(counted))
    (metric,) = objective_shapes(_fid_only("tiny_diffusion")).default_metrics()
    assert isinstance(metric, FID) and metric.name == "fid"
    loads.clear()
    status, out, err = _run(["eval", str(folder)])
    assert status == 0, err
    assert len(loads) == 1  # the 91 MB weights: read once per command
    assert "skipped" not in out
    # what it printed is the FID of the checkpoint's samples against the 4 real rows
    # (random weights' features are small: the value is too, but not zero)
    value = evaluate_run(folder, metrics=[metric]).scores["fid"]
    assert np.isfinite(value) and value > 0.0
    assert out.splitlines()[0] == f"step 1  fid {value:.4f}"
