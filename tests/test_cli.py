"""The `dew` command: train (built-in and from a file), sweep, eval, runs, and its errors."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dew.cli import main
from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
from dew.config._builtin import tiny_lm
from dew.registry import datasets
from dew.tracking import read_journal

TINY = {
    "vocab_size": 16,
    "emb_features": 16,
    "num_layers": 1,
    "num_heads": 2,
    "mlp_features": 32,
    "max_seq_len": 16,
}


def _write_config(tmp_path, **trainer):
    config = RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            **{
                "name": "tiny",
                "checkpoint_dir": str(tmp_path / "runs"),
                "steps": 6,
                "batch_size": 8,
                "log_every": 3,
                "eval_every": 3,
                "checkpoint_every": 3,
                **trainer,
            }
        ),
    )
    path = tmp_path / "run.toml"
    config.dump_toml(path)
    return path, config


@pytest.mark.slow
def test_dew_train_runs_the_built_in_tiny_lm(tmp_path, capsys):
    assert main(["train", "--checkpoint-dir", str(tmp_path), "--steps", "200", "--quiet"]) == 0
    printed = capsys.readouterr().out
    folder = tmp_path / "quickstart"
    assert f"run folder {folder}" in printed
    journal = read_journal(folder)
    assert [step for step, _ in journal.scalars["lm/train/loss"]] == [50, 100, 150, 200]
    assert [step for step, _ in journal.scalars["lm/validation/perplexity"]] == [100, 200]
    perplexities = [value for _, value in journal.scalars["lm/validation/perplexity"]]
    # Learned the chain: far below a uniform guess over 16 IDs (the chain's entropy rate
    # puts its floor near 6.3).
    assert all(value < 7.5 for value in perplexities)
    recorded = RunConfig.from_run_record(folder)
    assert recorded.model == tiny_lm().model and recorded.trainer.steps == 200
    assert sorted(path.name for path in (folder / "checkpoints").iterdir()) == ["100", "200"]


def test_dew_train_a_file_with_overrides_then_eval_and_runs(tmp_path, capsys):
    path, _ = _write_config(tmp_path)
    assert main(["train", str(path), "--set", "optim.learning_rate=0.003", "--quiet"]) == 0
    printed = capsys.readouterr().out
    folder = tmp_path / "runs" / "tiny"
    assert RunConfig.from_run_record(folder).optim.learning_rate == 0.003
    journal = read_journal(folder)
    perplexity = journal.scalars["lm/validation/perplexity"][-1][1]
    assert f"lm/validation/perplexity {perplexity:.4f}" in printed

    assert main(["eval", str(folder)]) == 0
    scored = capsys.readouterr().out.splitlines()
    # The latest checkpoint scores what the trainer's last evaluation event reported.
    assert scored[0].startswith(f"step 6  perplexity {perplexity:.4f}  token_accuracy ")
    assert "evaluation/coordinated_batches" in scored[1]

    assert main(["runs", str(tmp_path / "runs")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "status", "step"]
    assert table[1].split()[:3] == ["tiny", "completed", "6"]
    assert f"lm/validation/perplexity {perplexity:.4f}" in table[1]


def test_dew_sweep_trains_each_point_and_prints_the_best(tmp_path, capsys):
    path, _ = _write_config(tmp_path, eval_every=6, checkpoint_every=None)
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.01, 0.001]\n')
    arguments = ["sweep", str(path), str(space), "--trials", "2", "--search", "grid", "--quiet"]
    assert main(arguments) == 0
    printed = capsys.readouterr().out.splitlines()
    ledger = json.loads((tmp_path / "runs" / "tiny" / "ledger.json").read_text())
    values = {trial["index"]: trial["value"] for trial in ledger["trials"]}
    assert sorted(values) == [0, 1]
    best = min(values, key=values.get)
    assert printed[-1].startswith(f"best trial {best}  perplexity ")
    for index in (0, 1):
        assert (tmp_path / "runs" / "tiny" / f"trial-{index}" / "run.json").exists()
    journal = read_journal(tmp_path / "runs" / "tiny" / "sweep")
    assert [step for step, _ in journal.scalars["sweep/validation/value"]] == [0, 1]
    # Run again: the ledger holds both trials, so nothing trains.
    assert main(arguments) == 0
    assert (
        len(read_journal(tmp_path / "runs" / "tiny" / "sweep").scalars["sweep/validation/value"])
        == 2
    )


@pytest.mark.slow
def test_two_dew_sweep_workers_share_one_optuna_study(tmp_path):
    pytest.importorskip("optuna")
    path, _ = _write_config(tmp_path, eval_every=6, checkpoint_every=None)
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = { low = 1e-4, high = 1e-1, log = true }\n')
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = [
        sys.executable,
        "-m",
        "dew.cli",
        "sweep",
        str(path),
        str(space),
        "--trials",
        "4",
        "--search",
        "optuna",
        "--storage",
        storage,
        "--study-name",
        "shared",
        "--quiet",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    workers = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=400) for worker in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err
    ledger = json.loads((tmp_path / "runs" / "tiny" / "ledger.json").read_text())
    assert sorted(trial["index"] for trial in ledger["trials"]) == [0, 1, 2, 3]
    trained = sorted(
        int(folder.name.removeprefix("trial-"))
        for folder in (tmp_path / "runs" / "tiny").glob("trial-*")
    )
    assert trained == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["train", "missing.toml"], "No such file"),
        (
            ["train", "--set", "optim.learning_rat=0.1"],
            "nearest declared paths: 'optim.learning_rate'",
        ),
        (["train", "--set", "trainer.steps=0"], "trainer.steps must be an integer >= 1, got 0"),
        (["train", "--set", "oops"], "--set takes PATH=VALUE, got 'oops'"),
        (["eval", "nowhere"], "no run.json at"),
        (["runs", "nowhere"], "no folder 'nowhere'"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(arguments, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # nothing was written


def test_bad_counts_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["train", "--steps", "0"])
    assert caught.value.code == 2
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("dew") is None, reason="the console script is not on PATH")
def test_console_script_is_installed(tmp_path):
    path, _ = _write_config(tmp_path)
    result = subprocess.run(
        ["dew", "train", str(path)], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "step 6  lm/train/loss" in result.stdout


def test_a_space_file_holds_choices_ranges_and_nested_tables(tmp_path):
    from dew.cli import _space
    from dew.config.sweep import IntUniform, Uniform

    path = tmp_path / "space.toml"
    path.write_text(
        '"optim.learning_rate" = { low = 1, high = 10, log = true }\n'
        '"trainer.batch_size" = { low = 8, high = 64, type = "int" }\n'
        "[model.kwargs]\n"
        "emb_features = [16, 32]\n"
    )
    assert _space(str(path)) == {
        "optim.learning_rate": Uniform(1.0, 10.0, log=True),
        "trainer.batch_size": IntUniform(8, 64),
        "model.kwargs.emb_features": [16, 32],
    }
    path.write_text('"optim.learning_rate" = { low = 1, high = 10, step = 2 }\n')
    with pytest.raises(ValueError, match=r"unknown keys \['step'\]"):
        _space(str(path))
    path.write_text('"optim.learning_rate" = { low = 1, high = 10, type = "bool" }\n')
    with pytest.raises(ValueError, match="has type 'bool'; use 'float' or 'int'"):
        _space(str(path))


def test_errors_a_dataset_vocabulary_larger_than_the_models_is_one_line_and_exit_status_2(
    tmp_path,
):
    # The bad IDs reach the compiled step: the failure inside it must come out as the
    # objective's own check, one line on stderr, not a JAX or Equinox traceback.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dew.cli",
            "train",
            "--set",
            "data.kwargs.vocab_size=64",
            "--steps",
            "2",
            "--checkpoint-dir",
            str(tmp_path / "runs"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dew train: LMObjective: batch['text'] holds token ID ")
    assert lines[0].endswith("valid IDs are 0 to 15 (vocab_size=16).")
