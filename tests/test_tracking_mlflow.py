"""MLflowTracker against real MLflow stores, everything read back through MlflowClient."""

import json
import os
import pathlib
import subprocess
import sys
import threading
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from _grids import check_png_grid, uint8

from dew.artifacts import Clips, Images, Representations, TokenRows, TokenScores
from dew.data.tokenizers import BytesTokenizer
from dew.naming import Split, preview_name
from dew.telemetry.records import (
    FitEnded,
    FitStarted,
    RunRecord,
    TrialFinished,
    record_from_json,
)
from dew.tracking import Preview, preview_files
from dew.tracking.mlflow import MLflowTracker

# MLflow and its names, imported when this file's tests run (the fixture below), not when
# pytest collects it: each xdist worker collects the whole suite, and importing MLflow took 7 s
# of each collection.
mlflow: Any = None
MlflowException: Any = None
MlflowClient: Any = None


def _import_mlflow():
    """Imports MLflow and its names once (skipping the test where MLflow is missing); the
    previews' tests in other files read artifacts through `_client` too."""
    global mlflow, MlflowException, MlflowClient
    if MlflowClient is None:
        mlflow = pytest.importorskip("mlflow")
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient


@pytest.fixture(scope="module", autouse=True)
def _mlflow_imported():
    _import_mlflow()


# MLflow's SQL store configures its SQLAlchemy mappers with a loader SQLAlchemy deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

LARGEST = sys.float_info.max  # what a SQL store keeps for an infinity


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One working folder per module whose `runs/mlflow.db` is the shared SQLite store:
    creating a SQLite store runs MLflow's migrations, which takes seconds."""
    return tmp_path_factory.mktemp("mlflow").resolve()


@pytest.fixture(scope="module")
def store(base):
    return f"sqlite:///{base / 'runs' / 'mlflow.db'}"


@pytest.fixture
def tracker(store, request):
    tracker = MLflowTracker("tests", request.node.name, uri=store)
    yield tracker
    tracker.close()


def _client(tracker):
    """A fresh client on the tracker's store, so reads never share the tracker's object."""
    _import_mlflow()
    return MlflowClient(tracking_uri=tracker.uri)


def _history(tracker, key):
    return [(m.step, m.value) for m in _client(tracker).get_metric_history(tracker.run_id, key)]


def _files(tracker, path):
    """Every file under `path` in the run's artifacts, as run-relative paths."""
    found = []
    for info in _client(tracker).list_artifacts(tracker.run_id, path):
        found.extend(_files(tracker, info.path) if info.is_dir else [info.path])
    return sorted(found)


def _download(tracker, path, folder):
    return pathlib.Path(_client(tracker).download_artifacts(tracker.run_id, path, str(folder)))


def _status(tracker):
    return _client(tracker).get_run(tracker.run_id).info.status


def test_metrics_are_one_batch_per_report_at_its_step(tracker, monkeypatch):
    batches = []
    send = tracker.client.log_batch

    def spy(run_id, **kwargs):
        batches.append(kwargs)
        return send(run_id, **kwargs)

    monkeypatch.setattr(tracker.client, "log_batch", spy)
    tracker.log_metrics({"lm/train/loss": 2.0, "lm/validation/psnr": float("inf")}, step=0)
    tracker.log_metrics({"lm/train/loss": float("nan"), "lm/validation/psnr": -np.inf}, step=5)
    tracker.log_metrics({"lm/train/loss": np.float32(0.5), "lm/train/count": 3}, step=10)
    tracker.log_metrics({"lm/train/loss": jnp.asarray(0.25)}, step=11)
    assert len(batches) == 4
    assert [{metric.step for metric in batch["metrics"]} for batch in batches] == [
        {0},
        {5},
        {10},
        {11},
    ]
    assert all(batch["synchronous"] for batch in batches)
    loss = _history(tracker, "lm/train/loss")
    assert [step for step, _ in loss] == [0, 5, 10, 11]
    assert loss[0][1] == 2.0 and np.isnan(loss[1][1]) and loss[2:] == [(10, 0.5), (11, 0.25)]
    # MLflow's SQL stores keep NaN and hold +-inf as the largest finite float.
    assert _history(tracker, "lm/validation/psnr") == [(0, LARGEST), (5, -LARGEST)]
    assert _history(tracker, "lm/train/count") == [(10, 3.0)]


def test_a_metric_that_is_not_a_scalar_is_refused_naming_its_tag(tracker):
    with pytest.raises(TypeError, match="metric 'lm/train/loss' must be a real scalar"):
        tracker.log_metrics({"lm/train/loss": np.ones(2)}, step=0)
    assert _history(tracker, "lm/train/loss") == []


def test_params_are_flattened_and_converted_to_text(tracker, tmp_path):
    long_text = "x" * 7000
    tracker.log_params(
        {
            "optimizer": {"name": "adam", "betas": (0.9, 0.99), "learning_rate": 1e-3},
            "data": {"train": {"batch_size": 8, "shuffle": True, "limit": None}},
            "layers": [{"width": 4}, {"width": float("inf")}],
            "weights": np.array([1, 2]),
            "scale": np.float64(0.5),
            "bound": float("-inf"),
            "split": Split.VALIDATION,
            "notes": long_text,
        }
    )
    params = _client(tracker).get_run(tracker.run_id).data.params
    truncated = params.pop("notes")
    assert params == {
        "optimizer/name": "adam",
        "optimizer/betas": "[0.9, 0.99]",
        "optimizer/learning_rate": "0.001",
        "data/train/batch_size": "8",
        "data/train/shuffle": "True",
        "data/train/limit": "None",
        "layers": '[{"width": 4}, {"width": "+Inf"}]',
        "weights": "[1, 2]",
        "scale": "0.5",
        "bound": "-Inf",
        "split": "validation",
    }
    assert len(truncated) == 6000
    assert truncated.endswith("...[truncated]") and long_text.startswith(truncated[:-14])
    assert _download(tracker, "params/notes.txt", tmp_path).read_text() == long_text


def test_a_changed_param_raises_before_anything_is_sent_and_the_run_goes_on(tracker):
    tracker.log_params({"optimizer": {"learning_rate": 0.1}})
    with pytest.raises(
        ValueError,
        match=r"parameter 'optimizer/learning_rate' was already logged as '0\.1'.*'0\.2'",
    ):
        tracker.log_params({"seed": 0, "optimizer": {"learning_rate": 0.2}})
    tracker.log_params({"optimizer": {"learning_rate": 0.1}})  # the same value again is fine
    with pytest.raises(ValueError, match="parameter key 'a/b' may not contain '/'"):
        tracker.log_params({"a/b": 1})
    tracker.log_metrics({"lm/train/loss": 1.0}, step=1)
    tracker.close()
    run = _client(tracker).get_run(tracker.run_id)
    assert run.data.params == {"optimizer/learning_rate": "0.1"}
    assert run.info.status == "FINISHED"


def test_records_are_json_artifacts_named_by_type_and_step(tracker, tmp_path):
    run_record = RunRecord(model={"name": "mlp"}, data={}, optim={"learning_rate": 0.1})
    started = FitStarted(stage="lm", start_step=0, steps=10)
    restarted = FitStarted(stage="dpo", start_step=0, steps=4)
    trial = TrialFinished(trial=2, overrides={"optim.lr": 0.01}, value=float("inf"))
    ended = FitEnded(status="completed", step=10)
    tracker.log_artifact("run_record", run_record)
    tracker.log_artifact("fit_started", started, step=0)
    tracker.log_artifact("fit_started", restarted, step=0)
    tracker.log_artifact("trial", trial, step=3)
    tracker.log_artifact("fit_ended", ended, step=10)
    expected = {
        "records/run_record-none.json": run_record,
        "records/fit_started-0.json": started,
        "records/fit_started-0-2.json": restarted,
        "records/trial_finished-3.json": trial,
        "records/fit_ended-10.json": ended,
    }
    assert _files(tracker, "records") == sorted(expected)
    for path, record in expected.items():
        text = _download(tracker, path, tmp_path).read_text()
        assert text == record.to_json()
        assert record_from_json(text) == record
    tracker.close()
    assert _status(tracker) == "FINISHED"


def test_previews_are_uploaded_as_the_local_renderers_files(tracker, tmp_path):
    rng = np.random.default_rng(0)
    previews = {
        "samples": Images(jnp.asarray(rng.random((3, 6, 5, 3)), jnp.float32)),
        "clips": Clips(jnp.asarray(rng.random((2, 4, 9, 7, 1)), jnp.float32)),
        "text": TokenRows(jnp.asarray([[1, 2, 3], [4, 5, 6]]), jnp.asarray([[True] * 3] * 2)),
        "features": Representations(jnp.asarray(rng.standard_normal((10, 4)), jnp.float32)),
    }
    for name, value in previews.items():
        tracker.log_artifact(preview_name("lm", Split.VALIDATION, name), value, step=7)
    tracker.log_artifact("lm/validation/samples", previews["samples"])
    for name, value in {**previews, "samples-none": previews["samples"]}.items():
        folder = (
            "previews/lm/validation/samples/none"
            if name == "samples-none"
            else f"previews/lm/validation/{name}/7"
        )
        rendered = preview_files(value)
        assert _files(tracker, folder) == sorted(f"{folder}/{suffix}" for suffix, _ in rendered)
        for suffix, content in rendered:
            assert _download(tracker, f"{folder}/{suffix}", tmp_path / name).read_bytes() == content


def test_a_labelled_grid_and_decoded_text_download_as_pillow_and_the_tokenizer_read_them(
    tracker, tmp_path
):
    rng = np.random.default_rng(6)
    generated, real = rng.random((2, 2, 16, 16, 3)).astype(np.float32)
    images = Images(jnp.asarray(generated), jnp.asarray(real), labels=jnp.asarray([1, 0]))
    tracker.log_artifact("d/validation/samples", Preview(images, classes=("a", "b")), step=3)
    (path,) = _files(tracker, "previews/d/validation/samples/3")
    assert path.endswith("/grid.png")
    lines = [("generated", uint8(generated)), ("real", uint8(real))]
    check_png_grid(_download(tracker, path, tmp_path).read_bytes(), lines, ["b", "a"])
    tokenizer = BytesTokenizer()
    tokens = np.array([tokenizer.encode("café au lait")], np.int32)  # multi-byte UTF-8
    mask = np.arange(tokens.shape[1])[None] >= 4
    rows = TokenRows(jnp.asarray(tokens), jnp.asarray(mask))
    tracker.log_artifact("lm/validation/samples", Preview(rows, tokenizer=tokenizer), step=3)
    folder = "previews/lm/validation/samples/3"
    assert _files(tracker, folder) == [f"{folder}/text.md", f"{folder}/tokens.json"]
    stored = json.loads(_download(tracker, f"{folder}/tokens.json", tmp_path).read_text())
    assert stored["tokens"] == tokens.tolist()
    assert stored["text"] == [
        {"prompt": tokenizer.decode(tokens[0, :4]), "continuation": tokenizer.decode(tokens[0, 4:])}
    ]
    assert stored["text"][0]["prompt"] == "caf\ufffd"  # the first byte of é alone
    page = _download(tracker, f"{folder}/text.md", tmp_path).read_text()
    assert f"{stored['text'][0]['prompt']}⟨|⟩{stored['text'][0]['continuation']}" in page


def test_two_stages_previews_keep_their_own_files(tracker, tmp_path):
    rng = np.random.default_rng(5)
    shown = {stage: Images(jnp.asarray(rng.random((2, 4, 4, 3)), jnp.float32)) for stage in "ab"}
    for stage, images in shown.items():  # both at step 5, as two fits' own steps are
        tracker.log_artifact(preview_name(stage, Split.VALIDATION, "samples"), images, step=5)
    assert _files(tracker, "previews") == [
        f"previews/{stage}/validation/samples/5/grid.png" for stage in "ab"
    ]
    for stage, images in shown.items():
        for suffix, content in preview_files(images):
            path = f"previews/{stage}/validation/samples/5/{suffix}"
            assert _download(tracker, path, tmp_path / stage).read_bytes() == content


def test_a_preview_under_a_bare_name_is_refused_before_anything_is_sent(tracker):
    with pytest.raises(ValueError, match="a preview's name is stage/split/name, got 'samples'"):
        tracker.log_artifact("samples", Images(jnp.ones((1, 2, 2, 1))), step=1)
    assert _files(tracker, "previews") == []


def test_token_scores_have_no_preview_form(tracker):
    scores = TokenScores(jnp.ones((1, 2)), jnp.ones((1, 2)))
    with pytest.raises(TypeError, match="TokenScores has no preview form"):
        tracker.log_artifact("scores", scores, step=0)
    assert _files(tracker, "previews") == []


def test_plain_values_become_json_artifacts_and_unjsonable_ones_raise(tracker, tmp_path):
    tracker.log_artifact("notes", {"text": "three epochs", "score": float("nan")}, step=2)
    with pytest.raises(TypeError, match="cannot record artifact 'bad': object is not"):
        tracker.log_artifact("bad", object())
    with pytest.raises(ValueError, match="artifact name 'a/b' may not contain '/'"):
        tracker.log_artifact("a/b", 1)
    assert _files(tracker, "artifacts") == ["artifacts/notes-2.json"]
    text = _download(tracker, "artifacts/notes-2.json", tmp_path).read_text()
    assert json.loads(text) == {"text": "three epochs", "score": "NaN"}


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_a_fit_that_did_not_complete_ends_the_run_failed(tracker, status):
    tracker.log_artifact("fit_ended", FitEnded(status=status, step=3, error="boom"), step=3)
    tracker.log_artifact("fit_ended", FitEnded(status="completed", step=5), step=5)
    assert _status(tracker) == "RUNNING"
    tracker.close()
    assert _status(tracker) == "FAILED"


def test_a_completed_fit_ends_the_run_finished_and_a_closed_tracker_refuses_reports(tracker):
    tracker.log_artifact("fit_ended", FitEnded(status="completed", step=5), step=5)
    tracker.close()
    tracker.close()  # closing twice is harmless
    assert _status(tracker) == "FINISHED"
    with pytest.raises(RuntimeError, match="is closed; it records nothing more"):
        tracker.log_metrics({"lm/train/loss": 1.0}, step=6)
    with pytest.raises(RuntimeError, match="is closed"):
        tracker.log_artifact("fit_ended", FitEnded(status="failed", step=6), step=6)
    with pytest.raises(RuntimeError, match="is closed"):
        tracker.log_params({"seed": 1})
    assert _status(tracker) == "FINISHED"


def test_the_context_manager_never_hides_the_exception_in_flight(store, monkeypatch):
    with MLflowTracker("tests", "clean", uri=store) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    assert tracker.closed and _status(tracker) == "FINISHED"

    with pytest.raises(KeyError, match="in the loop"), MLflowTracker("tests", uri=store) as tracker:
        raise KeyError("in the loop")
    assert _status(tracker) == "FAILED"

    broken = MLflowTracker("tests", "broken close", uri=store)

    def fail(*args, **kwargs):
        raise OSError("store went away")

    monkeypatch.setattr(broken.client, "set_terminated", fail)
    with pytest.raises(ZeroDivisionError) as caught, broken:
        1 / 0  # noqa: B018
    assert any(
        "closing MLflowTracker also failed: OSError" in note for note in caught.value.__notes__
    )
    with pytest.raises(OSError, match="store went away"), MLflowTracker("tests", uri=store) as t:
        monkeypatch.setattr(t.client, "set_terminated", fail)


def test_a_run_left_through_trackers_on_an_exception_ends_failed(store, tmp_path):
    from dew.tracking import LocalTracker, Trackers

    inner = MLflowTracker("tests", "through trackers", uri=store)
    with pytest.raises(KeyError, match="in the loop"), Trackers(LocalTracker(tmp_path), inner):
        raise KeyError("in the loop")
    assert inner.closed and inner.failed and _status(inner) == "FAILED"
    clean = MLflowTracker("tests", "clean through trackers", uri=store)
    with Trackers(clean):
        pass
    assert _status(clean) == "FINISHED"


def test_mlflows_active_run_is_never_touched(store):
    assert mlflow.active_run() is None
    with MLflowTracker("tests", "no globals", uri=store) as tracker:
        assert mlflow.active_run() is None
        tracker.log_params({"seed": 0})
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
        tracker.log_artifact("fit_ended", FitEnded(status="completed", step=0), step=0)
        assert mlflow.active_run() is None
    assert mlflow.active_run() is None
    assert mlflow.last_active_run() is None


def test_runs_share_their_experiment_and_keep_their_names(store):
    with MLflowTracker("shared", "first", uri=store) as first:
        pass
    with MLflowTracker("shared", "second", uri=store) as second:
        pass
    assert first.experiment_id == second.experiment_id and first.run_id != second.run_id
    assert (first.name, second.name) == ("first", "second")
    assert _client(first).get_run(second.run_id).info.run_name == "second"
    assert MLflowTracker("shared", uri=store).name  # MLflow names an unnamed run
    client = _client(first)
    client.delete_experiment(client.get_experiment_by_name("shared").experiment_id)
    with pytest.raises(ValueError, match=r"MLflow experiment 'shared' in .* is deleted"):
        MLflowTracker("shared", uri=store)


def test_the_default_store_is_sqlite_under_runs_in_the_working_directory(base, monkeypatch):
    monkeypatch.chdir(base)
    with MLflowTracker("default") as tracker:
        tracker.log_artifact("lm/validation/text", TokenRows(jnp.asarray([[1, 2]])), step=0)
    assert tracker.uri == f"sqlite:///{base / 'runs' / 'mlflow.db'}"
    assert (base / "runs" / "mlflow.db").is_file()
    experiment = _client(tracker).get_experiment(tracker.experiment_id)
    assert experiment.artifact_location == (base / "runs" / "mlartifacts").as_uri()
    artifacts = base / "runs" / "mlartifacts" / tracker.run_id / "artifacts"
    stored = artifacts / "previews" / "lm" / "validation" / "text"
    assert (stored / "0" / "tokens.json").read_bytes() == preview_files(
        TokenRows(jnp.asarray([[1, 2]]))
    )[0][1]
    assert _status(tracker) == "FINISHED"


def test_a_file_store_from_a_plain_path_opts_in_only_around_its_own_calls(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(MlflowException, match="MLFLOW_ALLOW_FILE_STORE"):
        MlflowClient(tracking_uri=(tmp_path / "refused").as_uri())
    seen = []
    tracker = MLflowTracker("files", "plain path", uri=tmp_path / "mlruns")
    assert tracker.uri == (tmp_path / "mlruns").resolve().as_uri() and tracker.file_store
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    send = tracker.client.log_batch
    monkeypatch.setattr(
        tracker.client,
        "log_batch",
        lambda run_id, **kwargs: (
            seen.append(os.environ.get("MLFLOW_ALLOW_FILE_STORE")),
            send(run_id, **kwargs),
        )[1],
    )
    tracker.log_metrics({"lm/validation/psnr": float("inf"), "lm/train/loss": np.nan}, step=3)
    tracker.log_params({"seed": 0})
    tracker.log_artifact("fit_ended", FitEnded(status="failed", step=3), step=3)
    assert seen == ["true", "true"]
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    tracker.close()
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "false"  # the caller's value is restored
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert _history(tracker, "lm/validation/psnr") == [(3, float("inf"))]  # kept exactly
    assert np.isnan(_history(tracker, "lm/train/loss")[0][1])
    assert _client(tracker).get_run(tracker.run_id).data.params == {"seed": "0"}
    assert _files(tracker, "records") == ["records/fit_ended-3.json"]
    assert _status(tracker) == "FAILED"
    assert (tmp_path / "mlruns" / tracker.experiment_id / tracker.run_id).is_dir()


def test_the_file_store_opt_in_is_restored_when_an_mlflow_call_raises(tmp_path, monkeypatch):
    tracker = MLflowTracker("files", "raises", uri=tmp_path / "mlruns")
    seen = []

    def fail(run_id, **kwargs):
        seen.append(os.environ.get("MLFLOW_ALLOW_FILE_STORE"))
        raise OSError("store went away")

    monkeypatch.setattr(tracker.client, "log_batch", fail)
    for before in (None, "false"):
        if before is None:
            monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
        else:
            monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", before)
        with pytest.raises(OSError, match="store went away"):
            tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
        assert os.environ.get("MLFLOW_ALLOW_FILE_STORE") == before
    assert seen == ["true", "true"]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracker.close()


def test_the_file_store_opt_in_outlives_one_thread_while_another_is_inside(tmp_path, monkeypatch):
    """Two threads' calls overlap: the first to leave must not take the opt-in away from
    the second, and the last to leave restores the caller's environment."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    first = MLflowTracker("files", "first", uri=tmp_path / "one")
    second = MLflowTracker("files", "second", uri=tmp_path / "two")
    first_inside, first_left, second_inside = (threading.Event() for _ in range(3))
    seen, failures = [], []

    def hold(tracker, entered, wait_for):
        send = tracker.client.log_batch

        def log_batch(run_id, **kwargs):
            entered.set()
            assert wait_for.wait(timeout=30)
            seen.append(os.environ.get("MLFLOW_ALLOW_FILE_STORE"))
            return send(run_id, **kwargs)

        monkeypatch.setattr(tracker.client, "log_batch", log_batch)

    hold(first, first_inside, second_inside)
    hold(second, second_inside, first_left)

    def report(tracker, done):
        try:
            tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
        except Exception as error:
            failures.append(error)
        finally:
            done.set()

    threads = [
        threading.Thread(target=report, args=(first, first_left)),
        threading.Thread(target=report, args=(second, threading.Event())),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == [] and seen == ["true", "true"]
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    first.close()
    second.close()
    assert _history(second, "lm/train/loss") == [(0, 1.0)]


def test_a_file_uri_is_a_file_store_too(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with MLflowTracker("files", uri=(tmp_path / "store").as_uri()) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert _history(tracker, "lm/train/loss") == [(0, 1.0)]


def test_bad_arguments_are_refused(store):
    with rejects(ValueError, "experiment must be a non-empty string", parameter="experiment"):
        MLflowTracker(3, uri=store)
    with pytest.raises(ValueError, match="experiment must be a non-empty string, got ''"):
        MLflowTracker("", uri=store)


def test_a_missing_mlflow_names_the_extra(monkeypatch):
    for name in ("mlflow", "mlflow.entities", "mlflow.exceptions", "mlflow.tracking"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"install dew-ml\[mlflow\]"):
        MLflowTracker("missing")


def test_importing_dew_and_its_mlflow_module_does_not_import_mlflow():
    code = "import sys, dew, dew.tracking, dew.tracking.mlflow\nprint('mlflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
