"""WandbTracker in W&B's offline mode, read back from the run's own transaction log and files.

W&B 0.31 writes no summary or config files offline: everything is in the run's
`run-<id>.wandb` log (LevelDB-style blocks of protobuf `Record`s), read here with
W&B's own protobuf classes.
"""

import html
import json
import math
import pathlib
import struct
import subprocess
import sys
import time
import types
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from _grids import check_gif_grid, check_png_grid, uint8

from dew.artifacts import Clips, Images, Representations, TokenRows, TokenScores
from dew.data.tokenizers import BytesTokenizer
from dew.naming import Split, preview_name
from dew.telemetry.records import FitEnded, RunRecord, record_from_json
from dew.tracking import Preview, preview_files
from dew.tracking._render import histogram
from dew.tracking.wandb import WandbTracker

# wandb and its record format, imported when this file's tests run (the fixture below), not
# when pytest collects it: each xdist worker collects the whole suite.
wandb: Any = None
DecodeError: Any = None
wandb_internal_pb2: Any = None


def _import_wandb():
    """Imports wandb and its record format once (skipping the test where wandb is missing);
    test_cli_trackers.py's readers of a log call it too."""
    global wandb, DecodeError, wandb_internal_pb2
    if wandb_internal_pb2 is None:
        wandb = pytest.importorskip("wandb")
        from google.protobuf.message import DecodeError
        from wandb.proto import wandb_internal_pb2


@pytest.fixture(scope="module", autouse=True)
def _wandb_imported():
    _import_wandb()


BLOCK = 32768  # the log's block size; a record header is 7 bytes


class _PartialLogError(Exception):
    """The log ends in a record W&B's service has not finished writing."""


def _log_records(path):
    """The protobuf records of a `.wandb` transaction log. A log read while W&B's service
    is writing it can end in part of a record: that raises `_PartialLogError`."""
    _import_wandb()
    data = path.read_bytes()
    if len(data) < 7:
        raise _PartialLogError(path)
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log (header {data[:7]!r})"
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = BLOCK - position % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        if position + 7 + length > len(data):
            raise _PartialLogError(path)
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first, middle/last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(pending)
            except DecodeError as error:
                raise _PartialLogError(path) from error
            yield record


def _set(target, item):
    keys = list(item.nested_key) or [item.key]
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = json.loads(item.value_json)


def _finished_log(folder, run_id, timeout=60.0):
    """The records of a finished run's log. W&B's service may still be writing the
    log when `finish()` returns, so wait until its `exit` record is there."""
    path, deadline = folder / f"run-{run_id}.wandb", time.monotonic() + timeout
    while True:
        try:
            records = list(_log_records(path)) if path.exists() else []
        except _PartialLogError:
            records = []
        if any(record.WhichOneof("record_type") == "exit" for record in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} holds no whole log with an exit record after {timeout} s")
        time.sleep(0.1)


def _read(tracker):
    """What the run's log holds: history rows by step, summary, config, exit code."""
    folder = pathlib.Path(tracker.run.dir).parent
    rows, summary, config, run, exit_code = {}, {}, {}, None, None
    for record in _finished_log(folder, tracker.run.id):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for item in record.history.item:
                _set(row, item)
            rows.setdefault(row["_step"], {}).update(row)
        elif kind == "summary":
            for item in record.summary.update:
                _set(summary, item)
        elif kind == "config":
            for item in record.config.update:
                _set(config, item)
        elif kind == "run":
            run = record.run
        elif kind == "exit":
            exit_code = record.exit.exit_code
    config.pop("_wandb", None)
    return types.SimpleNamespace(
        rows=rows, summary=summary, config=config, run=run, exit_code=exit_code, files=folder
    )


def _media(read, item):
    return (read.files / "files" / item["path"]).read_bytes()


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    """W&B offline and silent, with every folder it writes under a temporary one."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.setenv(name, str(home / name.lower()))
        yield home


RNG = np.random.default_rng(0)
GENERATED, REAL = RNG.random((2, 3, 6, 5, 3)).astype(np.float32)
IMAGES = Preview(
    Images(jnp.asarray(GENERATED), jnp.asarray(REAL), labels=jnp.asarray([2, 0, 1])),
    classes=("square", "disc", "bar"),
)
CLIPS = Clips(jnp.asarray(RNG.random((2, 4, 9, 7, 3)), jnp.float32))
TOKENS = Preview(
    TokenRows(jnp.asarray([list(b"hi!"), list(b"ok.")]), jnp.asarray([[False, True, True]] * 2)),
    tokenizer=BytesTokenizer(),
)
FEATURES = Representations(jnp.asarray(RNG.standard_normal((10, 4)), jnp.float32))
TUNED = Images(jnp.asarray(RNG.random((2, 6, 5, 3)), jnp.float32))  # a second stage's
RUN_RECORD = RunRecord(model={"name": "mlp"}, data={}, optim={"learning_rate": 0.1})


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One run that received every kind of report, finished and read back."""
    folder = tmp_path_factory.mktemp("wandb-full") / "not" / "yet"
    tracker = WandbTracker("dew-tests", "full", offline=True, dir=folder)
    global_runs = [wandb.run]
    params = {
        "optimizer": {"name": "adam", "betas": (0.9, 0.99), "learning_rate": 1e-3},
        "data": {"train": {"batch_size": 8, "limit": None}},
        "weights": np.array([1, 2]),
        "scale": np.float32(0.5),
        "split": Split.VALIDATION,
    }
    tracker.log_params(params)
    tracker.log_params({"optimizer": {"name": "adam"}})  # the same value again
    tracker.log_metrics({"lm/train/loss": 2.0, "lm/validation/psnr": float("inf")}, step=0)
    tracker.log_metrics({"lm/train/loss": float("nan"), "lm/validation/psnr": -np.inf}, step=5)
    tracker.log_artifact("run_record", RUN_RECORD)  # at the latest step, 5
    tracker.log_metrics({"lm/train/loss": np.float32(0.5), "lm/train/count": 3}, step=10)
    tracker.log_artifact("diffusion/validation/samples", IMAGES, step=10)
    tracker.log_artifact(preview_name("tune", Split.VALIDATION, "samples"), TUNED, step=10)
    tracker.log_artifact("diffusion/validation/clips", CLIPS, step=11)
    tracker.log_artifact("lm/validation/text", TOKENS, step=11)
    tracker.log_artifact("jepa/validation/features", FEATURES, step=11)
    tracker.log_artifact("notes", {"text": "three epochs", "score": float("nan")}, step=11)
    tracker.log_artifact("fit_ended", FitEnded(status="completed", step=12), step=12)
    global_runs.append(wandb.run)
    tracker.close()
    global_runs.append(wandb.run)
    return types.SimpleNamespace(
        tracker=tracker, read=_read(tracker), folder=folder, global_runs=global_runs
    )


def test_the_run_is_offline_under_dir_and_never_global(full):
    assert full.global_runs == [None, None, None]
    assert full.tracker.run.offline
    assert pathlib.Path(full.tracker.run.dir).is_relative_to(full.folder.resolve())
    assert (full.read.run.project, full.read.run.display_name) == ("dew-tests", "full")
    assert full.read.exit_code == 0


def test_scalars_are_history_rows_at_their_steps(full):
    rows = full.read.rows
    assert rows[0]["lm/train/loss"] == 2.0 and rows[0]["lm/validation/psnr"] == math.inf
    assert math.isnan(rows[5]["lm/train/loss"]) and rows[5]["lm/validation/psnr"] == -math.inf
    assert (rows[10]["lm/train/loss"], rows[10]["lm/train/count"]) == (0.5, 3.0)
    assert sorted(rows) == [0, 5, 10, 11, 12]
    summary = full.read.summary
    assert (summary["lm/train/loss"], summary["lm/validation/psnr"]) == (0.5, -math.inf)


def test_params_are_the_flattened_config(full):
    assert full.read.config == {
        "optimizer/name": "adam",
        "optimizer/betas": [0.9, 0.99],
        "optimizer/learning_rate": 1e-3,
        "data/train/batch_size": 8,
        "data/train/limit": None,
        "weights": [1, 2],
        "scale": 0.5,
        "split": "validation",
    }


def test_records_are_html_panels_holding_their_json(full):
    rows = full.read.rows
    for step, key, record in [
        (5, "reporting/run_record", RUN_RECORD),
        (12, "reporting/fit_ended", FitEnded(status="completed", step=12)),
    ]:
        assert rows[step][key]["_type"] == "html-file"
        text = _media(full.read, rows[step][key]).decode()
        assert text == f"<pre>{html.escape(record.to_json())}</pre>"
        assert record_from_json(html.unescape(text[5:-6])) == record
    notes = _media(full.read, rows[11]["artifacts/notes"]).decode()
    assert json.loads(html.unescape(notes[5:-6])) == {"text": "three epochs", "score": "NaN"}


def test_images_and_clips_are_the_local_trackers_grids_captioned(full):
    rows = full.read.rows
    ((_, content),) = preview_files(IMAGES)
    item = rows[10]["diffusion/validation/samples/grid"]
    assert item["_type"] == "image-file"
    assert item["caption"] == "3 samples, generated above real rows, captioned bar, square, disc"
    assert _media(full.read, item) == content
    lines = [("generated", uint8(GENERATED)), ("real", uint8(REAL))]
    check_png_grid(_media(full.read, item), lines, ["bar", "square", "disc"])
    ((_, content),) = preview_files(CLIPS)
    item = rows[11]["diffusion/validation/clips/grid"]
    assert (item["_type"], item["caption"]) == ("video-file", "2 samples, generated rows")
    assert _media(full.read, item) == content
    check_gif_grid(content, [("generated", uint8(CLIPS.generated))], None)


def test_two_stages_previews_keep_their_own_keys(full):
    row = full.read.rows[10]
    for stage, shown in (("diffusion", IMAGES), ("tune", TUNED)):
        ((_, content),) = preview_files(shown)
        assert _media(full.read, row[f"{stage}/validation/samples/grid"]) == content
    assert sorted(key for key in row if "/samples/" in key) == [
        "diffusion/validation/samples/grid",
        "tune/validation/samples/grid",
    ]


def test_token_rows_are_a_table_and_a_page_of_text_and_representations_a_histogram(full):
    rows = full.read.rows
    table = json.loads(_media(full.read, rows[11]["lm/validation/text/tokens"]))
    assert table["columns"] == ["row", "prompt", "continuation", "tokens", "mask"]
    assert table["data"] == [
        [0, "h", "i!", list(b"hi!"), [False, True, True]],
        [1, "o", "k.", list(b"ok."), [False, True, True]],
    ]
    page = _media(full.read, rows[11]["lm/validation/text/text"]).decode()
    assert page == f"<pre>{html.escape(preview_files(TOKENS)[1][1].decode())}</pre>"
    assert "h⟨|⟩i!" in html.unescape(page)
    spread = rows[11]["jepa/validation/features/spread"]
    expected = histogram(FEATURES.features)
    assert spread["_type"] == "histogram"
    assert spread["values"] == expected["counts"]
    np.testing.assert_allclose(spread["bins"], expected["edges"])


def test_mistakes_are_refused_before_anything_is_sent(tmp_path):
    # offline=True explicitly: W&B reads WANDB_MODE once per process, so an earlier W&B
    # run in the same test session (the docs) would decide the mode otherwise.
    tracker = WandbTracker("dew-tests", "mistakes", offline=True, dir=tmp_path)
    assert tracker.run.offline and wandb.run is None
    tracker.log_params({"optimizer": {"learning_rate": 0.1}})
    with pytest.raises(
        ValueError, match=r"parameter 'optimizer/learning_rate' was already logged as 0\.1.*0\.2"
    ):
        tracker.log_params({"seed": 0, "optimizer": {"learning_rate": 0.2}})
    tracker.log_metrics({"lm/train/loss": 1.0}, step=4)
    with pytest.raises(ValueError, match="step 3 comes after step 4"):
        tracker.log_metrics({"lm/train/loss": 9.0}, step=3)
    with pytest.raises(ValueError, match="step 2 comes after step 4"):
        tracker.log_artifact("fit_ended", FitEnded(status="failed", step=2), step=2)
    with pytest.raises(TypeError, match="metric 'lm/train/loss' must be a real scalar"):
        tracker.log_metrics({"lm/train/loss": np.ones(2)}, step=5)
    with pytest.raises(TypeError, match="TokenScores has no preview form"):
        tracker.log_artifact("scores", TokenScores(jnp.ones((1, 2)), jnp.ones((1, 2))), step=5)
    with pytest.raises(TypeError, match="cannot record artifact 'bad': object is not"):
        tracker.log_artifact("bad", object(), step=5)
    with pytest.raises(ValueError, match="artifact name 'a/b' may not contain '/'"):
        tracker.log_artifact("a/b", 1, step=5)
    with pytest.raises(ValueError, match="a preview's name is stage/split/name, got 'samples'"):
        tracker.log_artifact("samples", IMAGES, step=5)
    tracker.log_metrics({"lm/train/loss": 0.5}, step=5)
    tracker.close()
    tracker.close()  # closing twice is harmless
    with pytest.raises(RuntimeError, match="is closed; it records nothing more"):
        tracker.log_metrics({"lm/train/loss": 1.0}, step=6)
    with pytest.raises(RuntimeError, match="is closed"):
        tracker.log_params({"seed": 1})
    read = _read(tracker)
    assert read.config == {"optimizer/learning_rate": 0.1}
    assert {step: row["lm/train/loss"] for step, row in read.rows.items()} == {4: 1.0, 5: 0.5}
    assert read.exit_code == 0


def test_a_fit_that_did_not_complete_finishes_the_run_with_exit_code_1(tmp_path):
    with WandbTracker("dew-tests", "failed", offline=True, dir=tmp_path) as tracker:
        tracker.log_artifact("fit_ended", FitEnded(status="failed", step=3, error="boom"), step=3)
        tracker.log_artifact("fit_ended", FitEnded(status="completed", step=5), step=5)
    assert _read(tracker).exit_code == 1


def test_the_context_manager_never_hides_the_exception_in_flight(tmp_path, monkeypatch):
    with (
        pytest.raises(KeyError, match="in the loop"),
        WandbTracker("dew-tests", "raised", offline=True, dir=tmp_path / "raised") as tracker,
    ):
        raise KeyError("in the loop")
    assert tracker.closed and _read(tracker).exit_code == 1

    tracker = WandbTracker("dew-tests", "broken close", offline=True, dir=tmp_path / "broken")
    finish = tracker.run.finish

    def fail(*args, **kwargs):
        raise OSError("service went away")

    monkeypatch.setattr(tracker.run, "finish", fail)
    with pytest.raises(ZeroDivisionError) as caught, tracker:
        1 / 0  # noqa: B018
    assert any("closing WandbTracker also failed: OSError" in n for n in caught.value.__notes__)
    finish(exit_code=1)


def test_bad_arguments_are_refused():
    with rejects(ValueError, "project must be a non-empty string", parameter="project"):
        WandbTracker(3, offline=True)
    with pytest.raises(ValueError, match="project must be a non-empty string, got ''"):
        WandbTracker("", offline=True)


def test_a_missing_wandb_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"install dew-ml\[wandb\]"):
        WandbTracker("missing", offline=True)


def test_importing_dew_and_its_wandb_module_does_not_import_wandb():
    code = "import sys, dew, dew.tracking, dew.tracking.wandb\nprint('wandb' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
