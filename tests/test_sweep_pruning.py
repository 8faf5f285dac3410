"""Pruning a sweep's trials (decision 0055): each trial reports its validation score at every
evaluation event to its Optuna trial, a trial the pruner stops ends there as pruned (its
checkpoint kept), the ledger records it apart, and a rerun neither retrains it nor loses the
pruner's intermediate values. Read back with Optuna's own client."""

import json
import math

import pytest
from _ledgers import ledger_json

from dew.cli import main
from dew.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
    objective_shapes,
)
from dew.config.sweep import optuna_search, pruning_stopper, sweep
from dew.registry import datasets

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

GOOD = [0.01, 0.03, 0.02]  # Adam on the tiny model: the perplexity falls
BAD = [100.0, 10000.0]  # Adam at these rates: the perplexity blows up to infinity
TINY = {
    "vocab_size": 16,
    "emb_features": 8,
    "num_layers": 1,
    "num_heads": 2,
    "mlp_features": 16,
    "max_seq_len": 8,
}
STEPS, EVERY = 12, 3  # four evaluation events a trial


def _events(path):
    """The ledger's event lines after its header, read with `json` alone."""
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def _ended(path):
    """Index -> (kind, body) of each trial's last finished or pruned event."""
    ended = {}
    for event in _events(path):
        [(kind, body)] = event.items()
        if kind in ("finished", "pruned"):
            ended[body["index"]] = (kind, body)
    return ended


# -- with a fake train: the sweep, the ledger and Optuna, no JAX --------------------------------


class _Seeing(optuna.pruners.MedianPruner):
    """Optuna's median pruner that keeps what the study held each time it was asked:
    `{number: (state, intermediate_values)}` read with Optuna's own client."""

    def __init__(self):
        super().__init__(n_startup_trials=2)
        self.seen = []

    def prune(self, study, trial):
        self.seen.append(
            {t.number: (t.state.name, dict(t.intermediate_values)) for t in study.trials}
        )
        return super().prune(study, trial)


def _score(index, step):
    """Trials 2 and 4 stay high; the others fall with the steps."""
    return 10.0 if index in (2, 4) else 1.0 / (step + index)


def _fake(calls, stop_at=None):
    def train(run):
        index = int(run.trainer.name.rsplit("trial-", 1)[1])
        calls.append(index)
        if index == stop_at:
            raise KeyboardInterrupt  # the sweep is interrupted while this trial trains
        stopper = pruning_stopper("loss")  # None without a pruner
        state = None if stopper is None else stopper.init()
        for step in range(1, 5):
            value = _score(index, step)
            if stopper is not None:
                state = stopper.update(state, value, step=step)
                if state.stop:
                    break
        return value

    return train


def _config():
    return RunConfig(ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name="demo"))


SPACE = {"optim.learning_rate": [0.01, 0.02]}


@pytest.mark.parametrize("stored", [False, True])
def test_a_rerun_neither_retrains_a_pruned_trial_nor_loses_its_intermediate_values(
    tmp_path, stored
):
    storage = f"sqlite:///{tmp_path / 'study.db'}" if stored else None
    pruner = _Seeing()
    search = optuna_search(
        storage=storage, study_name="s" if stored else None, pruner=pruner, sampler=None
    )
    ledger = tmp_path / "ledger.json"
    calls = []
    with pytest.raises(KeyboardInterrupt):
        sweep(
            _config(), SPACE, train=_fake(calls, stop_at=4), trials=6, ledger=ledger, search=search
        )
    assert calls == [0, 1, 2, 3, 4]
    ended = _ended(ledger)
    assert {index: kind for index, (kind, _) in ended.items()} == {
        0: "finished",
        1: "finished",
        2: "pruned",  # at its first report: 10 is past the median of trials 0 and 1
        3: "finished",
    }
    assert ended[2][1]["reports"] == [[1, 10.0]]
    assert ended[0][1]["reports"] == [[step, _score(0, step)] for step in range(1, 5)]

    # Run again, with a fresh pruner (an in-memory study is a fresh one too).
    pruner = _Seeing()
    search = optuna_search(storage=storage, study_name="s" if stored else None, pruner=pruner)
    calls = []
    trials = sweep(_config(), SPACE, train=_fake(calls), trials=6, ledger=ledger, search=search)
    assert calls == [4, 5]  # the pruned trial 2 is not trained again
    assert [trial.pruned for trial in trials] == [False, False, True, False, True, False]
    assert trials[2].value == 10.0 and trials[2].reports == {1: 10.0}
    # What the pruner saw while trial 4 trained: the earlier trials' intermediate values.
    before = pruner.seen[0]
    assert before[2] == ("PRUNED", {1: 10.0})
    assert before[0] == ("COMPLETE", {step: _score(0, step) for step in range(1, 5)})
    assert before[3][0] == "COMPLETE" and len(before[3][1]) == 4
    if stored:  # Optuna's own client reads the study back
        study = optuna.load_study(study_name="s", storage=storage)
        states = [trial.state.name for trial in study.trials]
        assert states == ["COMPLETE", "COMPLETE", "PRUNED", "COMPLETE", "PRUNED", "COMPLETE"]
        for trial in trials:
            assert study.trials[trial.index].intermediate_values == trial.reports
        assert study.best_trial.number == 5  # the lowest score of a complete trial


def test_sweep_pruner_is_optuna_search_s_pruner(tmp_path):
    """`sweep(..., pruner=...)`, as `dew sweep --pruner`: the pruner of its `optuna_search`."""
    calls = []
    search = optuna_search(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    pruner = _Seeing()
    trials = sweep(
        _config(), SPACE, train=_fake(calls), trials=6, ledger=tmp_path / "l.json",
        search=search, pruner=pruner,
    )  # fmt: skip
    assert [trial.pruned for trial in trials] == [False, False, True, False, True, False]
    assert pruner.seen and search.pruner is None  # the search given is left as it was
    read = ledger_json(tmp_path / "l.json")  # the ledger read with `json` alone
    assert [entry.get("pruned", False) for entry in read["trials"]] == [
        trial.pruned for trial in trials
    ]
    assert read["running"] == [] and read["trials"][2]["reports"] == [[1, 10.0]]


def _bare_optuna(storage, pruner):
    """The fake sweep's trials, their scores reported to a bare Optuna study of the same
    name: each trial's (pruned, reports) as Optuna's own loop decides them."""
    study = optuna.create_study(storage=storage, study_name="s", pruner=pruner)
    outcomes = []
    for index in range(6):
        trial, reports, pruned = study.ask(), {}, False
        for step in range(1, 5):
            reports[step] = _score(index, step)
            trial.report(reports[step], step)
            pruned = trial.should_prune()
            if pruned:
                break
        state = optuna.trial.TrialState.PRUNED if pruned else None
        study.tell(trial, None if pruned else reports[4], state=state)
        outcomes.append((pruned, reports))
    return outcomes


def test_hyperband_prunes_the_trials_bare_optuna_prunes(tmp_path):
    """`pruner="hyperband"` is Optuna's `HyperbandPruner()`: on the same study name (its
    brackets hash it with the trial numbers) and the same reported scores, the sweep prunes
    the trials, at the steps, that Optuna's own ask/report/tell loop prunes."""
    trials = sweep(
        _config(), SPACE, train=_fake([]), trials=6, ledger=tmp_path / "l.json",
        search=optuna_search(storage=f"sqlite:///{tmp_path / 'dew.db'}", study_name="s"),
        pruner="hyperband",
    )  # fmt: skip
    bare = _bare_optuna(f"sqlite:///{tmp_path / 'bare.db'}", optuna.pruners.HyperbandPruner())
    assert [(trial.pruned, trial.reports) for trial in trials] == bare
    assert [trial.index for trial in trials if trial.pruned] == [2, 4]  # the high ones
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'dew.db'}")
    assert [t.state.name for t in study.trials] == [
        "PRUNED" if trial.pruned else "COMPLETE" for trial in trials
    ]


def test_a_pruner_needs_an_optuna_search_and_is_given_once(tmp_path):
    train = _fake([])
    ledger = tmp_path / "l.json"
    with pytest.raises(ValueError, match=r"^pruner='median' needs search=optuna_search .* got "):
        sweep(_config(), SPACE, train=train, trials=2, ledger=ledger, pruner="median")
    twice = optuna_search(pruner="median")
    with pytest.raises(ValueError, match="both name a pruner; give it once"):
        sweep(
            _config(), SPACE, train=train, trials=2, ledger=ledger, search=twice, pruner="hyperband"
        )
    assert not ledger.exists()  # refused before the ledger is opened
    trials = sweep(_config(), SPACE, train=train, trials=2, ledger=ledger, pruner="none")
    assert len(trials) == 2  # "none" (as --pruner none) asks nothing of the search


def test_a_sweep_without_a_pruner_reports_nothing(tmp_path):
    calls = []
    trials = sweep(
        _config(),
        SPACE,
        train=_fake(calls),
        trials=3,
        ledger=tmp_path / "l.json",
        search=optuna_search,
    )
    assert calls == [0, 1, 2]
    assert all(not trial.pruned and trial.reports == {} for trial in trials)
    assert all("reports" not in body for _, body in _ended(tmp_path / "l.json").values())


def test_a_bad_pruner_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"pruner 'mean' is not one of 'median', 'hyperband'"):
        optuna_search(pruner="mean")
    with pytest.raises(TypeError, match="pruner must be one of"):
        optuna_search(pruner=3).check({})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--pruner", "mean"],
            "dew sweep: --pruner 'mean' is not one of 'median', 'hyperband', 'none'.",
        ),
        (
            ["--pruner", "median", "--search", "grid"],
            "dew sweep: --pruner median needs --search optuna",
        ),
    ],
)
def test_a_bad_pruner_option_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
    config = tmp_path / "run.toml"
    _trained_config(tmp_path).dump_toml(config)
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.01]\n')
    assert main(["sweep", str(config), str(space), "--trials", "2", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing written


# -- with real training: a tiny language model -----------------------------------------------


def _trained_config(tmp_path, name="tiny"):
    return RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=512),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name=name,
            checkpoint_dir=str(tmp_path / "runs"),
            steps=STEPS,
            batch_size=8,
            log_every=EVERY,
            eval_every=EVERY,
            checkpoint_every=None,
            on_nonfinite="continue",  # a diverging trial reaches its evaluation events
        ),
    )


def _real_sweep(tmp_path, name, pruner):
    """The sweep of GOOD then BAD learning rates, in that order (enqueued in a SQLite
    study); the trials' steps trained and the sweep's trials."""
    config = _trained_config(tmp_path, name)
    metrics = tuple(objective_shapes(config).default_metrics())
    storage = f"sqlite:///{tmp_path / (name + '.db')}"
    study = optuna.create_study(storage=storage, study_name=name)
    for rate in [*GOOD, *BAD]:
        study.enqueue_trial({"optim.learning_rate": rate})
    steps = {}

    def train(run):
        state = run.train(
            metrics=metrics, progress=False, early_stopper=pruning_stopper("perplexity")
        )
        steps[int(run.trainer.name.rsplit("-", 1)[1])] = int(state.step)
        return state.metric_history["lm/validation/perplexity"][-1][1]

    trials = sweep(
        config,
        {"optim.learning_rate": [*GOOD, *BAD]},
        train=train,
        trials=len(GOOD) + len(BAD),
        ledger=tmp_path / name / "ledger.json",
        search=optuna_search(storage=storage, study_name=name, pruner=pruner),
    )
    return steps, trials


@pytest.mark.slow  # ten tiny trainings, about a minute on a loaded 2-core machine
def test_diverging_trials_are_pruned_early_and_the_best_trial_stays(tmp_path):
    pruner = optuna.pruners.MedianPruner(n_startup_trials=len(GOOD))
    pruned_steps, pruned = _real_sweep(tmp_path, "pruned", pruner)
    full_steps, full = _real_sweep(tmp_path, "full", None)

    bad = range(len(GOOD), len(GOOD) + len(BAD))
    assert [trial.pruned for trial in pruned] == [index in bad for index in range(5)]
    assert not any(trial.pruned for trial in full)
    for index in bad:  # stopped at the first evaluation event, its checkpoint kept
        assert pruned_steps[index] == EVERY
        assert pruned[index].reports == {EVERY: math.inf}
        checkpoints = tmp_path / "runs" / "pruned" / f"trial-{index}" / "checkpoints"
        assert sorted(path.name for path in checkpoints.iterdir()) == [str(EVERY)]
    for index in range(len(GOOD)):  # the same runs, trained to their end either way
        assert pruned_steps[index] == full_steps[index] == STEPS
        assert pruned[index].value == full[index].value

    def best(trials):
        complete = [trial for trial in trials if not trial.pruned]
        return min(complete, key=lambda trial: trial.value).index

    assert best(pruned) == best(full)
    study = optuna.load_study(study_name="pruned", storage=f"sqlite:///{tmp_path / 'pruned.db'}")
    assert study.best_trial.number == best(full)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3 + ["PRUNED"] * 2
    # The steps trained: 3 x 12 + 2 x 3 = 42 against 5 x 12 = 60, 30 % fewer.
    assert sum(pruned_steps.values()) == 42 and sum(full_steps.values()) == 60


@pytest.mark.slow  # two tiny trainings through the command
def test_dew_sweep_pruner_median_prunes_and_dew_runs_shows_it(tmp_path, capsys):
    """`dew sweep --pruner median` on a study that already holds five complete trials
    (Optuna's MedianPruner prunes from the sixth): the diverging trial is pruned at its
    first evaluation event, shown apart by the sweep and `dew runs`, and not trained again."""
    config = tmp_path / "run.toml"
    _trained_config(tmp_path).dump_toml(config)
    space = tmp_path / "space.toml"
    space.write_text(f'"optim.learning_rate" = {[*GOOD, *BAD]}\n')
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="tiny")
    distributions = {
        "optim.learning_rate": optuna.distributions.CategoricalDistribution([*GOOD, *BAD])
    }
    for _ in range(5):  # five earlier trials of the study, none of this ledger's
        study.add_trial(
            optuna.trial.create_trial(
                params={"optim.learning_rate": 0.01},
                distributions=distributions,
                value=16.0,
                intermediate_values=dict.fromkeys(range(EVERY, STEPS + 1, EVERY), 16.0),
            )
        )
    study.enqueue_trial({"optim.learning_rate": BAD[0]})
    study.enqueue_trial({"optim.learning_rate": GOOD[1]})
    arguments = [
        "sweep",
        str(config),
        str(space),
        "--trials",
        "7",
        "--search",
        "optuna",
        "--storage",
        storage,
        "--study-name",
        "tiny",
        "--pruner",
        "median",
        "--quiet",
    ]
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    assert f"tiny/trial-5: pruned at step {EVERY}" in printed
    assert (
        f"trial 5  perplexity inf  {{'optim.learning_rate': 100.0}}  pruned at step {EVERY}"
        in printed
    )
    assert "best trial 6  " in printed
    states = [t.state.name for t in optuna.load_study(study_name="tiny", storage=storage).trials]
    assert states == ["COMPLETE"] * 5 + ["PRUNED", "COMPLETE"]
    ledger = tmp_path / "runs" / "tiny" / "ledger.json"
    assert {index: kind for index, (kind, _) in _ended(ledger).items()} == {
        5: "pruned",
        6: "finished",
    }

    assert main(["runs", str(tmp_path / "runs" / "tiny"), "--json"]) == 0
    rows = {row["run"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["trial-5"]["status"] == f"pruned (step {EVERY})"
    assert rows["trial-6"]["status"] == "completed"
    assert rows["sweep"]["status"] == "sweep, 2 trials, 1 pruned"
    assert rows["sweep"]["best_trial"]["index"] == 6

    assert main(arguments) == 0  # run again: nothing trains, the pruned trial included
    again = capsys.readouterr().out
    assert "trial 5/7" not in again and "trial 6/7" not in again
    assert "trial 5  perplexity inf  {'optim.learning_rate': 100.0}  pruned at step" in again
