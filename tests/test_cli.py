"""The `dew` command: train (built-in and from a file), sweep, eval, runs, and its errors."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import pytest
from _builders import write_config
from _ledgers import ledger_json, old_ledger_text

from dew.cli import main
from dew.config import RunConfig
from dew.config._builtin import tiny_lm
from dew.tracking import read_journal


def _write_config(tmp_path, **trainer):
    cadence = {"steps": 6, "log_every": 3, "eval_every": 3, "checkpoint_every": 3}
    return write_config(tmp_path, **(cadence | trainer))


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


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_dew_train_a_file_with_overrides_then_eval_and_runs(tmp_path, capsys):
    path, _ = _write_config(tmp_path)
    assert main(["train", str(path), "--set", "optim.learning_rate=0.003", "--quiet"]) == 0
    printed = capsys.readouterr().out
    folder = tmp_path / "runs" / "tiny"
    assert RunConfig.from_run_record(folder).optim.learning_rate == 0.003
    journal = read_journal(folder)
    perplexity = journal.scalars["lm/validation/perplexity"][-1][1]
    assert f"lm/validation/perplexity {perplexity:.4f}" in printed

    assert main(["eval", str(folder), "--verbose"]) == 0
    scored = capsys.readouterr().out.splitlines()
    # The latest checkpoint scores what the trainer's last evaluation event reported.
    assert scored[0].startswith(f"step 6  perplexity {perplexity:.4f}  token_accuracy ")
    assert "evaluation/coordinated_batches" in scored[1]  # --verbose asks for the counts

    assert main(["runs", str(tmp_path / "runs")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "status", "step"]
    assert table[1].split()[:3] == ["tiny", "completed", "6"]
    column = table[0].split().index("lm/validation/perplexity")  # one column per metric
    assert table[1].split()[column] == f"{perplexity:.4f}"


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_dew_sweep_trains_each_point_and_prints_the_best(tmp_path, capsys):
    path, _ = _write_config(tmp_path, eval_every=6, checkpoint_every=None)
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.01, 0.001]\n')
    arguments = ["sweep", str(path), str(space), "--trials", "2", "--search", "grid", "--quiet"]
    assert main(arguments) == 0
    printed = capsys.readouterr().out.splitlines()
    ledger = ledger_json(tmp_path / "runs" / "tiny" / "ledger.json")
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


def test_a_diverging_trial_scores_nan_and_the_sweep_goes_on(tmp_path, capsys):
    path, _ = _write_config(tmp_path, eval_every=6, checkpoint_every=None)
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [1e30, 0.01]\n')  # Adam at 1e30 diverges
    arguments = ["sweep", str(path), str(space), "--trials", "2", "--search", "grid", "--quiet"]
    assert main(arguments) == 0
    printed = capsys.readouterr()
    ledger = ledger_json(tmp_path / "runs" / "tiny" / "ledger.json")
    values = {trial["index"]: trial["value"] for trial in ledger["trials"]}
    assert values[0] == "NaN" and isinstance(values[1], float)
    assert "tiny/trial-0: training " in printed.err  # its loss or params were not finite
    assert printed.out.splitlines()[-1].startswith("best trial 1  perplexity ")


@pytest.mark.slow  # two runs of the command
def test_a_diverging_dew_train_names_its_switch_and_trains_on_with_it(tmp_path, capsys):
    path, _ = _write_config(tmp_path, eval_every=None, checkpoint_every=None)
    arguments = ["train", str(path), "--set", "optim.learning_rate=1e30", "--quiet"]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith("dew train: training ") and error.count("\n") == 1
    assert error.endswith(
        "before saving or returning that state; pass --on-nonfinite continue to train on.\n"
    )
    # The same run, trained on: what a divergence does is no part of its identity.
    assert main([*arguments, "--on-nonfinite", "continue"]) == 0
    folder = tmp_path / "runs" / "tiny"
    ended = [r for _, _, r in read_journal(folder).records if r.type == "fit_ended"]
    assert [(r.status, r.step) for r in ended] == [("failed", 3), ("completed", 6)]
    run = json.loads((folder / "run.json").read_text())
    assert run["trainer"]["on_nonfinite"] == "raise"  # run.json keeps the first run's
    assert json.loads((folder / "params.json").read_text())["config/trainer/on_nonfinite"] == (
        "continue"
    )


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
        (
            ["train", "--set", "model.kwargs.sizes=" + "[" * 100_000],
            "--set model.kwargs.sizes is not valid TOML: it nests lists and mappings more than",
        ),
        (
            ["train", "--set", "model.kwargs.vocab_size=" + "[" * 95 + "]" * 95],
            "model.kwargs nests lists and mappings more than 90 deep; dew writes values at most",
        ),
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
    from dew.cli._commands import _space
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


@pytest.mark.slow  # about 6 s; CI runs it with the slow tests
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


# -- every user-caused failure is one line and exit status 2, through the real command ---------


def _dew(*arguments, cwd, timeout=120):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "dew.cli", *map(str, arguments)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _in_the_way(tmp_path):
    """A file, a folder and a valid run config and space under `tmp_path`."""
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "space.toml").write_text('"optim.learning_rate" = [0.01, 0.001]\n')
    _write_config(tmp_path)


def _run_folder_holds(name, kind):
    def make(tmp_path):
        target = tmp_path / "runs" / "tiny" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.mkdir() if kind == "folder" else target.write_text("")

    return make


def _run_json(text):
    def make(tmp_path):
        (tmp_path / "old").mkdir()
        (tmp_path / "old" / "run.json").write_text(text)

    return make


def _damaged_checkpoint(tmp_path):
    record = RunConfig.from_toml((tmp_path / "run.toml").read_text())
    (tmp_path / "old" / "checkpoints" / "6").mkdir(parents=True)
    from dew.config._recipe import _record

    (tmp_path / "old" / "run.json").write_text(json.dumps(_record(record).to_dict()))


def _run_json_with(section, key, value):
    """A run folder `old` whose run.json holds `value` at `section.key`: a hand edit."""

    def make(tmp_path):
        record = RunConfig.from_toml((tmp_path / "run.toml").read_text())
        from dew.config._recipe import _record

        data = _record(record).to_dict()
        data[section] = value if key is None else {**data[section], key: value}
        (tmp_path / "old").mkdir()
        (tmp_path / "old" / "run.json").write_text(json.dumps(data))

    return make


def _hand_edited_ledger(tmp_path):
    """The ledger `dew sweep run.toml space.toml --search grid` keeps, one trial finished
    (by a stand-in for training), then its learning rate edited by hand to "x"."""
    from dew.cli._commands import _space
    from dew.config.sweep import grid_search, sweep

    config = RunConfig.load(tmp_path / "run.toml")
    ledger = tmp_path / "runs" / "tiny" / "ledger.json"
    sweep(
        config,
        _space(str(tmp_path / "space.toml")),
        train=lambda run: 0.5,
        trials=1,
        ledger=ledger,
        search=grid_search,
    )
    data = ledger_json(ledger)
    data["trials"][0]["overrides"]["optim.learning_rate"] = "x"
    ledger.write_text(old_ledger_text(data))


SWEEP = ["sweep", "run.toml", "space.toml", "--trials", "1", "--search", "grid", "--quiet"]


@pytest.mark.parametrize(
    ("make", "arguments", "named"),
    [
        # dew train: the config file, the checkpoint dir, the run folder and what it holds
        (None, ["train", "missing.toml"], "missing.toml: No such file or directory"),
        (None, ["train", "adir"], "no run.json at 'adir/run.json': is this a run folder?"),
        (None, ["train", "afile/run.toml"], "afile/run.toml: Not a directory (afile is a file"),
        (None, ["train", "run.toml", "--checkpoint-dir", "afile"], "(afile is a file, not a"),
        (None, ["train", "run.toml", "--checkpoint-dir", "afile/sub"], "afile/sub/tiny: Not a"),
        (None, ["train", "run.toml", "--checkpoint-dir", ".", "--name", "afile"], "afile is a"),
        (_run_folder_holds("run.json", "folder"), ["train", "run.toml"], "run.json: Is a dir"),
        (_run_folder_holds("checkpoints", "file"), ["train", "run.toml"], "checkpoints is a file"),
        (_run_folder_holds("scalars.jsonl", "folder"), ["train", "run.toml"], "scalars.jsonl: Is"),
        # dew sweep: the space file, the ledger, its lock and the sweep's tracker folder
        (None, ["sweep", "run.toml", "adir", "--trials", "1"], "adir: Is a directory"),
        (None, ["sweep", "run.toml", "afile/s.toml", "--trials", "1"], "(afile is a file"),
        (
            None,
            ["sweep", "run.toml", "run.toml", "--trials", "1"],
            "IntUniform(low, high). (in run.toml)",
        ),
        (None, ["sweep", "run.toml", "afile", "--trials", "1"], "afile is not valid TOML"),
        (None, [*SWEEP, "--ledger", "adir"], "adir: Is a directory"),
        (None, [*SWEEP, "--ledger", "afile/ledger.json"], "afile: File exists (afile is a file"),
        (
            lambda tmp_path: (tmp_path / "lock" / "l.json.lock").mkdir(parents=True),
            [*SWEEP, "--ledger", "lock/l.json"],
            "lock/l.json.lock: Is a directory",
        ),
        (_run_folder_holds("sweep", "file"), SWEEP, "runs/tiny/sweep is a file, not a folder"),
        (
            _hand_edited_ledger,
            SWEEP,
            "ledger.json' is malformed: trials[0] (trial 0) has optim.learning_rate = 'x', not",
        ),
        # dew eval and dew runs: the run folder, its record and its checkpoints
        (None, ["eval", "afile"], "no run.json at 'afile/run.json'"),
        (_run_json("{not json"), ["eval", "old"], "old/run.json is not valid run.json"),
        (_run_json("[1, 2]"), ["eval", "old"], "old/run.json holds a 'list' record"),
        (_run_json("[" * 100_000), ["eval", "old"], "old/run.json is not valid run.json (a Run"),
        (
            _run_json_with("optim", "learning_rate", "x"),
            ["eval", "old"],
            "optim.learning_rate must be a finite number > 0, got 'x'. (in the run record old/",
        ),
        (_damaged_checkpoint, ["eval", "old"], "old/checkpoints' (step 6: its folder is empty)"),
        (None, ["runs", "afile"], "no folder 'afile'"),
    ],
)
def test_a_bad_path_is_one_line_naming_it_and_exit_status_2(
    tmp_path, make, arguments, named, monkeypatch, capsys
):
    # In this process (`main`, what the console script calls), from the folder the paths are
    # relative to: a `dew` subprocess a case would spend 2 s starting up. The commands' own
    # subprocess runs are the tests above and below.
    _in_the_way(tmp_path)
    if make is not None:
        make(tmp_path)
    if "must be a finite number" in named:  # in this process the suite's runtime type
        # checker (jaxtyping's import hook over dew) refuses the value before dew's check does
        result = _dew(*arguments, cwd=tmp_path)
        status, stderr = result.returncode, result.stderr
    else:
        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        status = main(list(map(str, arguments)))
        stderr = capsys.readouterr().err
    assert status == 2, stderr
    lines = stderr.splitlines()
    assert [line for line in lines if not line.startswith("WARNING:absl:")] == lines[-1:]
    assert lines[-1].startswith(f"dew {arguments[0]}: "), stderr
    assert named in lines[-1], stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    "error",
    [
        TypeError("a bug"),
        AssertionError("a bug"),
        KeyError("a bug"),
        AttributeError("a bug"),
        ImportError("cannot import name 'x' from partially initialized module", name="dew.x"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_bug_keeps_its_traceback(error, monkeypatch):
    def broken(args):
        raise error

    monkeypatch.setattr("dew.cli._commands._train", broken)
    with pytest.raises(type(error), match=r"a bug|partially"):
        main(["train"])


@pytest.mark.parametrize(
    "error",
    [
        NotADirectoryError(20, "Not a directory", "x/y"),
        ValueError("a bad value"),
        ImportError("optuna_search needs Optuna", name="optuna"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_user_error_raised_anywhere_is_one_line(error, monkeypatch, capsys):
    def failing(args):
        raise error

    monkeypatch.setattr("dew.cli._commands._train", failing)
    assert main(["train"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_one_line_leaves_out_jaxs_note_about_its_frames_and_keeps_others():
    from dew.cli._errors import _message

    @jax.jit
    def step(x):
        raise ValueError(f"a bad x of shape {x.shape}.")

    with pytest.raises(ValueError, match="a bad x") as caught:
        step(jax.numpy.ones(3))
    error = caught.value
    assert any("JAX_TRACEBACK_FILTERING" in note for note in error.__notes__)  # JAX's own
    error.add_note("(in run.toml)")
    assert _message(error) == "a bad x of shape (3,). (in run.toml)"


@pytest.mark.slow  # the command builds the model and the shapes first
def test_an_error_raised_inside_the_compiled_step_is_one_line_without_jaxs_note(tmp_path):
    # A ViT for 32-pixel images on 16-pixel shapes fails inside the traced step.
    arguments = ["train", "--config", "tiny_classifier", "--checkpoint-dir", tmp_path, "--quiet"]
    arguments += ["--steps", "1", "--set", "model.kwargs.image_size=32"]
    arguments += ["--set", "data.kwargs.rows=64", "--set", "trainer.batch_size=8"]
    result = _dew(*arguments, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "dew train: ViT expects one image of shape (32, 32, 3), got (16, 16, 3).\n"
    )


def test_ctrl_c_is_one_line_and_exit_status_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("dew.cli._commands._train", interrupted)
    assert main(["train"]) == 130
    assert capsys.readouterr().err == (
        "dew train: interrupted; run the same command again to resume\n"
    )


def _interrupt(command, cwd, ready, sent=signal.SIGINT):
    """Start `command`, wait until `ready()`, send `sent`; its exit status and stderr."""
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    process = subprocess.Popen(
        command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not ready():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run never got ready"
        time.sleep(0.05)
    process.send_signal(sent)
    _, errors = process.communicate(timeout=120)
    return process.returncode, errors


@pytest.mark.slow
def test_ctrl_c_during_dew_train_leaves_a_resumable_run(tmp_path):
    from dew.checkpoints import Checkpointer

    every = 3000  # Ctrl-C between two saves: one landing in orbax's save threads is theirs
    path, _ = _write_config(
        tmp_path, steps=1_000_000, eval_every=None, log_every=30, checkpoint_every=every
    )
    folder = tmp_path / "runs" / "tiny"
    command = [sys.executable, "-m", "dew.cli", "train", str(path), "--quiet"]

    def lines(name):
        journal = folder / name
        return journal.read_text().splitlines() if journal.exists() else []

    def fit_starts():
        return [json.loads(line) for line in lines("records.jsonl") if '"fit_started"' in line]

    def past_the_first_save():
        steps = [json.loads(line)["step"] for line in lines("scalars.jsonl")[-1:]]
        return (folder / "checkpoints" / str(every)).is_dir() and steps[0] >= every + 60

    status, errors = _interrupt(command, tmp_path, past_the_first_save)
    assert status == 130, errors
    with Checkpointer(folder / "checkpoints") as saved:
        step = saved.latest_step()
    assert step is not None and step >= every + 60  # the interrupted step, saved
    assert errors == (
        f"dew train: interrupted at step {step}; the same command resumes from step {step}\n"
    )
    ended = [record for _, _, record in read_journal(folder).records if record.type == "fit_ended"]
    assert [record.status for record in ended] == ["interrupted"]

    # The same command resumes the run (killed once it has: it would train a million steps).
    _interrupt(command, tmp_path, lambda: len(fit_starts()) == 2, sent=signal.SIGKILL)
    assert fit_starts()[1]["record"]["start_step"] >= step
