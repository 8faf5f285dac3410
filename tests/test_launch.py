"""`dew --processes N`'s local launcher with dummy Python children, and the cluster flags
and variables: fast, no jax.distributed run."""

import argparse
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dew import _launch
from dew.cli import cluster_settings, main

SRC = pathlib.Path(__file__).parent.parent / "src"

# A dummy child: records its pid and environment, then does what its process's entry in
# the behaviour list says ("ok", "fail", "hang", "print").
CHILD = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    out = pathlib.Path(sys.argv[1])
    index = int(os.environ["JAX_PROCESS_ID"])
    names = ["JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
             "DEW_LAUNCHED_PROCESS", "JAX_PLATFORMS"]
    (out / f"{index}.json").write_text(
        json.dumps({"pid": os.getpid(), "env": {n: os.environ.get(n) for n in names}})
    )
    what = sys.argv[2 + index]
    print(f"hello from {index}", flush=True)
    try:
        if what == "fail":
            print("something broke", file=sys.stderr, flush=True)
            sys.exit(3)
        if what == "user":  # a user's error: one line, exit status 2
            print(f"dew test: bad input seen by process {index}", file=sys.stderr, flush=True)
            sys.exit(2)
        if what == "watch":  # as `dew.cli.main` does in a launched process
            import importlib.util  # dew._launch alone (the dew package imports JAX: slow)
            spec = importlib.util.spec_from_file_location("launch", os.environ["LAUNCH_PY"])
            launch = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(launch)
            assert launch.watch_launcher() and "DEW_LAUNCHER_PIPE" not in os.environ
            (out / f"{index}.watching").write_text("")
            time.sleep(600)
        if what == "hang":
            time.sleep(600)
    except KeyboardInterrupt:
        sys.exit(130)
    """
)


def _run(tmp_path, behaviours, **options):
    command = [sys.executable, "-c", CHILD, str(tmp_path), *behaviours]
    started = time.monotonic()
    code = _launch.launch(command, len(behaviours), label="dew test", **options)
    return code, time.monotonic() - started


def _pids(tmp_path, count):
    pids = []
    deadline = time.monotonic() + 10
    for index in range(count):
        path = tmp_path / f"{index}.json"
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if path.exists():
            pids.append(json.loads(path.read_text())["pid"])
    return pids


def _gone(pid):
    """Whether `pid` has exited (a zombie that its new parent has not reaped yet counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no /proc (macOS): alive as far as kill can tell
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_every_child_gets_the_run_s_address_count_and_its_index(tmp_path, capfd):
    code, _ = _run(tmp_path, ["ok", "ok", "ok"])
    assert code == 0
    seen = [json.loads((tmp_path / f"{i}.json").read_text())["env"] for i in range(3)]
    address = seen[0]["JAX_COORDINATOR_ADDRESS"]
    assert address.startswith("127.0.0.1:") and int(address.rsplit(":", 1)[1]) > 0
    assert [env["JAX_PROCESS_ID"] for env in seen] == ["0", "1", "2"]
    for env in seen:
        assert env["JAX_COORDINATOR_ADDRESS"] == address
        assert env["JAX_NUM_PROCESSES"] == "3"
        assert env["DEW_LAUNCHED_PROCESS"] == "1"
    printed = capfd.readouterr()
    assert "hello from 0" in printed.out  # process zero's output is shown
    assert "hello from 1" not in printed.out + printed.err  # the others' only on failure
    assert "hello from 2" not in printed.out + printed.err


def test_a_failing_child_stops_the_others_and_is_named(tmp_path, capfd):
    code, elapsed = _run(tmp_path, ["hang", "fail", "hang"])
    assert code == 3  # the failing process's own status
    assert elapsed < 30
    err = capfd.readouterr().err
    assert "dew test: process 1 of 3 failed (exit status 3); stopped the other processes" in err
    assert "[process 1] something broke" in err  # its output, prefixed with its index
    assert "[process 1] hello from 1" in err
    assert "[process 2]" not in err  # a process stopped by the launcher did not fail
    assert all(_gone(pid) for pid in _pids(tmp_path, 3))


def test_a_hung_run_is_stopped_at_the_deadline(tmp_path, capfd):
    code, elapsed = _run(tmp_path, ["hang", "hang"], timeout=2.0)
    assert code == 1
    assert elapsed < 20
    err = capfd.readouterr().err
    assert "dew test: processes 0, 1 of 2 still running after the 2 s deadline" in err
    assert "--process-timeout" in err
    assert all(_gone(pid) for pid in _pids(tmp_path, 2))


def test_a_straggler_after_the_others_ended_is_stopped(tmp_path, capfd):
    code, elapsed = _run(tmp_path, ["ok", "hang"], straggler=1.0)
    assert code == 1
    assert elapsed < 20
    err = capfd.readouterr().err
    assert "dew test: process 1 of 2 still running 1 s after another process" in err
    assert "[process 1] hello from 1" in err
    assert all(_gone(pid) for pid in _pids(tmp_path, 2))


def _signalled_launcher(tmp_path, sig):
    """A launcher of two hanging children in its own process, sent `sig` once both run:
    (its status, its stderr, the children's pids)."""
    script = textwrap.dedent(
        f"""
        import sys
        from dew import _launch
        command = [sys.executable, "-c", {CHILD!r}, {str(tmp_path)!r}, "hang", "hang"]
        sys.exit(_launch.launch(command, 2, label="dew train"))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = []
    try:
        pids = _pids(tmp_path, 2)
        assert len(pids) == 2
        time.sleep(0.3)
        parent.send_signal(sig)
        _, err = parent.communicate(timeout=30)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
        for pid in pids:  # never leave a child behind, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return parent.returncode, err, pids


def test_ctrl_c_reaches_every_child_and_exits_130_with_one_line(tmp_path):
    code, err, pids = _signalled_launcher(tmp_path, signal.SIGINT)
    assert code == 130
    assert err.strip().splitlines() == [
        "dew train: interrupted; run the same command again to resume"
    ]
    assert all(_gone(pid) for pid in pids)


def test_sigterm_to_the_launcher_stops_every_child(tmp_path):
    code, err, pids = _signalled_launcher(tmp_path, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    assert err.strip().splitlines() == ["dew train: stopped by SIGTERM; stopped every process"]
    assert all(_gone(pid) for pid in pids)


def test_process_zero_s_user_error_is_the_one_line(tmp_path, capfd):
    # Process zero exiting with status 2 has said why: nothing is added to its line.
    for behaviours in (["user", "user"], ["user", "hang"]):
        code, elapsed = _run(tmp_path, behaviours)
        assert code == 2
        assert elapsed < 30
        err = capfd.readouterr().err
        assert err.splitlines() == ["dew test: bad input seen by process 0"]
        assert all(_gone(pid) for pid in _pids(tmp_path, 2))


def test_children_die_with_a_killed_launcher(tmp_path):
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("launch", {_launch.__file__!r})
        launch = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(launch)
        command = [sys.executable, "-c", {CHILD!r}, {str(tmp_path)!r}, "watch", "watch"]
        sys.exit(launch.launch(command, 2, label="dew train"))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "LAUNCH_PY": _launch.__file__}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    pids = []
    try:
        pids = _pids(tmp_path, 2)
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"{index}.watching").exists() for index in range(2)):
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        parent.send_signal(signal.SIGKILL)  # no handler runs: only the kernel closes its pipe
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(pid) for pid in pids)
    finally:
        for pid in pids:  # never leave a child behind, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_without_a_launcher_pipe_nothing_is_watched():
    assert not _launch.watch_launcher({})
    assert not _launch.watch_launcher({_launch.LAUNCHER_PIPE_ENV: "not a number"})
    with open(os.devnull) as file:  # a descriptor that is not a pipe
        assert not _launch.watch_launcher({_launch.LAUNCHER_PIPE_ENV: str(file.fileno())})


def test_launch_refuses_fewer_than_one_process():
    with pytest.raises(ValueError, match="--processes must be >= 1, got 0"):
        _launch.launch([sys.executable, "-c", "pass"], 0)


# The command's flags and variables.


def _args(**given):
    names = ("coordinator_address", "num_processes", "process_id")
    return argparse.Namespace(**{name: given.get(name) for name in names}, distributed=False)


def test_one_process_without_flags_or_variables():
    assert cluster_settings(_args(), {}) is None


def test_flags_win_over_variables():
    env = {"JAX_COORDINATOR_ADDRESS": "a:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert cluster_settings(_args(), env) == {
        "coordinator_address": "a:1",
        "num_processes": 4,
        "process_id": 3,
    }
    assert cluster_settings(_args(process_id=1, coordinator_address="b:2"), env) == {
        "coordinator_address": "b:2",
        "num_processes": 4,
        "process_id": 1,
    }


def test_an_ipv6_coordinator_in_brackets_is_an_address():
    env = {"JAX_COORDINATOR_ADDRESS": "[::1]:8476", "JAX_NUM_PROCESSES": "2"}
    settings = cluster_settings(_args(process_id=0), env)
    assert settings == {"coordinator_address": "[::1]:8476", "num_processes": 2, "process_id": 0}


def test_distributed_alone_leaves_everything_to_jax():
    args = _args()
    args.distributed = True
    assert cluster_settings(args, {}) == dict.fromkeys(
        ("coordinator_address", "num_processes", "process_id")
    )


@pytest.mark.parametrize(
    ("given", "env", "message"),
    [
        ({}, {"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES must be a whole number, got 'two'"),
        (
            {"num_processes": 2, "process_id": 2, "coordinator_address": "h:1"},
            {},
            r"--process-id must be 0 to 1 \(2 processes\), got 2",
        ),
        (
            {"coordinator_address": "h:1"},
            {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "5"},
            r"JAX_PROCESS_ID must be 0 to 1 \(2 processes\), got 5",
        ),
        ({}, {"JAX_COORDINATOR_ADDRESS": "nohost"}, "JAX_COORDINATOR_ADDRESS must be HOST:PORT"),
        ({}, {"JAX_COORDINATOR_ADDRESS": "h:99999"}, "has port 99999"),
        (
            {"coordinator_address": "h:1"},
            {},
            "also needs --num-processes .or JAX_NUM_PROCESSES., --process-id",
        ),
    ],
)
def test_bad_values_name_the_flag_or_variable(given, env, message):
    with pytest.raises(ValueError, match=message):
        cluster_settings(_args(**given), env)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--processes", "0"], "--processes must be >= 1, got 0"),
        (["eval", "x", "--process-timeout", "0"], "--process-timeout must be > 0 seconds, got 0"),
        (
            ["train", "--initialization-timeout", "0"],
            "--initialization-timeout must be >= 1 second, got 0",
        ),
        (
            ["sweep", "x", "--initialization-timeout", "2.5"],
            "argument --initialization-timeout: invalid int value: '2.5'",
        ),
        (["train", "--coordinator-address", "nohost"], "must be HOST:PORT (e.g. 10.0.0.1:1234)"),
        (["train", "--num-processes", "0"], "--num-processes must be >= 1, got 0"),
        (
            ["train", "--processes", "2", "--num-processes", "2"],
            "--processes starts local processes; it does not combine with --num-processes",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_index_out_of_range_exits_2_before_any_jax_work(capsys, monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    argv = ["train", "--coordinator-address", "127.0.0.1:1", "--num-processes", "2"]
    assert main([*argv, "--process-id", "2"]) == 2
    err = capsys.readouterr().err
    assert err == "dew train: --process-id must be 0 to 1 (2 processes), got 2.\n"
    monkeypatch.setenv("JAX_PROCESS_ID", "-1")
    assert main(argv) == 2
    assert "JAX_PROCESS_ID must be 0 to 1 (2 processes), got -1." in capsys.readouterr().err


def test_distributed_without_a_cluster_is_one_clear_error():
    # In a child process: joining sets process-wide JAX options.
    env = {**os.environ, "PYTHONPATH": str(SRC), "JAX_PLATFORMS": "cpu"}
    for name in [*env]:
        if name.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_")):
            del env[name]
    command = [sys.executable, "-c", "import sys; from dew.cli import main; sys.exit(main())"]
    done = subprocess.run(
        [*command, "eval", "nowhere", "--distributed"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("dew eval: cannot join the multi-process run (")
    assert "--coordinator-address, --num-processes and --process-id" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--set", "optim.bogus=1"], "optim.bogus"),
        (["eval", "nowhere"], "no run.json at 'nowhere/run.json'"),
    ],
)
def test_bad_input_is_one_line_before_any_process_starts(argv, message, capsys, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(_launch, "launch", no_launch)
    assert main([*argv, "--processes", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"dew {argv[0]}: ") and message in err


def test_a_run_folder_in_use_is_one_line_before_any_process_starts(tmp_path, capsys, monkeypatch):
    from dew._lock import folder_lock

    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(_launch, "launch", no_launch)
    folder = tmp_path / "quickstart"
    folder.mkdir()
    with folder_lock(folder):
        assert main(["train", "--checkpoint-dir", str(tmp_path), "--processes", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"dew train: {folder}: the run folder is in use by process {os.getpid()} (this "
        "process), which holds its lock run.lock; wait for that run to end (or stop it), or "
        "train under another trainer.name"
    ]
