"""`dew train --tracker ...` and `dew sweep --tracker ...`: each tracker read back by its own
client (TensorBoard's reader, `MlflowClient`, W&B's offline transaction log)."""

import argparse
import dataclasses
import importlib.util
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from _builders import TINY

from dew.cli import main
from dew.cli._tracker_options import _MLFLOW_LOGGERS, _quiet_loggers, _store
from dew.cli._trackers import open_trackers
from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
from dew.registry import datasets
from dew.tracking import read_journal

HINT = "TensorBoard: tensorboard --logdir"


def _config(root):
    return RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=1024),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="tracked",
            checkpoint_dir=str(root),
            steps=2,
            batch_size=4,
            log_every=1,
            eval_every=2,
            checkpoint_every=2,
        ),
    )


def _write_config(folder):
    path = folder / "run.toml"
    _config(folder / "runs").dump_toml(path)
    return path


def _available(module):
    """Whether `module` is installed, found without importing it: importing MLflow at
    collection took 7 s of each xdist worker's collection of the suite."""
    return importlib.util.find_spec(module) is not None


TRACKED = [name for name in ("tensorboard", "mlflow", "wandb") if _available(name)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real `dew train --tracker local,<every installed tracker>` subprocess."""
    folder = tmp_path_factory.mktemp("cli-trackers")
    home = folder / "wandb-home"
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "WANDB_SILENT": "true"}
    for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        environment[name] = str(home / name.lower())
    environment.pop("MLFLOW_TRACKING_URI", None)
    store = (folder / "mlruns").as_uri()
    command = [sys.executable, "-m", "dew.cli", "train", str(_write_config(folder)), "--quiet"]
    command += ["--tracker", ",".join(["local", *TRACKED]), "--steps", "2"]
    if "mlflow" in TRACKED:
        command += ["--mlflow-uri", store]
    if "wandb" in TRACKED:
        command += ["--wandb-offline"]
    result = subprocess.run(
        command, cwd=folder, env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    run = folder / "runs" / "tracked"
    return argparse.Namespace(result=result, run=run, store=store, journal=read_journal(run))


@pytest.mark.slow
def test_the_local_journal_is_always_kept_and_the_hint_names_the_event_folder(trained):
    assert (trained.run / "run.json").is_file()
    assert sorted(trained.journal.scalars) == [
        "lm/train/examples_per_second",  # dew train's throughput, at step 2 (decision 0087)
        "lm/train/loss",
        "lm/train/token_accuracy",
        "lm/train/tokens_per_second",
        "lm/validation/perplexity",
        "lm/validation/token_accuracy",
    ]
    hints = [line for line in trained.result.stdout.splitlines() if line.startswith(HINT)]
    if "tensorboard" in TRACKED:
        assert hints == [f"{HINT} {trained.run / 'tensorboard'}"]
    else:
        assert hints == []


@pytest.mark.slow
def test_tensorboard_holds_the_journals_scalars_and_their_layout(trained):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    events = EventAccumulator(str(trained.run / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(trained.journal.scalars)
    for tag, series in trained.journal.scalars.items():
        written = [(event.step, event.value) for event in events.Scalars(tag)]
        assert written == [(step, float(np.float32(value))) for step, value in series]
    latest = events.Tensors("custom_scalars__config__")[-1]
    layout = layout_pb2.Layout.FromString(latest.tensor_proto.string_val[0])
    charts = {chart.title: list(chart.multiline.tag) for chart in layout.category[0].chart}
    assert layout.category[0].title == "lm"
    assert charts["token_accuracy"] == ["^lm/(train|validation)/token_accuracy$"]


@pytest.mark.slow
def test_mlflow_holds_one_finished_run_named_after_the_run(trained, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.16+ file stores opt in
    client = MlflowClient(tracking_uri=trained.store)
    experiment = client.get_experiment_by_name("tracked")
    (run,) = client.search_runs([experiment.experiment_id])
    assert (run.info.run_name, run.info.status) == ("tracked", "FINISHED")
    assert run.data.params["config/trainer/steps"] == "2"
    for tag, series in trained.journal.scalars.items():
        history = client.get_metric_history(run.info.run_id, tag)
        assert [(m.step, m.value) for m in history] == series


@pytest.mark.slow
def test_wandb_holds_the_run_offline_in_the_run_folder(trained):
    pytest.importorskip("wandb")
    from test_tracking_wandb import _finished_log, _set

    (log,) = (trained.run / "wandb").glob("offline-run-*/run-*.wandb")
    rows, exit_code = {}, None
    for record in _finished_log(log.parent, log.stem.removeprefix("run-")):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for item in record.history.item:
                _set(row, item)
            rows.setdefault(row["_step"], {}).update(row)
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert exit_code == 0
    for tag, series in trained.journal.scalars.items():
        assert [(step, rows[step][tag]) for step, _ in series] == series


# -- the options, in process: nothing trains -----------------------------------------------


def test_an_unknown_tracker_exits_2_naming_it_and_the_allowed_names(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "--tracker", "local,tensorbord"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == (
        "dew train: error: argument --tracker: unknown tracker 'tensorbord' in "
        "'local,tensorbord'; choose from local, tensorboard, mlflow, wandb (a "
        "comma-separated list, e.g. local,tensorboard)"
    )
    with pytest.raises(SystemExit):
        main(["sweep", "--tracker", "mlflow,", "--trials", "1"])
    assert "an empty tracker name in 'mlflow,'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "extra"), [("tensorboard", "tensorboard"), ("mlflow", "mlflow"), ("wandb", "wandb")]
)
def test_a_tracker_whose_library_is_missing_names_its_extra(name, extra, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    with pytest.raises(SystemExit) as exited:
        main(["train", "--tracker", f"local,{name}"])
    assert exited.value.code == 2
    assert f"install dew-ml[{extra}] (pip install 'dew-ml[{extra}]')" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "tracker"), [(["--mlflow-uri", "file:x"], "mlflow"), (["--wandb-offline"], "wandb")]
)
def test_a_trackers_option_without_its_tracker_is_refused(option, tracker, tmp_path, capsys):
    config = _write_config(tmp_path)
    assert main(["train", str(config), "--tracker", "tensorboard", *option]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"dew train: {option[0]} is for the ")
    assert f"add {tracker} to --tracker (got --tracker tensorboard)." in error
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_a_refused_run_leaves_no_event_file_behind(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    config = _write_config(tmp_path)
    run = tmp_path / "runs" / "tracked"
    run.mkdir(parents=True)
    other = dataclasses.replace(
        _config(tmp_path / "runs"), optim=OptimConfig(optimizer="sgd", learning_rate=0.5)
    )
    from dew.config._recipe import _record

    (run / "run.json").write_text(_record(other).to_json())
    # It completed a step (a run that never did starts over instead: decision 0031).
    (run / "scalars.jsonl").write_text('{"step": 1, "values": {"tracked/train/loss": 1.0}}\n')
    assert main(["train", str(config), "--tracker", "tensorboard", "--quiet"]) == 2
    assert "records another configuration" in capsys.readouterr().err
    assert not (run / "tensorboard").exists()


def _args(**options):
    return argparse.Namespace(
        **{"tracker": ("tensorboard",), "mlflow_uri": None, "wandb_offline": False, **options}
    )


def test_only_process_zero_builds_trackers(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    config = _config(tmp_path)
    with open_trackers(_args(), config) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    assert list((tmp_path / "tracked" / "tensorboard").glob("events.out.tfevents.*"))
    monkeypatch.setattr("dew._processes.is_process_zero", lambda: False)
    with open_trackers(_args(), config) as tracker:
        assert tracker is None
    with open_trackers(_args(tracker=("local",)), config) as tracker:
        assert tracker is None  # local alone: the recipe's own journal


def test_the_mlflow_store_is_the_option_else_mlflows_variable_else_beside_the_runs(
    tmp_path, monkeypatch
):
    config = _config(tmp_path / "runs")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert _store(_args(), config) == f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert _store(_args(), config) == "http://mlflow.example:5000"
    assert _store(_args(mlflow_uri="file:/tmp/store"), config) == "file:/tmp/store"


@pytest.mark.slow
def test_dew_sweep_gives_each_trial_its_trackers_and_one_hint(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = _write_config(tmp_path)
    space = tmp_path / "space.toml"
    space.write_text("optim.learning_rate = [0.01, 0.001]\n")
    arguments = ["sweep", str(config), str(space), "--trials", "2", "--search", "grid"]
    arguments += ["--tracker", "tensorboard", "--steps", "1", "--metric", "loss", "--quiet"]
    assert main(arguments) == 0
    sweep = tmp_path / "runs" / "tracked"
    hints = [line for line in capsys.readouterr().out.splitlines() if line.startswith(HINT)]
    assert hints == [f"{HINT} {sweep}"]
    for trial in ("trial-0", "trial-1"):
        events = EventAccumulator(str(sweep / trial / "tensorboard"))
        events.Reload()
        journal = read_journal(sweep / trial)
        assert sorted(events.Tags()["scalars"]) == sorted(journal.scalars)


@pytest.mark.slow
def test_a_store_mlflow_cannot_open_is_one_line_and_exit_2(tmp_path, capsys):
    pytest.importorskip("mlflow")
    config = _write_config(tmp_path)
    arguments = ["train", str(config), "--tracker", "mlflow", "--mlflow-uri", "bogus://x"]
    assert main([*arguments, "--quiet"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("dew train: MLflow cannot open the store 'bogus://x': ")
    assert "unsupported URI 'bogus://x'" in error


def test_mlflows_loggers_are_quiet_only_while_the_commands_trackers_are_open():
    pytest.importorskip("mlflow")
    loggers = [logging.getLogger(name) for name in _MLFLOW_LOGGERS]
    levels = [logger.level for logger in loggers]
    assert logging.getLogger("mlflow").isEnabledFor(logging.INFO)  # MLflow's own setting
    with _quiet_loggers(_MLFLOW_LOGGERS):
        assert not any(logger.isEnabledFor(logging.INFO) for logger in loggers)
        assert all(logger.isEnabledFor(logging.WARNING) for logger in loggers)
    assert [logger.level for logger in loggers] == levels  # a library user's, as it was


@pytest.mark.slow
def test_dew_train_into_a_new_sqlite_store_prints_no_info_lines(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    environment.pop("MLFLOW_TRACKING_URI", None)
    environment.pop("MLFLOW_LOGGING_LEVEL", None)
    command = [sys.executable, "-m", "dew.cli", "train", str(_write_config(tmp_path))]
    command += ["--tracker", "mlflow"]  # the default store: runs/mlflow.db, created here
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    printed = (result.stdout + result.stderr).splitlines()
    assert not [line for line in printed if " INFO " in line or "INFO " in line[:5]], printed
    store = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    experiment = MlflowClient(tracking_uri=store).get_experiment_by_name("tracked")
    (run,) = MlflowClient(tracking_uri=store).search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
