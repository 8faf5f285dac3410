"""`dew sweep` workers on a real PostgreSQL server (the `postgres` fixture, `tests/_postgres.py`):
several workers started together on one grid, random or Optuna (TPE) sweep train every index
exactly once, a worker killed mid-trial is resumed from the trial's checkpoint by another,
and a database lost mid-sweep stops the worker in one line without losing the trial it was
training. Every worker is the real command, a subprocess, on a tiny model."""

import os
import signal
import subprocess
import sys
import time

import pytest
from _ledgers import ledger_json
from _tiny_sweep_run import tiny_lm_run

from dew.config.sweep import random_search

pytestmark = pytest.mark.slow


@pytest.fixture
def optuna():
    optuna = pytest.importorskip("optuna")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield optuna
    optuna.logging.set_verbosity(verbosity)


def _files(tmp_path, steps=1, checkpoint_every=None, space=None):
    run = tiny_lm_run(tmp_path, steps, checkpoint_every)
    config = tmp_path / "run.toml"
    run.dump_toml(config)
    path = tmp_path / "space.toml"
    path.write_text(space or '"optim.learning_rate" = { low = 1e-4, high = 1e-1, log = true }\n')
    return config, path


def _dew(tmp_path, *arguments, quiet=True):
    command = [sys.executable, "-m", "dew.cli", "sweep", *map(str, arguments)]
    return subprocess.Popen(
        [*command, *(["--quiet"] if quiet else [])],
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _trained(tmp_path):
    """The index of every trial a worker started training (its run.json is written first)."""
    return sorted(
        int(folder.parent.name.removeprefix("trial-"))
        for folder in (tmp_path / "runs" / "tiny").glob("trial-*/run.json")
    )


def _finished(ledgers):
    entries = [entry for ledger in ledgers for entry in ledger_json(ledger)["trials"]]
    return sorted(entries, key=lambda entry: entry["index"])


@pytest.mark.parametrize("search", ["grid", "random", "optuna"])
def test_workers_started_together_train_every_index_once(tmp_path, optuna, postgres_url, search):
    # Four workers started at once, two cores' worth of contention and more; two workers
    # tested nothing four do not, for 25 s of CI time.
    workers = 4
    trials = workers + 1  # one index more than workers: one of them takes a second
    # A grid of exactly `trials` points: each must train once (optuna#2039 duplicates them).
    rates = ", ".join(str(0.1 / 2**index) for index in range(trials))
    config, space = _files(tmp_path, space=f'"optim.learning_rate" = [{rates}]\n')
    arguments = [config, space, "--trials", trials, "--search", search]
    if search == "optuna":  # one study on the server, and one ledger each, as on N machines
        ledgers = [tmp_path / f"ledger-{n}.json" for n in range(workers)]
        commands = [
            [*arguments, "--storage", postgres_url, "--study-name", "s", "--ledger", ledger]
            for ledger in ledgers
        ]
    else:  # one machine: the workers share the ledger, which hands out each index once
        ledgers = [tmp_path / "runs" / "tiny" / "ledger.json"]
        commands = [arguments] * workers
    processes = [_dew(tmp_path, *command) for command in commands]  # all at once, fresh storage
    for process in processes:
        _, errors = process.communicate(timeout=600)
        assert process.returncode == 0, errors

    assert _trained(tmp_path) == list(range(trials))  # every index trained, each once
    finished = _finished(ledgers)
    assert [entry["index"] for entry in finished] == list(range(trials))
    points = [entry["overrides"] for entry in finished]
    grid = [0.1 / 2**index for index in range(trials)]
    if search == "grid":  # every grid point once, in the grid's order
        assert points == [{"optim.learning_rate": rate} for rate in grid]
    if search == "random":  # each index's own draw, whichever worker trained it
        draws = random_search(seed=0)
        assert points == [draws.point({"optim.learning_rate": grid}, n) for n in range(trials)]
    if search == "optuna":  # the results as Optuna's own client reads them
        study = optuna.load_study(study_name="s", storage=postgres_url)
        states = [trial.state.name for trial in study.trials]
        assert "RUNNING" not in states and "FAIL" not in states, states
        complete = {trial.number: trial for trial in study.trials if trial.number < trials}
        assert sorted(complete) == list(range(trials))
        for entry in finished:
            assert complete[entry["index"]].state.name == "COMPLETE"
            assert complete[entry["index"]].params == entry["overrides"]
            assert complete[entry["index"]].value == entry["value"]


def _wait_for(condition, processes, timeout=300):
    deadline = time.monotonic() + timeout
    while not condition():
        for process in processes:
            if process.poll() is not None:
                raise AssertionError(process.communicate())
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_worker_killed_mid_trial_is_resumed_from_its_checkpoint_by_another(
    tmp_path, optuna, postgres_url
):
    config, space = _files(tmp_path, steps=400, checkpoint_every=20)
    arguments = [config, space, "--trials", 2, "--search", "optuna"]
    arguments += ["--storage", postgres_url, "--study-name", "s"]
    first = _dew(tmp_path, *arguments)
    checkpoints = tmp_path / "runs" / "tiny" / "trial-0" / "checkpoints"
    saved = lambda: checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())  # noqa: E731
    _wait_for(saved, [first])
    first.send_signal(signal.SIGKILL)  # mid-trial: a checkpoint saved, the trial not finished
    first.communicate()
    ledger = tmp_path / "runs" / "tiny" / "ledger.json"
    assert [entry["index"] for entry in ledger_json(ledger)["running"]] == [0]
    study = optuna.load_study(study_name="s", storage=postgres_url)
    assert [trial.state.name for trial in study.trials] == ["RUNNING"]

    second = _dew(tmp_path, *arguments, quiet=False)  # another worker on the same ledger
    output, errors = second.communicate(timeout=600)
    assert second.returncode == 0, errors
    assert "resuming at step " in output + errors  # trial 0 from its own checkpoint
    finished = _finished([ledger])
    assert [entry["index"] for entry in finished] == [0, 1]
    assert ledger_json(ledger)["running"] == []
    study = optuna.load_study(study_name="s", storage=postgres_url)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "COMPLETE"]
    for entry in finished:
        assert study.trials[entry["index"]].params == entry["overrides"]


def test_a_database_lost_mid_sweep_is_one_line_and_loses_no_trial(
    tmp_path, optuna, postgres, postgres_url
):
    config, space = _files(tmp_path, steps=200)
    arguments = [config, space, "--trials", 2, "--search", "optuna"]
    arguments += ["--storage", postgres_url, "--study-name", "s"]
    ledger = tmp_path / "runs" / "tiny" / "ledger.json"
    worker = _dew(tmp_path, *arguments)
    _wait_for(lambda: ledger.exists() and ledger_json(ledger)["running"], [worker])
    postgres.stop()  # the database goes away while trial 0 trains
    try:
        _, errors = worker.communicate(timeout=600)
    finally:
        postgres.resume()
    assert worker.returncode == 2, errors
    (line,) = errors.strip().splitlines()
    assert line.startswith("dew sweep: Optuna storage 'postgresql+psycopg://dew@127.0.0.1:")
    assert "was lost mid-sweep" in line and "run the sweep again" in line
    assert [entry["index"] for entry in ledger_json(ledger)["trials"]] == [0]  # trial 0 kept

    worker = _dew(tmp_path, *arguments)
    _, errors = worker.communicate(timeout=600)
    assert worker.returncode == 0, errors
    assert _trained(tmp_path) == [0, 1]  # trial 0 was not trained again
    study = optuna.load_study(study_name="s", storage=postgres_url)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "COMPLETE"]
    assert [trial.value for trial in study.trials] == [
        entry["value"] for entry in ledger_json(ledger)["trials"]
    ]


def test_a_database_that_does_not_answer_at_start_is_one_line_and_exit_status_2(tmp_path, postgres):
    config, space = _files(tmp_path)
    url = postgres.url("no_such_database")
    worker = _dew(
        tmp_path,
        config,
        space,
        "--trials",
        2,
        "--search",
        "optuna",
        "--storage",
        url,
        "--study-name",
        "s",
    )
    _, errors = worker.communicate(timeout=300)
    assert worker.returncode == 2, errors
    (line,) = errors.strip().splitlines()
    assert line.startswith(f"dew sweep: Optuna storage {url!r} cannot be reached: "), line
    assert 'database "no_such_database" does not exist' in line
    assert not list((tmp_path / "runs" / "tiny").glob("trial-*"))


def test_the_fixture_s_server_is_postgresql(postgres_url):
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres_url)
    with engine.connect() as connection:
        version = connection.execute(sqlalchemy.text("select version()")).scalar()
    engine.dispose()
    assert version.startswith("PostgreSQL ")


_GRID_WORKER = """
import sys

import optuna
from _sweep_worker import base_config, make_train

from dew.config.sweep import optuna_search, sweep

optuna.logging.set_verbosity(optuna.logging.WARNING)
ledger, side_log, storage, go = sys.argv[1:5]
grid = [float(rate) for rate in sys.argv[5:]]
while not __import__("os").path.exists(go):  # every worker asks at once
    __import__("time").sleep(0.01)
sampler = optuna.samplers.GridSampler({"optim.learning_rate": grid}, seed=0)
search = optuna_search(storage=storage, study_name="grid", sampler=sampler)
sweep(
    base_config(), {"optim.learning_rate": grid}, train=make_train(side_log, 0.05),
    trials=len(grid), ledger=ledger, search=search,
)
"""


def test_optuna_s_grid_sampler_on_one_ledger_trains_each_grid_point_once(
    tmp_path, optuna, postgres_url
):
    """Optuna's `GridSampler` (optuna_search(sampler=...), through the Python API) with four
    workers on one ledger, released together on a fresh study of eight points: every point
    and every index trains once. optuna#2039 (several workers drawing one grid point) is
    closed upstream: Optuna 5 gives the first grid-size trials the grid point of their trial
    number (bare Optuna, four workers released together, 3 runs: no duplicate either); dew's
    trials are created through the same `Trial` (whose `before_trial` assigns it), and the
    ledger hands out each index once."""
    grid = [0.1 / 2**index for index in range(8)]
    ledger, side_log, go = tmp_path / "ledger.json", tmp_path / "side.log", tmp_path / "go"
    tests = os.path.dirname(__file__)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, *sys.path])}
    command = [sys.executable, "-c", _GRID_WORKER, ledger, side_log, postgres_url, go, *grid]
    workers = [
        subprocess.Popen(
            list(map(str, command)), env=environment, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        for _ in range(4)
    ]  # fmt: skip
    go.touch()
    for worker in workers:
        _, errors = worker.communicate(timeout=300)
        assert worker.returncode == 0, errors

    started = sorted(
        int(line.split()[1]) for line in side_log.read_text().splitlines() if line[:5] == "start"
    )
    assert started == list(range(8))  # every index trained, each once
    finished = ledger_json(ledger)["trials"]
    rates = sorted(entry["overrides"]["optim.learning_rate"] for entry in finished)
    assert rates == sorted(grid)  # every grid point once
    study = optuna.load_study(study_name="grid", storage=postgres_url)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 8
    assert sorted(trial.params["optim.learning_rate"] for trial in study.trials) == sorted(grid)
    workers_seen = {line.split()[2] for line in side_log.read_text().splitlines()}
    assert len(workers_seen) >= 2  # the points were shared out, not trained by one worker
