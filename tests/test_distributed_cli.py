"""Multi-process runs through the `dew` command and the sweep driver, with real
`jax.distributed` processes on one machine: the sweep's broadcast of process zero's trials
(one launch of tests/_dist_cli_sweep_worker.py), and `dew train/eval/sweep --processes 2`."""

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from _ledgers import ledger_json
from _multiprocess import free_port as _free_port
from _multiprocess import launch, worker_env

pytestmark = pytest.mark.slow

TESTS = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep-driver")
    launch(TESTS / "_dist_cli_sweep_worker.py", 2, out, timeout=180)
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    return out, ranks


def test_every_process_trains_process_zero_s_trials_in_order(driver):
    _, (zero, one) = driver
    names = [f"grid/trial-{index}" for index in range(3)]
    assert (
        zero["grid_trained"]
        == one["grid_trained"]
        == [[name, rate] for name, rate in zip(names, (0.1, 0.2, 0.3), strict=True)]
    )
    # Every process returns process zero's trials, with process zero's scores.
    expected = [
        [index, {"optim.learning_rate": rate}, rate * 10]
        for index, rate in enumerate((0.1, 0.2, 0.3))
    ]
    assert zero["grid"] == one["grid"] == {"value": expected}
    # Only process zero reports to its tracker.
    assert [step for step, _ in zero["grid_reported"]] == [0, 1, 2]
    assert one["grid_reported"] == []


def test_only_process_zero_owns_the_ledger(driver):
    out, _ = driver
    ledger = ledger_json(out / "rank0" / "grid" / "ledger.json")
    assert [entry["index"] for entry in ledger["trials"]] == [0, 1, 2]
    assert [entry["value"] for entry in ledger["trials"]] == [1.0, 2.0, 3.0]
    assert ledger["running"] == []
    assert not (out / "rank1").exists()  # process 1 wrote no ledger, no lock file


def test_process_zero_s_search_decides_the_points(driver):
    _, (zero, one) = driver
    assert zero["random_trained"] == one["random_trained"]
    assert len(zero["random_trained"]) == 3
    assert zero["random"] == one["random"]
    assert [trial[0] for trial in zero["random"]["value"]] == [0, 1, 2]


def test_a_trial_failing_on_one_process_raises_on_every_process(driver):
    _, (zero, one) = driver
    message = "training trial 1 failed on process 1 of 2: process 1 cannot train grid/trial-1"
    assert zero["failing"] == one["failing"] == {"error": "ValueError", "message": message}
    assert zero["failing_trained"] == one["failing_trained"]
    assert [name for name, _ in zero["failing_trained"]] == ["grid/trial-0", "grid/trial-1"]


def test_a_trial_s_agreed_error_is_wrapped_once(driver):
    _, (zero, one) = driver
    message = "checking the configuration failed on process 1 of 2: process 1 refuses grid/trial-0"
    assert zero["agreed"] == one["agreed"] == {"error": "ValueError", "message": message}


def test_a_rerun_retrains_the_cut_off_trial_first(driver):
    out, (zero, one) = driver
    assert [name for name, _ in zero["resumed_trained"]] == ["grid/trial-1", "grid/trial-2"]
    assert zero["resumed_trained"] == one["resumed_trained"]
    assert zero["resumed"] == one["resumed"]
    assert [trial[0] for trial in zero["resumed"]["value"]] == [0, 1, 2]
    ledger = ledger_json(out / "rank0" / "failing" / "ledger.json")
    assert ledger["running"] == []


# `dew` itself, as a user runs it: a command whose `--processes 2` starts the processes.

SMALL = [
    "--set", "model.kwargs.emb_features=16",
    "--set", "model.kwargs.num_layers=1",
    "--set", "model.kwargs.num_heads=2",
    "--set", "model.kwargs.mlp_features=32",
    "--set", "model.kwargs.max_seq_len=16",
    "--set", "data.kwargs.seq_len=8",
    "--set", "data.kwargs.num_tokens=2048",
    "--set", "trainer.batch_size=8",
    "--set", "trainer.log_every=3",
    "--set", "trainer.eval_every=3",
    "--set", "trainer.checkpoint_every=3",
    "--quiet",
]  # fmt: skip


def dew(*argv, timeout=240):
    """Run `dew ARGV` in its own process group (killed whole past `timeout`): (status,
    stdout, stderr)."""
    command = [sys.executable, "-c", "import sys; from dew.cli import main; sys.exit(main())"]
    process = subprocess.Popen(
        [*command, *map(str, argv)],
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"dew {' '.join(map(str, argv))} passed {timeout} s:\n{out}\n{err}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    argv = ["train", "--processes", "2", "--steps", "6", "--checkpoint-dir", root, *SMALL]
    result = dew(*argv, "--process-timeout", "200")
    return root, result


def test_dew_train_processes_2_trains_one_run(trained):
    root, (code, out, err) = trained
    assert code == 0, err
    assert "step 6  " in out
    assert f"run folder {root / 'quickstart'}" in out
    assert [path.name for path in root.iterdir()] == ["quickstart"]  # one run folder
    folder = root / "quickstart"
    assert sorted(path.name for path in folder.iterdir() if path.is_file()) == [
        "data.json",  # process zero's alone, as every file here
        "params.json",
        "records.jsonl",
        "run.json",
        "run.lock",  # process zero's, while the run trained
        "scalars.jsonl",
        "summary.json",
    ]
    assert (folder / "run.lock").read_text() == ""  # released
    assert "[process 1]" not in err  # process 1 succeeded: its output is not shown
    # Gloo's "Rank 0 is connected to 1 peer ranks" (printed from C++ at the first
    # collective) is kept out of the user's output (dew.distributed.initialize).
    assert "Gloo" not in out + err


def test_only_process_zero_wrote_the_journals(trained):
    from dew.tracking import read_journal

    root, (code, _, err) = trained
    assert code == 0, err
    journal = read_journal(root / "quickstart")
    # One writer: each step once, one fit started and ended.
    assert [step for step, _ in journal.scalars["lm/train/loss"]] == [3, 6]
    assert [step for step, _ in journal.scalars["lm/validation/perplexity"]] == [3, 6]
    kinds = [record.type for _, _, record in journal.records]
    assert kinds.count("run_record") == 1  # process 1 made no tracker to log it
    assert kinds.count("fit_started") == 1
    assert kinds.count("fit_ended") == 1
    saved = sorted(path.name for path in (root / "quickstart" / "checkpoints").iterdir())
    assert "6" in saved  # every process took part in the last checkpoint


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster")
    args = ["--steps", "6", "--checkpoint-dir", str(out / "runs"), *SMALL]
    outputs = launch(TESTS / "_dist_cli_worker.py", 2, out, args, timeout=200)
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    return out, outputs, ranks


def test_cluster_flags_join_one_run_and_every_process_ends_alike(cluster):
    _, _, (zero, one) = cluster
    assert zero["train"] == one["train"] == 0
    assert len(zero["fitted"]) == len(one["fitted"]) == 1
    assert zero["fitted"][0]["step"] == one["fitted"][0]["step"] == 6
    # The same params on every process (a sum per leaf).
    assert zero["fitted"][0]["params"] == pytest.approx(one["fitted"][0]["params"], rel=1e-6)


def test_only_process_zero_prints(cluster):
    _, ((_, zero), (_, one)), _ = cluster
    assert "step 6  " in zero
    assert "run folder " in zero
    # Errors are every process's to print (the last scenario's); nothing else on process 1.
    printed = [line for line in one.splitlines() if not line.startswith("dew train: ")]
    assert printed == [], one
    assert "Gloo" not in zero


def test_dew_eval_under_two_processes_scores_the_run(cluster):
    _, ((_, zero), (_, one)), ranks = cluster
    assert [rank["eval"] for rank in ranks] == [0, 0]
    lines = zero.splitlines()
    assert any(line.startswith("step 6  perplexity ") for line in lines), zero
    assert "evaluation/uneven_shards False" in zero
    assert "perplexity" not in one


def test_a_run_folder_of_another_configuration_fails_every_process(cluster):
    _, ((_, zero), (_, one)), ranks = cluster
    assert [rank["other_config"] for rank in ranks] == [2, 2]
    for output in (zero, one):
        assert "dew train: checking the run folder failed on process 0 of 2: " in output
        assert "records another configuration (sections that differ: optim)" in output


def test_a_run_folder_another_run_holds_fails_every_process_in_one_line(cluster):
    out, ((_, zero), (_, one)), ranks = cluster
    assert [rank["locked"] for rank in ranks] == [2, 2]
    folder = out / "runs" / "quickstart"
    for output in (zero, one):
        assert (
            "dew train: checking the run folder failed on process 0 of 2: "
            f"{folder}: the run folder is in use by process "
        ) in output
        assert "Traceback" not in output


def test_a_failing_process_stops_the_run_and_is_named(tmp_path):
    # 17 tokens make two windows of 9, one held out: a global batch of 2 rows (2 processes
    # of 1) is more than the 1 training row, which every process finds at its first batch.
    tiny = ["--set", "data.kwargs.num_tokens=17", "--set", "data.kwargs.val_fraction=0.5"]
    argv = ["train", "--processes", "2", "--steps", "2", "--checkpoint-dir", tmp_path, *SMALL]
    code, _, err = dew(*argv, *tiny, "--set", "trainer.batch_size=1", "--process-timeout", "120")
    assert code == 2, err
    # Every process agreed on the error before anything was written; process zero's line
    # names the failing process and says why, and the launcher adds nothing to it.
    (line,) = _lines(err)
    assert line.startswith("dew train: checking the configuration failed on process "), err
    assert line.endswith(
        "a global batch of 2 rows (2 process(es) x 1) is more than the 1 training row(s); "
        "lower the batch or add rows."
    ), err
    assert not (tmp_path / "quickstart" / "run.json").exists()


def _lines(err):
    """What the command printed on stderr, line by line."""
    return err.splitlines()


def test_a_process_whose_peers_never_join_fails_in_one_line_after_the_timeout(tmp_path):
    # No coordinator listens at the address: process 1 waits --initialization-timeout
    # seconds, then says so in one line, not in JAX's C++ check failure and stack trace.
    port = _free_port()
    argv = ["train", "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2"]
    argv += ["--process-id", "1", "--initialization-timeout", "1", "--checkpoint-dir", tmp_path]
    started = time.monotonic()
    code, _, err = dew(*argv, *SMALL, timeout=60)
    assert code == 2, err
    (line,) = _lines(err)
    assert line == (
        f"dew train: cannot join the multi-process run at 127.0.0.1:{port}: the coordinator "
        "and all 2 processes did not join within 1 s (--initialization-timeout); start every "
        "process of the run, or allow them longer"
    )
    assert time.monotonic() - started < 30  # not JAX's default of 300 s
    assert not (tmp_path / "quickstart").exists()


def test_a_tracker_that_cannot_open_is_one_line_from_every_process(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    store = f"sqlite:///{blocker}/mlflow.db"
    argv = ["train", "--processes", "2", "--steps", "2", "--checkpoint-dir", tmp_path, *SMALL]
    code, _, err = dew(*argv, "--tracker", "mlflow", "--mlflow-uri", store)
    assert code == 2, err
    (line,) = _lines(err)
    assert line.startswith(
        "dew train: opening the trackers failed on process 0 of 2: MLflow cannot open the "
        f"store {store!r}: {blocker}"
    ), err
    assert "Traceback" not in err and "coordination" not in err


def test_dew_sweep_processes_2_keeps_one_ledger_and_one_optuna_study(tmp_path):
    """A multi-process sweep on a real database: one ledger, one run folder a trial, and
    process zero alone talks to the Optuna storage; Optuna's own client reads the study back
    with the ledger's trials and values. (Process zero's search decides the points for every
    search: the `driver` tests above.)"""
    optuna = pytest.importorskip("optuna")
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = {low = 0.001, high = 0.03, log = true}\n')
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["sweep", "tiny_lm", space, "--trials", "2", "--search", "optuna", "--processes", "2"]
    code, out, err = dew(
        *argv,
        "--storage", storage,
        "--study-name", "rates",
        "--steps", "3",
        "--checkpoint-dir", tmp_path / "runs",
        "--name", "rate",
        *SMALL,
    )  # fmt: skip
    assert code == 0, err
    ledger = ledger_json(tmp_path / "runs" / "rate" / "ledger.json")
    assert [entry["index"] for entry in ledger["trials"]] == [0, 1]
    assert all(isinstance(entry["value"], float) for entry in ledger["trials"])
    assert ledger["running"] == []
    for index in range(2):
        trial = tmp_path / "runs" / "rate" / f"trial-{index}"
        assert (trial / "run.json").is_file()
        assert len((trial / "scalars.jsonl").read_text().splitlines()) > 0
    assert "best trial" in out
    study = optuna.load_study(study_name="rates", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert [t.number for t in complete] == [0, 1]
    for trial, entry in zip(complete, ledger["trials"], strict=True):
        assert trial.value == pytest.approx(entry["value"], rel=1e-12)
        assert trial.params["optim.learning_rate"] == pytest.approx(
            entry["overrides"]["optim.learning_rate"], rel=1e-12
        )


def _running_with(text):
    """The pids of running processes whose command line mentions `text`."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def test_ctrl_c_stops_every_process_with_one_line(tmp_path):
    root = tmp_path / "runs"
    argv = ["train", "--processes", "2", "--steps", "100000", "--checkpoint-dir", root, *SMALL]
    command = [sys.executable, "-c", "import sys; from dew.cli import main; sys.exit(main())"]
    process = subprocess.Popen(
        [*command, *map(str, argv), "--set", "trainer.eval_every=100000"],
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    journal = root / "quickstart" / "scalars.jsonl"
    try:
        deadline = time.monotonic() + 120
        while not (journal.exists() and journal.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert journal.exists(), "the run never logged a step"
        assert len(_running_with(str(root))) == 3  # the command and its two processes
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        for pid in _running_with(str(root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130
    assert err.strip().splitlines() == [
        "dew train: interrupted; run the same command again to resume"
    ]
    assert _running_with(str(root)) == []


def test_killing_the_launcher_takes_every_process_with_it(tmp_path):
    root = tmp_path / "runs"
    argv = ["train", "--processes", "2", "--steps", "100000", "--checkpoint-dir", root, *SMALL]
    cadence = ["--set", "trainer.eval_every=100000", "--set", "trainer.checkpoint_every=20"]
    command = [sys.executable, "-c", "import sys; from dew.cli import main; sys.exit(main())"]
    launcher = subprocess.Popen(
        [*command, *map(str, argv), *cadence],
        env=worker_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    checkpoints = root / "quickstart" / "checkpoints"

    def saved():
        return sorted(path.name for path in checkpoints.iterdir() if path.name.isdigit())

    try:
        deadline = time.monotonic() + 180
        while not (checkpoints.is_dir() and saved()) and time.monotonic() < deadline:
            assert launcher.poll() is None, "the run ended by itself"
            time.sleep(0.1)
        assert saved(), "the run never saved its first checkpoint"
        children = [pid for pid in _running_with(str(root)) if pid != launcher.pid]
        assert len(children) == 2
        launcher.send_signal(signal.SIGKILL)  # no handler of the launcher's runs
        launcher.wait(timeout=30)
        at_kill = saved()
        deadline = time.monotonic() + 10
        while _running_with(str(root)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running_with(str(root)) == []  # both children are gone, within seconds
        time.sleep(2)
        assert saved() == at_kill  # and nothing was checkpointed after the kill
    finally:
        for pid in _running_with(str(root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
