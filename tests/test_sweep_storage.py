"""A sweep's Optuna storage and its errors: a bad or unreachable `--storage` is one line and
exit status 2, workers opening a fresh storage together all open the one study (optuna#1092,
#4621), the sweep's own state errors are one line, and a trial past the budget is kept for a
larger budget rather than failed (decision 0053)."""

import socket

import pytest
from _tiny_sweep_run import tiny_lm_run

from dew.cli import main
from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
from dew.config.sweep import Uniform, optuna_search, sweep
from dew.config.sweep._optuna_run import OWNER_ATTR

SPACE = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True)}


@pytest.fixture
def optuna():
    optuna = pytest.importorskip("optuna")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield optuna
    optuna.logging.set_verbosity(verbosity)


def config(name="exp"):
    return RunConfig(ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name=name))


def score(run):
    return abs(run.optim.learning_rate - 0.003)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _write_config(tmp_path):
    run = tiny_lm_run(tmp_path)
    path = tmp_path / "run.toml"
    run.dump_toml(path)
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = { low = 1e-4, high = 1e-1, log = true }\n')
    return path, space


def _sweep_arguments(tmp_path, storage, trials=2):
    path, space = _write_config(tmp_path)
    arguments = ["sweep", str(path), str(space), "--trials", str(trials), "--search", "optuna"]
    return [*arguments, "--storage", storage, "--study-name", "s", "--quiet"]


@pytest.mark.parametrize(
    ("storage", "named"),
    [
        ("notaurl", "a URL it can read"),
        ("postgres://dew@localhost/sweeps", "a URL it can read"),  # SQLAlchemy's is postgresql
        ("mysql://dew@localhost/sweeps", "a database driver that is not installed"),
        ("redis://localhost", "RedisStorage is removed"),
        ("sqlite:////no/such/folder/study.db", "cannot be reached: unable to open database"),
        ("postgresql+psycopg://dew:s3cret@127.0.0.1:{port}/sweeps", "cannot be reached"),
    ],
    ids=["not-a-url", "unknown-dialect", "missing-driver", "redis", "sqlite-folder", "refused"],
)
def test_a_bad_storage_is_one_line_naming_it_and_exit_status_2(
    tmp_path, capsys, optuna, storage, named
):
    if "psycopg" in storage:
        pytest.importorskip("psycopg")
    storage = storage.replace("{port}", str(_free_port()))
    assert main(_sweep_arguments(tmp_path, storage)) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("dew sweep: "), error
    assert named in error
    assert "s3cret" not in error  # a password is never printed
    assert repr(storage.replace("s3cret", "***")) in error
    if "reached" not in named:  # what is allowed
        assert "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE" in error
    assert not list((tmp_path / "runs").glob("tiny/trial-*"))  # nothing trained


def _interleaved(monkeypatch, owner, name, other):
    """Make `owner.name` first let `other()` (another worker) run to its end, once: the
    moment two workers race at, made to happen every time."""
    original = getattr(owner, name)
    raced = []

    def racing(*arguments, **kwargs):
        if not raced:
            raced.append(True)
            monkeypatch.setattr(owner, name, original)
            other()
            monkeypatch.setattr(owner, name, racing)
        return original(*arguments, **kwargs)

    monkeypatch.setattr(owner, name, racing)
    return raced


@pytest.mark.parametrize("moment", ["tables", "alembic-version", "study"])
def test_workers_opening_a_fresh_storage_together_all_open_the_one_study(
    tmp_path, optuna, monkeypatch, moment
):
    from optuna.storages._rdb import models
    from optuna.storages._rdb import storage as rdb

    url = f"sqlite:///{tmp_path / 'study.db'}"
    if moment == "tables":  # another worker creates the tables after this one found none
        metadata = models.BaseModel.metadata
        original, raced = metadata.create_all, []

        def create_all(engine, **kwargs):
            if raced:
                return original(engine, **kwargs)
            raced.append(True)
            original(engine)  # the other worker's
            return original(engine, checkfirst=False)  # this one's, its check passed before

        monkeypatch.setattr(metadata, "create_all", create_all)
    elif moment == "alembic-version":  # ... or Optuna's schema version, optuna#4621
        raced = _interleaved(
            monkeypatch,
            rdb._VersionManager,
            "_set_alembic_revision",
            lambda: optuna.storages.RDBStorage(url),
        )
    else:  # ... or the study itself, optuna#1092
        raced = _interleaved(
            monkeypatch,
            rdb.RDBStorage,
            "create_new_study",
            lambda: optuna.create_study(storage=url, study_name="race"),
        )
    search = optuna_search(storage=url, study_name="race")
    trials = sweep(
        config(), SPACE, train=score, trials=2, ledger=tmp_path / "l.json", search=search
    )
    assert raced  # the other worker did get in first
    assert [trial.index for trial in trials] == [0, 1]
    assert len(optuna.get_all_study_names(url)) == 1


def test_a_trial_past_the_budget_waits_for_a_larger_budget_instead_of_failing(
    tmp_path, optuna, monkeypatch
):
    from dew.config.sweep import _OptunaRun

    url = f"sqlite:///{tmp_path / 'study.db'}"
    search = optuna_search(storage=url, study_name="budget")
    ledger = tmp_path / "l.json"
    created = _OptunaRun._create

    def another_worker_first(self):  # another ledger's worker takes number 1 just before
        if len(self.study.trials) == 1:
            template = optuna.trial.create_trial(
                state=optuna.trial.TrialState.RUNNING,
                user_attrs={OWNER_ATTR: "elsewhere:/their/ledger.json"},
            )
            self.study._storage.create_new_trial(self.study._study_id, template_trial=template)
        return created(self)

    monkeypatch.setattr(_OptunaRun, "_create", another_worker_first)
    trials = sweep(config(), SPACE, train=score, trials=2, ledger=ledger, search=search)
    monkeypatch.setattr(_OptunaRun, "_create", created)
    assert [trial.index for trial in trials] == [0]  # 1 is the other worker's
    study = optuna.load_study(study_name="budget", storage=url)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "RUNNING", "WAITING"]

    trials = sweep(config(), SPACE, train=score, trials=3, ledger=ledger, search=search)
    assert [trial.index for trial in trials] == [0, 2]  # number 2 was kept for this budget
    study = optuna.load_study(study_name="budget", storage=url)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "RUNNING", "COMPLETE"]
    assert study.trials[2].user_attrs[OWNER_ATTR].endswith(str(ledger.resolve()))
    assert study.trials[2].value == trials[1].value


@pytest.mark.slow  # two tiny trials trained through the command: seconds, more under load
@pytest.mark.parametrize("error", ["unfinished", "taken"])
def test_the_sweep_s_state_errors_are_one_line_and_exit_status_2(
    tmp_path, capsys, optuna, monkeypatch, error
):
    import dew.config.sweep as sweep_module
    from dew.config.sweep import _ledger

    reserved = sweep_module._OptunaRun.reserve
    if error == "unfinished":  # trial 1 is created, then its process "dies" quietly

        def lose_trial_1(self, taken, claim, release):
            index = reserved(self, taken, claim, release)
            if index == 1:
                release(1)
                index = reserved(self, taken, claim, release)
            return index

        monkeypatch.setattr(sweep_module._OptunaRun, "reserve", lose_trial_1)
        message = "ended with trials [1] unfinished and no live process training them"
    else:  # another process holds index 1 in the ledger, but not in this process's study
        taken = _ledger._State.taken
        monkeypatch.setattr(_ledger._State, "taken", lambda self: {*taken(self), 1})
        message = "processes sharing a ledger must share an Optuna storage"
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    assert main(_sweep_arguments(tmp_path, storage, trials=3)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dew sweep: ") and message in err, err


def test_a_trial_reads_an_rdb_study_as_often_as_optuna_s_own_loop_does(
    optuna, tmp_path, monkeypatch
):
    """Each read of an RDB study is a query of its unfinished trials and their five tables:
    dew's ask reads the study once per trial (the waiting trials and the budget from one
    read), as Optuna's `study.optimize` does (issue 30, item 5: it read it twice)."""
    reads = []
    query = optuna.storages.RDBStorage._get_trials

    def counted(self, *args, **kwargs):
        reads.append(1)
        return query(self, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.RDBStorage, "_get_trials", counted)

    def bare(trials):
        url = f"sqlite:///{tmp_path / f'bare-{trials}.db'}"
        study = optuna.create_study(storage=url, sampler=optuna.samplers.RandomSampler(seed=0))
        reads.clear()
        study.optimize(lambda trial: trial.suggest_float("x", 1e-4, 1e-1, log=True), trials)
        return len(reads)

    def dew(trials):
        url = f"sqlite:///{tmp_path / f'dew-{trials}.db'}"
        optuna.create_study(storage=url, study_name="s")
        reads.clear()
        search = optuna_search(
            storage=url, study_name="s", sampler=optuna.samplers.RandomSampler(seed=0)
        )
        done = sweep(
            config(),
            SPACE,
            train=score,
            trials=trials,
            ledger=tmp_path / f"{trials}.json",
            search=search,
        )
        assert [trial.index for trial in done] == list(range(trials))
        return len(reads)

    per_trial_bare = (bare(9) - bare(4)) / 5
    per_trial_dew = (dew(9) - dew(4)) / 5
    assert per_trial_bare >= 1  # the reference reads the study on every trial
    assert per_trial_dew == per_trial_bare


def test_a_storage_without_a_study_name_is_refused_with_its_password_hidden():
    url = "postgresql+psycopg://dew:secret@127.0.0.1:9/sweeps"
    with pytest.raises(ValueError, match="needs study_name") as refused:
        optuna_search(storage=url)
    assert "secret" not in str(refused.value)
    assert "dew:***@127.0.0.1:9/sweeps" in str(refused.value)
