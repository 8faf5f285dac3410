"""`dew runs` (a sweep's best trial, --sort, --filter, hyperparameter columns, --json, a table
per kind of run within the terminal's width, --columns, escaped names, a closed pipe),
`dew sweep`'s trial lines and `dew eval --step/--metrics`."""

import json
import math
import os
import subprocess
import sys

import pytest
from _builders import TINY
from _ledgers import ledger_json

from dew.cli import main
from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig, builtin
from dew.registry import datasets
from dew.telemetry.records import TrialFinished
from dew.tracking import LocalTracker


@pytest.fixture(autouse=True)
def _no_width(monkeypatch):
    """Captured output is no terminal: no width limit, unless a test sets COLUMNS."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A two-trial grid sweep run by the real `dew sweep` (`runs/tiny/trial-{0,1}` with
    checkpoints at steps 2 and 4, `runs/tiny/sweep`) and its standard output."""
    root = tmp_path_factory.mktemp("swept")
    config = RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="tiny",
            checkpoint_dir=str(root / "runs"),
            steps=4,
            batch_size=8,
            log_every=2,
            eval_every=2,
            checkpoint_every=2,
        ),
    )
    config.dump_toml(root / "run.toml")
    (root / "space.toml").write_text('"optim.learning_rate" = [0.03, 0.0001]\n')
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "dew.cli", "sweep", "run.toml", "space.toml"]
    command += ["--trials", "2", "--search", "grid", "--verbose"]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=root, env=environment, timeout=600
    )
    assert result.returncode == 0, result.stderr
    return root, result.stdout


def _rows(capsys, *arguments):
    assert main(["runs", *arguments]) == 0
    return capsys.readouterr().out.splitlines()


def _listed(capsys, root, *arguments):
    assert main(["runs", str(root / "runs"), "--json", *arguments]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_dew_sweep_says_which_trial_and_point_trains(swept):
    root, printed = swept
    lines = printed.splitlines()
    starts = [line for line in lines if line.startswith("trial ") and "/2  " in line]
    assert starts == [
        "trial 0/2  optim.learning_rate=0.03",
        "trial 1/2  optim.learning_rate=0.0001",
    ]
    assert "evaluation/coordinated_batches" in printed  # --verbose asks for the counts
    ledger = ledger_json(root / "runs" / "tiny" / "ledger.json")
    assert ledger["direction"] == "minimize"


@pytest.mark.slow
def test_a_sweep_row_shows_its_best_trial_and_point(swept, capsys):
    root, _ = swept
    ledger = ledger_json(root / "runs" / "tiny" / "ledger.json")
    top = min(ledger["trials"], key=lambda trial: trial["value"])
    (row,) = [row for row in _listed(capsys, root) if row["run"] == "tiny/sweep"]
    assert row["best_trial"]["index"] == top["index"]
    assert row["best_trial"]["overrides"] == top["overrides"]
    assert row["metrics"]["sweep/validation/value"]["value"] == top["value"]
    table = _rows(capsys, str(root / "runs"))
    (line,) = [line for line in table if line.startswith("tiny/sweep ")]
    point = f"optim.learning_rate={top['overrides']['optim.learning_rate']:g}"
    assert line.endswith(f"{top['index']}  {point}")


def test_a_maximized_sweeps_best_is_its_highest_trial(tmp_path, capsys):
    folder = tmp_path / "runs" / "s"
    (folder).mkdir(parents=True)
    rates = {"kind": "choice", "values": [1.0, 0.1, 0.01, 0.001]}
    space = {"optim.learning_rate": rates}
    ledger = {"version": 1, "space": space, "search": "grid", "config": {}, "trials": []}
    (folder / "ledger.json").write_text(json.dumps({**ledger, "direction": "maximize"}))
    with LocalTracker(folder / "sweep") as tracker:
        for index, value in enumerate([0.5, 0.9, math.nan, 0.7]):
            tracker.log_metrics({"sweep/validation/value": value}, step=index)
            point = {"optim.learning_rate": 10.0**-index}
            trial = TrialFinished(trial=index, overrides=point, value=value)
            tracker.log_artifact("trial_finished", trial, step=index)
    (row,) = _listed(capsys, tmp_path)
    assert row["best_trial"] == {
        "index": 1,
        "overrides": {"optim.learning_rate": 0.1},
        "value": 0.9,
        "direction": "maximize",
    }
    (folder / "ledger.json").write_text(json.dumps({**ledger, "direction": "minimize"}))
    assert _listed(capsys, tmp_path)[0]["best_trial"]["index"] == 0


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            {"trials": [{"index": 10**30, "overrides": {"optim.learning_rate": 0.1}, "value": 1}]},
            "trials[0] has trial index 1000000000000000000000000000000, not an integer in [0, 4)",
        ),
        (
            {"trials": [{"index": 1, "overrides": {"optim.learning_rate": "x"}, "value": 1}]},
            "trials[0] (trial 1) has optim.learning_rate = 'x', not one of the choices [1.0,",
        ),
        ({"direction": "upward"}, "its direction is 'upward', not 'minimize' or 'maximize'"),
        ({"notes": "mine"}, "it has unknown keys ['notes']"),
        ({"budget": 0}, "its budget is 0, not an integer in [1, 9223372036854775807]"),
    ],
)
def test_a_hand_edited_ledger_makes_its_sweep_unreadable_naming_it(tmp_path, capsys, edit, named):
    folder = tmp_path / "runs" / "s"
    folder.mkdir(parents=True)
    space = {"optim.learning_rate": {"kind": "choice", "values": [1.0, 0.1, 0.01, 0.001]}}
    ledger = {"version": 1, "space": space, "search": "grid", "config": {}, "budget": 4}
    (folder / "ledger.json").write_text(json.dumps({**ledger, "trials": [], **edit}))
    with LocalTracker(folder / "sweep") as tracker:
        tracker.log_metrics({"sweep/validation/value": 0.5}, step=0)
        point = {"optim.learning_rate": 1.0}
        tracker.log_artifact("trial_finished", TrialFinished(0, point, 0.5), step=0)
    assert main(["runs", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1].split()[:2] == ["runs/s/sweep", "unreadable"]
    (line,) = captured.err.splitlines()
    assert line.startswith(
        f"dew runs: runs/s/sweep: ledger '{folder / 'ledger.json'}' is malformed"
    )
    assert named in line


@pytest.mark.slow
def test_runs_shows_differing_hyperparameters_and_one_metric_order(swept, capsys):
    root, _ = swept
    table = _rows(capsys, str(root / "runs"))
    headers = table[0].split()
    assert headers[:4] == ["run", "status", "step", "optim.learning_rate"]
    assert "trainer.name" not in headers and "trainer.steps" not in headers  # the same
    tags = [header for header in headers if header.count("/") == 2]
    assert tags == sorted(tags) and "lm/validation/perplexity" in tags
    listed = _listed(capsys, root)
    assert [row["run"] for row in listed] == [line.split()[0] for line in table[1:]]
    for row, line in zip(listed, table[1:], strict=True):
        if row["run"] == "tiny/sweep":  # its status has spaces; its best is tested above
            continue
        cells = line.split()
        for tag, metric in row["metrics"].items():
            assert cells[headers.index(tag)] == f"{metric['value']:.4f}"
        for path, value in row["hyperparameters"].items():
            assert cells[headers.index(path)] == f"{value:g}"


@pytest.mark.slow
def test_runs_sort_and_filter(swept, capsys):
    root, _ = swept
    listed = _listed(capsys, root, "--filter", "run~trial", "--sort", "perplexity")
    values = [row["metrics"]["lm/validation/perplexity"]["value"] for row in listed]
    assert len(values) == 2 and values == sorted(values)  # lower is better: best first
    listed = _listed(capsys, root, "--filter", "run~trial", "--sort", "token_accuracy")
    accuracies = [row["metrics"]["lm/validation/token_accuracy"]["value"] for row in listed]
    assert accuracies == sorted(accuracies, reverse=True)  # higher is better
    reverse = _listed(capsys, root, "--filter", "run~trial", "--sort", "perplexity", "--reverse")
    worst = [row["metrics"]["lm/validation/perplexity"]["value"] for row in reverse]
    assert worst == sorted(values, reverse=True)
    completed = _listed(capsys, root, "--filter", "status=completed")
    assert sorted(row["run"] for row in completed) == ["tiny/trial-0", "tiny/trial-1"]
    small = _listed(capsys, root, "--filter", "optim.learning_rate<0.001")
    assert [row["run"] for row in small] == ["tiny/trial-1"]


@pytest.fixture
def journals(tmp_path):
    """Two runs' journals written by a LocalTracker, no training: a folder to list."""
    for name, rate, loss in (("a", 0.1, 2.0), ("b", 0.01, 1.5)):
        with LocalTracker(tmp_path / "runs" / name) as tracker:
            tracker.log_params({"config": {"optim": {"learning_rate": rate}}})
            tracker.log_metrics({"lm/validation/loss": loss}, step=3)
    return tmp_path / "runs"


def test_runs_of_journals_sort_filter_and_columns(journals, capsys):
    table = _rows(capsys, str(journals), "--sort", "loss")
    assert table[0].split() == [
        "run",
        "status",
        "step",
        "optim.learning_rate",
        "lm/validation/loss",
    ]
    assert [line.split() for line in table[1:]] == [
        ["b", "-", "3", "0.01", "1.5000"],
        ["a", "-", "3", "0.1", "2.0000"],
    ]
    assert [line.split()[0] for line in _rows(capsys, str(journals), "--filter", "loss>1.7")] == [
        "run",
        "a",
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--filter", "status"], "--filter 'status' is not one of KEY=VALUE, KEY~REGEX"),
        (["--filter", "colour=red"], "no listed run has 'colour'; the keys are "),
        (["--filter", "step<many"], "< needs a number, got 'many'"),
        (["--filter", "run~("], "'(' is no regex"),
        (["--sort", "bleu"], "--sort 'bleu': no listed run has that metric; their metrics are "),
        (["--reverse"], "--reverse reverses --sort METRIC; give one"),
    ],
)
def test_runs_bad_sort_or_filter_names_what_is_allowed(journals, capsys, arguments, message):
    assert main(["runs", str(journals), *arguments]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_dew_eval_a_given_step_and_metrics(swept, capsys):
    root, _ = swept
    folder = str(root / "runs" / "tiny" / "trial-0")
    assert main(["eval", folder, "--step", "2", "--metrics", "token_accuracy"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("step 2  token_accuracy ") and "perplexity" not in printed[0]
    assert len(printed) == 1  # one process: no counts line
    assert main(["eval", folder, "--step", "3"]) == 2
    assert "no checkpoint for step 3 " in (error := capsys.readouterr().err)
    assert "its steps are [2, 4]" in error
    assert main(["eval", folder, "--metrics", "perplexity,bleu"]) == 2
    error = capsys.readouterr().err
    assert "--metrics names 'bleu'" in error
    assert "its metrics are perplexity, token_accuracy" in error


def test_the_ledger_records_the_direction_and_refuses_the_other(tmp_path):
    from dew.config.sweep import grid_search, sweep

    config = RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        trainer=TrainerConfig(name="s", checkpoint_dir=str(tmp_path)),
    )
    space = {"optim.learning_rate": [0.1, 0.2]}
    ledger = tmp_path / "ledger.json"

    def run(direction):
        return sweep(
            config,
            space,
            train=lambda trial: trial.optim.learning_rate,
            trials=2,
            ledger=ledger,
            search=grid_search,
            direction=direction,
        )

    assert [trial.value for trial in run("maximize")] == [0.1, 0.2]
    assert ledger_json(ledger)["direction"] == "maximize"
    with pytest.raises(ValueError, match="'maximize' its score, but this sweep would 'minimize'"):
        run("minimize")
    with pytest.raises(ValueError, match="direction must be 'minimize' or 'maximize', got 'up'"):
        run("up")


KINDS = {  # a built-in configuration: its stage and validation metrics
    "tiny_lm": ("lm", ("perplexity", "token_accuracy")),
    "tiny_diffusion": ("diffusion", ("fid",)),
    "tiny_classifier": ("classifier", ("accuracy", "cross_entropy", "f1")),
    "tiny_jepa": ("jepa", ("knn_accuracy", "linear_probe_accuracy")),
}
HEADINGS = [
    "objective classifier, model vit: 3 runs",
    "objective diffusion, model dit: 3 runs",
    "objective jepa, model vit: 3 runs",
    "objective lm, model causal_transformer: 3 runs",
]


@pytest.fixture
def mixed(tmp_path):
    """Twelve runs of four kinds (journals and params, no training), each with its own
    learning rate, seed and model size: one column per differing hyperparameter and per
    metric made `dew runs` print rows over a thousand characters wide."""
    root = tmp_path / "runs"
    for index in range(12):
        name = list(KINDS)[index % 4]
        config = builtin(name).to_dict()
        config["optim"]["learning_rate"] = (1e-3, 3e-3, 1e-2)[index % 3]
        config["trainer"]["seed"] = index
        first = next(iter(config["model"]["kwargs"]))
        config["model"]["kwargs"][first] *= 1 + index % 2
        stage, validation = KINDS[name]
        values = {f"{stage}/validation/{metric}": index / 10 for metric in validation}
        with LocalTracker(root / f"{name}-{index}") as tracker:
            tracker.log_params({"config": config})
            tracker.log_metrics({f"{stage}/train/loss": 1 / (index + 1), **values}, step=100)
    return root


def _tables(lines):
    """`dew runs`' lines as {heading: (header cells, rows, the note on left-out columns)}."""
    tables, heading = {}, None
    for line in lines:
        if line.startswith("objective "):
            heading = line
            tables[heading] = [None, [], None]
        elif line.startswith("(") and "more column" in line:
            tables[heading][2] = line
        elif line and tables[heading][2] is not None:  # the note, wrapped to the width
            tables[heading][2] += " " + line
        elif line and tables[heading][0] is None:
            tables[heading][0] = line.split()
        elif line:
            tables[heading][1].append(line)
    return tables


def test_mixed_runs_print_a_table_per_kind_within_the_terminals_width(mixed, capsys, monkeypatch):
    whole = _tables(_rows(capsys, str(mixed)))  # not a terminal: whole rows
    assert list(whole) == HEADINGS
    for heading, (headers, rows, note) in whole.items():
        stage = heading.split()[1].rstrip(",")
        assert headers[:3] == ["run", "status", "step"] and note is None
        assert {tag.split("/")[0] for tag in headers if tag.count("/") == 2} == {stage}
        assert "optim.learning_rate" in headers and "trainer.seed" in headers
        assert len(rows) == 3
    monkeypatch.setenv("COLUMNS", "100")
    lines = _rows(capsys, str(mixed))
    assert max(map(len, lines)) <= 100
    fitted = _tables(lines)
    assert list(fitted) == HEADINGS
    for heading, (headers, rows, note) in fitted.items():
        kept = whole[heading][0]
        assert headers[:3] == ["run", "status", "step"] and len(rows) == 3
        assert headers == [column for column in kept if column in headers]  # in their order
        first = next(tag for tag in kept if "/validation/" in tag)  # the first metric stays
        assert first in headers and note is not None
        left = note.split("characters: ")[1].split("; choose with --columns)")[0].split(", ")
        assert sorted(headers + left) == sorted(kept)


def test_columns_chooses_the_columns_and_their_order(mixed, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "30")  # chosen columns are never left out
    lines = _rows(capsys, str(mixed), "--columns", "accuracy,optim.learning_rate,status")
    tables = _tables(lines)
    expected = ["run", "classifier/validation/accuracy", "optim.learning_rate", "status"]
    assert [headers for headers, _, _ in tables.values()] == [expected] * 4
    (cells,) = [
        row.split() for row in tables[HEADINGS[0]][1] if row.startswith("tiny_classifier-2 ")
    ]
    assert cells == ["tiny_classifier-2", "0.2000", "0.01", "-"]
    assert all(row.split()[1] == "-" for row in tables[HEADINGS[3]][1])  # no accuracy in lm
    listed = _listed(capsys, mixed.parent, "--columns", "perplexity,trainer.seed")
    assert {tuple(row["hyperparameters"]) for row in listed} == {("trainer.seed",)}
    assert {tuple(row["metrics"]) for row in listed} == {("lm/validation/perplexity",), ()}
    assert main(["runs", str(mixed), "--columns", "accuracy,colour"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("dew runs: --columns names 'colour', which no listed run has; ")
    assert main(["runs", str(mixed), "--columns", "perplexty"]) == 2
    assert "'perplexty', which no listed run has (did you mean 'perplexity'?); " in (
        capsys.readouterr().err
    )
    assert "the columns are run, status, step, data.name, " in error


def test_a_run_name_with_a_newline_stays_one_row(tmp_path, capsys):
    folder = tmp_path / "runs" / "lr\n0.1\x1b[31m"
    with LocalTracker(folder) as tracker:
        tracker.log_params({"config": {"data": {"kwargs": {"path": "a\tb"}}}})
        tracker.log_metrics({"lm/validation/loss": 1.5}, step=3)
    with LocalTracker(tmp_path / "runs" / "plain") as tracker:
        tracker.log_params({"config": {"data": {"kwargs": {"path": "c"}}}})
    lines = _rows(capsys, str(tmp_path / "runs"))
    assert len(lines) == 3
    assert lines[1].split() == ["lr\\n0.1\\x1b[31m", "-", "3", "a\\tb", "1.5000"]
    assert [row["run"] for row in _listed(capsys, tmp_path)] == ["lr\n0.1\x1b[31m", "plain"]


def test_a_broken_pipe_that_is_not_standard_output_is_still_an_error(journals, monkeypatch, capsys):
    def failing(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("dew.cli._runs._runs", failing)
    assert main(["runs", str(journals)]) == 2  # captured output is no pipe: not ours
    assert capsys.readouterr().err == "dew runs: [Errno 32] Broken pipe\n"


@pytest.mark.slow  # two `dew runs` processes
def test_dew_runs_into_a_pipe_closed_early_exits_0_quietly(tmp_path):
    root = tmp_path / "runs"
    for index in range(300):  # 300 rows of over 200 characters: more than a pipe holds
        with LocalTracker(root / f"{index:03d}-{'x' * 200}") as tracker:
            tracker.log_metrics({"lm/validation/loss": index / 7}, step=3)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "dew.cli", "runs", str(root)]
    for early in (True, False):  # closed before dew writes, or after its first line
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment
        )
        if not early:
            assert process.stdout.readline().startswith(b"run ")
        process.stdout.close()
        assert process.wait(timeout=120) == 0
        assert process.stderr.read() == b""


def test_a_narrow_table_leaves_the_throughput_out_before_the_training_loss(
    tmp_path, capsys, monkeypatch
):
    """`dew train` logs the speed beside the loss (decision 0087): the speed goes first."""
    values = {
        "lm/train/examples_per_second": 1234.5,
        "lm/train/loss": 2.0,
        "lm/validation/loss": 2.5,
    }
    with LocalTracker(tmp_path / "runs" / "a") as tracker:
        tracker.log_metrics(values, step=3)
    whole = _rows(capsys, str(tmp_path / "runs"))
    assert whole[0].split() == ["run", "status", "step", *sorted(values)]
    monkeypatch.setenv("COLUMNS", str(len(whole[0]) - 1))
    narrow = _rows(capsys, str(tmp_path / "runs"))
    assert narrow[0].split() == ["run", "status", "step", "lm/train/loss", "lm/validation/loss"]
    assert "characters: lm/train/examples_per_second;" in " ".join(narrow)  # the note
