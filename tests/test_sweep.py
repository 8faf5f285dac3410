"""Sweeps: the search backends, the ledger, resuming, the tracker, and workers sharing a study."""

import itertools
import json
import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _checks import rejects
from _ledgers import ledger_json, old_ledger_text
from _sweep_worker import SPACE, base_config, make_train
from hypothesis import given
from hypothesis import strategies as st

from dew.config import (
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainerConfig,
    UndeclaredPathError,
    override,
)
from dew.config.sweep import (
    VALUE_TAG,
    Choice,
    IndexedSearch,
    IntUniform,
    Search,
    SearchRun,
    SweepStateError,
    Trial,
    Uniform,
    grid_search,
    optuna_search,
    random_search,
    sweep,
)
from dew.telemetry.records import TrialFinished, encode_json_value
from dew.tracking import InMemoryTracker, LocalTracker, read_journal

WORKER = pathlib.Path(__file__).with_name("_sweep_worker.py")
RATES = [0.01, 0.003, 0.001]


def config(name="exp"):
    return RunConfig(ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name=name))


class Recorder:
    """A `train` that records the configs it was given and scores them by a formula."""

    def __init__(self, fail_at=None):
        self.runs = []
        self.fail_at = fail_at

    def __call__(self, run):
        self.runs.append(run)
        if self.fail_at is not None and run.trainer.name.endswith(f"/trial-{self.fail_at}"):
            raise RuntimeError("trial crashed")
        return abs(math.log10(run.optim.learning_rate) + 2.5) + run.trainer.batch_size / 100

    @property
    def names(self):
        return [run.trainer.name for run in self.runs]


# -- search backends ---------------------------------------------------------------------------


def test_value_tag_is_a_three_segment_metric_tag():
    assert VALUE_TAG == "sweep/validation/value"


def test_grid_search_walks_the_product_in_order():
    space = {"optim.learning_rate": RATES, "trainer.batch_size": [8, 16], "optim.optimizer": ["a"]}
    product = list(itertools.product(*space.values()))
    points = [grid_search.point(space, index) for index in range(len(product))]
    assert [tuple(point.values()) for point in points] == product
    assert all(list(point) == list(space) for point in points)


def test_grid_search_stops_at_the_grid_size(tmp_path):
    train = Recorder()
    space = {"optim.learning_rate": RATES, "trainer.batch_size": [8, 16]}
    trials = sweep(
        config(), space, train=train, trials=10, ledger=tmp_path / "l.json", search=grid_search
    )
    assert [trial.index for trial in trials] == list(range(6))
    assert [tuple(trial.overrides.values()) for trial in trials] == list(
        itertools.product(RATES, [8, 16])
    )
    assert train.names == [f"exp/trial-{index}" for index in range(6)]


def test_grid_search_refuses_a_range(tmp_path):
    train = Recorder()
    with pytest.raises(ValueError, match=r"grid_search walks lists of choices.*'optim\.lear"):
        sweep(
            config(),
            {"optim.learning_rate": Uniform(1e-4, 1e-1)},
            train=train,
            trials=2,
            ledger=tmp_path / "l.json",
            search=grid_search,
        )
    assert train.runs == []
    assert not (tmp_path / "l.json").exists()


def test_random_search_is_reproducible_from_the_trial_index():
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True), "trainer.batch_size": [8, 16]}
    first = [random_search.point(space, index) for index in range(20)]
    again = [random_search(seed=0).point(space, index) for index in reversed(range(20))]
    assert first == again[::-1]
    other = [random_search(seed=1).point(space, index) for index in range(20)]
    assert first != other
    rates = {point["optim.learning_rate"] for point in first}
    assert len(rates) == 20  # each trial draws anew
    assert {point["trainer.batch_size"] for point in first} == {8, 16}


def test_random_search_draws_each_field_independently():
    # Adding a path after the others leaves their draws unchanged.
    small = {"optim.learning_rate": Uniform(1e-4, 1e-1)}
    large = {**small, "trainer.batch_size": [8, 16]}
    for index in range(5):
        assert (
            random_search.point(small, index)["optim.learning_rate"]
            == random_search.point(large, index)["optim.learning_rate"]
        )


@st.composite
def fields(draw):
    kind = draw(st.sampled_from(["choice", "uniform", "int"]))
    if kind == "choice":
        values = draw(
            st.lists(
                st.one_of(st.integers(-5, 5), st.text(max_size=3), st.booleans(), st.none()),
                min_size=1,
                max_size=5,
                unique_by=lambda value: json.dumps(value),
            )
        )
        return Choice(tuple(values))
    log = draw(st.booleans())
    if kind == "uniform":
        low = draw(st.floats(1e-6 if log else -1e6, 1e6, allow_nan=False))
        high = draw(st.floats(low, 2e6, allow_nan=False).filter(lambda high: high > low))
        return Uniform(low, high, log=log)
    low = draw(st.integers(1 if log else -1000, 1000))
    return IntUniform(low, draw(st.integers(low + 1, 2000)), log=log)


@given(
    space=st.dictionaries(st.sampled_from("abcdef"), fields(), min_size=1, max_size=4),
    index=st.integers(0, 10**6),
    seed=st.integers(0, 2**32),
)
def test_random_draws_lie_in_the_space(space, index, seed):
    point = random_search(seed=seed).point(space, index)
    assert list(point) == list(space)
    for path, spec in space.items():
        value = point[path]
        if isinstance(spec, Choice):
            assert value in spec.values
        elif isinstance(spec, Uniform):
            assert isinstance(value, float)
            assert spec.low <= value <= spec.high
        else:
            assert isinstance(value, int)
            assert spec.low <= value <= spec.high


@given(
    space=st.dictionaries(st.sampled_from("abcdef"), fields(), min_size=1, max_size=4),
    index=st.integers(0, 10**6),
    value=st.floats(allow_nan=True),
    seed=st.integers(0, 2**32),
)
def test_the_ledger_reads_back_every_entry_a_sweep_writes(space, index, value, seed):
    # What a sweep writes (a random point of the space, encoded as the ledger holds it, any
    # score) reads back equal, and the same entry with its stored space: the ledger's laws.
    from dew.config.sweep._ledger import read_entry
    from dew.config.sweep._space import _space_from_json, _space_json
    from dew.config.sweep._sweep import _canonical

    point = _canonical(random_search(seed=seed).point(space, index))
    entry = json.loads(
        json.dumps(encode_json_value({"index": index, "overrides": point, "value": value}))
    )
    stored = _space_from_json(json.loads(json.dumps(_space_json(space))))
    for read_space in (space, stored):
        trial = read_entry(entry, "trials[0]", space=read_space, budget=index + 1, finished=True)
        assert trial.index == index and trial.overrides == point
        assert trial.value == value or (math.isnan(value) and math.isnan(trial.value))
    with pytest.raises(ValueError, match=rf"trials\[0\] has trial index {index}, not an"):
        read_entry(entry, "trials[0]", space=space, budget=index, finished=True)


def test_a_choice_is_compared_as_json_so_true_is_not_one():
    from dew.config.sweep._ledger import read_entry

    space = {"p": Choice((1, 2))}
    for bad in (True, 1.0, "1"):
        entry = {"index": 0, "overrides": {"p": bad}}
        with pytest.raises(ValueError, match=rf"has p = {bad!r}, not one of the choices \[1, 2\]"):
            read_entry(entry, "running[0]", space=space, budget=1, finished=False)
    assert read_entry(
        {"index": 0, "overrides": {"p": 2}}, "running[0]", space=space, budget=1, finished=False
    ).overrides == {"p": 2}


def test_random_search_configurations():
    assert random_search.seed == 0
    assert random_search(seed=5).name == "random(seed=5)"
    assert grid_search() is grid_search
    assert isinstance(optuna_search(direction="maximize"), Search)
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        random_search(seed=-1)
    with pytest.raises(ValueError, match="needs study_name"):
        optuna_search(storage="sqlite:///x.db")
    with pytest.raises(ValueError, match="direction 'up' is not one of"):
        optuna_search(direction="up")


# -- the sweep ----------------------------------------------------------------------------------


def test_sweep_trains_one_named_run_per_point_and_returns_the_ledger(tmp_path):
    train = Recorder()
    ledger = tmp_path / "sweep" / "ledger.json"
    space = {"optim.learning_rate": RATES, "trainer.batch_size": [8, 16]}
    trials = sweep(config(), space, train=train, trials=4, ledger=ledger, search=random_search)

    assert train.names == [f"exp/trial-{index}" for index in range(4)]
    points = [random_search.point(space, index) for index in range(4)]
    for run, point in zip(train.runs, points, strict=True):
        assert run.optim.learning_rate == point["optim.learning_rate"]
        assert run.trainer.batch_size == point["trainer.batch_size"]
        assert run.model == config().model and run.trainer.steps == config().trainer.steps
    scores = [Recorder()(run) for run in train.runs]
    assert trials == [
        Trial(index, point, score)
        for index, (point, score) in enumerate(zip(points, scores, strict=True))
    ]
    # The file as JSON lines read by `json` alone: its header, then one event per line.
    header, *events = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert ledger.read_text().endswith("\n")
    entries = [
        {"index": trial.index, "overrides": trial.overrides, "value": trial.value}
        for trial in trials
    ]
    assert events == [
        event
        for entry in entries
        for event in (
            {"running": {"index": entry["index"], "overrides": entry["overrides"]}},
            {"finished": entry},
        )
    ]
    assert header == {key: value for key, value in ledger_json(ledger).items() if key in header}
    data = ledger_json(ledger)
    assert data == {
        "version": 2,
        "space": {
            "optim.learning_rate": {"kind": "choice", "values": RATES},
            "trainer.batch_size": {"kind": "choice", "values": [8, 16]},
        },
        "search": "random(seed=0)",
        "config": config().to_dict(),
        "direction": "minimize",
        "budget": 4,  # the largest trial budget a sweep of this ledger had
        "trials": [
            {"index": trial.index, "overrides": trial.overrides, "value": trial.value}
            for trial in trials
        ],
        "running": [],
    }
    assert list(data["space"]) == list(space)


def test_the_doc_example_shape(tmp_path):
    tracker = InMemoryTracker()
    with tracker:
        trials = sweep(
            config("lm-rate"),
            {"optim.learning_rate": [0.01, 0.003]},
            train=Recorder(),
            trials=2,
            ledger=str(tmp_path / "runs/sweep/ledger.json"),
            tracker=tracker,
            search=grid_search,
        )
    best = min(trials, key=lambda trial: trial.value)
    assert best.overrides == {"optim.learning_rate": 0.003}


def test_ranges_reach_the_config(tmp_path):
    train = Recorder()
    space = {
        "optim.learning_rate": Uniform(1e-4, 1e-1, log=True),
        "trainer.steps": IntUniform(5, 9),
    }
    trials = sweep(config(), space, train=train, trials=3, ledger=tmp_path / "l.json")
    for trial, run in zip(trials, train.runs, strict=True):
        assert 1e-4 <= run.optim.learning_rate <= 1e-1
        assert run.trainer.steps in range(5, 10)
        assert trial.overrides == {
            "optim.learning_rate": run.optim.learning_rate,
            "trainer.steps": run.trainer.steps,
        }


def test_non_finite_scores_are_kept_as_data(tmp_path):
    scores = iter([math.nan, math.inf, -math.inf, 1.5])
    ledger = tmp_path / "l.json"
    tracker = InMemoryTracker()
    trials = sweep(
        config(),
        {"optim.learning_rate": RATES},
        train=lambda run: next(scores),
        trials=4,
        ledger=ledger,
        tracker=tracker,
    )
    values = [trial.value for trial in trials]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 1.5]
    assert [entry["value"] for entry in ledger_json(ledger)["trials"]] == [
        "NaN",
        "+Inf",
        "-Inf",
        1.5,
    ]
    assert tracker.scalars[VALUE_TAG][1:] == [(1, math.inf), (2, -math.inf), (3, 1.5)]
    rerun = sweep(
        config(),
        {"optim.learning_rate": RATES},
        train=Recorder(),
        trials=4,
        ledger=ledger,
    )
    assert math.isnan(rerun[0].value) and rerun[1:] == trials[1:]


def test_numpy_and_zero_dimensional_scores_become_floats(tmp_path):
    trials = sweep(
        config(),
        {"optim.learning_rate": RATES},
        train=lambda run: np.float32(0.5),
        trials=1,
        ledger=tmp_path / "l.json",
    )
    assert trials[0].value == 0.5 and type(trials[0].value) is float


def test_a_score_that_is_not_a_number_raises(tmp_path):
    with pytest.raises(TypeError, match=r"train returned 'low' of type str for trial 0"):
        sweep(
            config(),
            {"optim.learning_rate": RATES},
            train=lambda run: "low",
            trials=1,
            ledger=tmp_path / "l.json",
        )


# -- bad input, refused before training --------------------------------------------------------


def test_a_sweep_needs_a_trainer_name(tmp_path):
    train = Recorder()
    with pytest.raises(ValueError, match=r"sweep needs config.trainer.name \(got None\)"):
        sweep(config(None), {"optim.learning_rate": RATES}, train=train, trials=2, ledger=tmp_path)
    assert train.runs == []


def test_an_undeclared_path_raises_before_any_training(tmp_path):
    train = Recorder()
    space = {"optim.learning_rate": RATES, "optim.learning_rat": [0.1]}
    with pytest.raises(
        UndeclaredPathError, match=r"nearest declared paths: 'optim\.learning_rate'"
    ):
        sweep(config(), space, train=train, trials=2, ledger=tmp_path / "l.json")
    assert train.runs == []
    assert not (tmp_path / "l.json").exists()


def test_a_value_the_config_refuses_raises_before_any_training(tmp_path):
    train = Recorder()
    with pytest.raises(ValueError, match="batch_size") as caught:
        sweep(
            config(),
            {"optim.learning_rate": RATES, "trainer.batch_size": [8, 0]},
            train=train,
            trials=2,
            ledger=tmp_path / "l.json",
        )
    assert "sweep space path 'trainer.batch_size' with value 0" in "\n".join(caught.value.__notes__)
    assert train.runs == []


@pytest.mark.parametrize(
    ("space", "error", "match"),
    [
        ({}, ValueError, "space is empty"),
        ({"optim.learning_rate": []}, ValueError, "Choice.values is empty"),
        ({"optim.learning_rate": 0.01}, TypeError, r"is 0.01 \(did you mean \[0.01\]\?\)"),
        ({"optim.optimizer": "adam"}, TypeError, r"did you mean \['adam'\]"),
        ({"optim.learning_rate": [0.01, 0.01]}, ValueError, "repeats 0.01"),
        ({"optim.optimizer": ["NaN"]}, ValueError, "reserves for a non-finite float"),
        ({"optim.learning_rate": [math.nan]}, ValueError, "is NaN"),
        ({"optim.kwargs": [{1: 2}]}, TypeError, "mapping keys must be strings"),
        ({"optim.kwargs": [object()]}, TypeError, "a space holds None, bool"),
        ({"trainer.name": ["a", "b"]}, ValueError, "sweep sets for each trial"),
    ],
)
def test_a_bad_space_is_refused(tmp_path, space, error, match):
    train = Recorder()
    with pytest.raises(error, match=match):
        sweep(config(), space, train=train, trials=2, ledger=tmp_path / "l.json")
    assert train.runs == []


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Uniform(1.0, 1.0), ValueError, "needs low < high, got low=1.0, high=1.0"),
        (lambda: Uniform(0.0, 1.0, log=True), ValueError, r"log=True\) needs low > 0"),
        (lambda: Uniform(0.0, math.inf), TypeError, "must be finite real numbers"),
        (lambda: IntUniform(3, 2), ValueError, "needs low < high"),
        (lambda: IntUniform(0, 4, log=True), ValueError, "needs low > 0"),
    ],
)
def test_bad_ranges_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_non_integer_range_is_refused():
    with rejects(TypeError, "IntUniform.low must be finite integers", parameter="low"):
        IntUniform(0.5, 3)


@pytest.mark.parametrize("trials", [0, -1])
def test_trials_must_be_positive(tmp_path, trials):
    with pytest.raises(ValueError, match=f"trials must be an integer >= 1, got {trials}"):
        sweep(
            config(),
            {"optim.learning_rate": RATES},
            train=Recorder(),
            trials=trials,
            ledger=tmp_path,
        )


def test_search_must_be_a_search(tmp_path):
    with rejects(TypeError, "search must be a Search", parameter="search"):
        sweep(
            config(),
            {"optim.learning_rate": RATES},
            train=Recorder(),
            trials=1,
            ledger=tmp_path / "l.json",
            search="grid",
        )


# -- the ledger ----------------------------------------------------------------------------------


def test_a_rerun_continues_without_retraining(tmp_path):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True)}
    first = Recorder()
    done = sweep(config(), space, train=first, trials=3, ledger=ledger)
    second = Recorder()
    more = sweep(config(), space, train=second, trials=5, ledger=ledger)
    assert second.names == ["exp/trial-3", "exp/trial-4"]
    assert more[:3] == done
    third = Recorder()
    assert sweep(config(), space, train=third, trials=5, ledger=ledger) == more
    assert third.runs == []
    # A smaller budget trains nothing and still returns every finished trial.
    assert sweep(config(), space, train=third, trials=2, ledger=ledger) == more
    assert third.runs == []
    uninterrupted = sweep(config(), space, train=Recorder(), trials=5, ledger=tmp_path / "u.json")
    assert more == uninterrupted


def test_a_trial_that_failed_mid_training_is_retrained_first(tmp_path):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": RATES, "trainer.batch_size": [8, 16, 32]}
    crashing = Recorder(fail_at=2)
    with pytest.raises(RuntimeError, match="trial crashed"):
        sweep(config(), space, train=crashing, trials=5, ledger=ledger, search=grid_search)
    data = ledger_json(ledger)
    assert [entry["index"] for entry in data["trials"]] == [0, 1]
    assert data["running"] == [{"index": 2, "overrides": grid_search.point(space, 2)}]
    rerun = Recorder()
    trials = sweep(config(), space, train=rerun, trials=5, ledger=ledger, search=grid_search)
    assert rerun.names == ["exp/trial-2", "exp/trial-3", "exp/trial-4"]
    assert [trial.overrides for trial in trials] == [grid_search.point(space, i) for i in range(5)]
    assert ledger_json(ledger)["running"] == []


def _refused(tmp_path, ledger, match, base=None, **kwargs):
    before = ledger.read_bytes()
    train = Recorder()
    arguments = {
        "space": {"optim.learning_rate": RATES},
        "trials": 3,
        "search": random_search,
        **kwargs,
    }
    with pytest.raises(ValueError, match=match) as caught:
        sweep(base or config(), arguments.pop("space"), train=train, ledger=ledger, **arguments)
    assert str(ledger) in str(caught.value)
    assert train.runs == []
    assert ledger.read_bytes() == before
    return str(caught.value)


def test_a_ledger_for_another_space_is_refused(tmp_path):
    ledger = tmp_path / "l.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=2, ledger=ledger)
    message = _refused(
        tmp_path, ledger, "was written for another space", space={"optim.learning_rate": [0.1]}
    )
    assert "'optim.learning_rate' is {'kind': 'choice', 'values': [0.1]} here" in message
    message = _refused(
        tmp_path,
        ledger,
        "another space",
        space={"optim.learning_rate": RATES, "trainer.steps": [5]},
    )
    assert "this sweep has paths ['trainer.steps'] the ledger does not" in message
    message = _refused(
        tmp_path, ledger, "another space", space={"optim.learning_rate": Uniform(0.001, 0.01)}
    )
    assert "'kind': 'uniform'" in message


def test_a_ledger_for_another_base_configuration_is_refused(tmp_path):
    ledger = tmp_path / "l.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=2, ledger=ledger)
    longer = override(config(), {"trainer.steps": config().trainer.steps + 1})
    message = _refused(tmp_path, ledger, "another base configuration", base=longer)
    assert "sections that differ: trainer" in message


def test_a_moved_sweep_folder_continues_where_it_is_now(tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    space = {"optim.learning_rate": RATES}
    here = override(config(), {"trainer.checkpoint_dir": "runs"})  # relative
    sweep(here, space, train=Recorder(), trials=1, ledger="runs/exp/ledger.json")
    shutil.move(tmp_path / "runs", tmp_path / "elsewhere")
    # Moved, and named by its absolute path: where the sweep's folder is is no part of its
    # base configuration, so the ledger is the same sweep's and its finished trial stands.
    moved = override(config(), {"trainer.checkpoint_dir": str(tmp_path / "elsewhere")})
    ledger = tmp_path / "elsewhere" / "exp" / "ledger.json"
    rerun = Recorder()
    trials = sweep(moved, space, train=rerun, trials=3, ledger=ledger, search=random_search)
    assert rerun.names == ["exp/trial-1", "exp/trial-2"]
    assert [trial.index for trial in trials] == [0, 1, 2]
    assert rerun.runs[0].trainer.checkpoint_dir == str(tmp_path / "elsewhere")
    # A truly different base configuration is still refused.
    _refused(
        tmp_path, ledger, "another base configuration", base=override(moved, {"trainer.seed": 1})
    )


def test_a_ledger_for_paths_in_another_order_is_refused(tmp_path):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": RATES, "trainer.steps": [5, 6]}
    sweep(config(), space, train=Recorder(), trials=2, ledger=ledger)
    reordered = dict(reversed(space.items()))
    message = _refused(tmp_path, ledger, "another space", space=reordered)
    assert "the paths are in another order" in message


def test_a_ledger_for_another_search_is_refused(tmp_path):
    ledger = tmp_path / "l.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=2, ledger=ledger)
    message = _refused(tmp_path, ledger, "was written by search 'random", search=grid_search)
    assert "this sweep uses 'grid'" in message
    _refused(
        tmp_path,
        ledger,
        r"search 'random\(seed=0\)'.*'random\(seed=1\)'",
        search=random_search(seed=1),
    )


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"version": 1, "space": {', "is not valid JSON"),
        ("[]", "holds list, not a JSON object"),
        ('{"version": 1}', "it has no 'space', 'search', 'config', 'trials'"),
        ('{"version": 3, "space": {}, "search": "x", "config": {}, "trials": []}', "has version 3"),
        ('{"version": 2, "space": {}, "search": "x", "config": {}}\n', "has no 'direction', 'bu"),
        ('{\n "version": 2\n}\n', "a version-2 ledger holds one JSON object a line"),
    ],
)
def test_a_corrupt_ledger_is_refused(tmp_path, text, match):
    ledger = tmp_path / "l.json"
    ledger.write_text(text)
    _refused(tmp_path, ledger, match)


def test_a_ledger_with_malformed_trials_is_refused(tmp_path):
    ledger = tmp_path / "l.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=2, ledger=ledger)
    data = ledger_json(ledger)
    data["trials"][1]["index"] = 0
    ledger.write_text(old_ledger_text(data))
    _refused(tmp_path, ledger, "'trials' holds index 0 twice")
    data["trials"][1] = {"index": 1, "overrides": {"optim.learning_rate": 0.01}, "value": "low"}
    ledger.write_text(old_ledger_text(data))
    _refused(tmp_path, ledger, r"trials\[1\] \(trial 1\) has value 'low', not a number")


def _edited(data, trial=None, **changes):
    """The ledger `data` with `changes` at its top level and, for `trial`, in its first trial."""
    data = json.loads(json.dumps({**data, "version": 1}))
    if trial is not None:
        data["trials"][0].update(trial)
    return json.dumps({**data, **changes})


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            {"trial": {"index": 10**30}},
            r"trials\[0\] has trial index 1000000000000000000000000000000, not an integer in "
            r"\[0, 2\), the trial budget",
        ),
        (
            {"trial": {"overrides": {"optim.learning_rate": "x"}}},
            r"trials\[0\] \(trial 0\) has optim.learning_rate = 'x', not one of the choices "
            r"\[0.01, 0.003, 0.001\]",
        ),
        (
            {"trial": {"overrides": {"optim.learning_rate": 0.5}}},
            r"has optim.learning_rate = 0.5, not one of the choices",
        ),
        ({"trial": {"value": 10**400}}, r"\(trial 0\) has value 1000.*\.\.\., past a float"),
        ({"trial": {"value": True}}, r"\(trial 0\) has value True, not a number"),
        ({"trial": {"note": "mine"}}, r"trials\[0\] has \['index', 'note', 'overrides', 'valu"),
        ({"notes": "mine"}, r"it has unknown keys \['notes'\]"),
        ({"budget": "x"}, r"its budget is 'x', not an integer in \[1, 9223372036854775807\]"),
        ({"config": [1]}, r"its config is \[1\], not a JSON object"),
        ({"space": {"optim.learning_rate": {"kind": "choice"}}}, "its space path 'optim.lea"),
        ({"running": [{"index": 1, "overrides": {"optim.learning_rate": 0.01}}]}, "finished in"),
    ],
)
def test_a_hand_edited_ledger_is_refused_naming_the_file_the_trial_and_the_value(
    tmp_path, edit, match
):
    ledger = tmp_path / "l.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=2, ledger=ledger)
    data = ledger_json(ledger)
    ledger.write_text(_edited(data, **edit))
    message = _refused(tmp_path, ledger, f"is malformed: (.* )?{match}")
    assert "\n" not in message


def test_a_ledger_without_a_budget_still_bounds_its_indices(tmp_path):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": RATES}
    sweep(config(), space, train=Recorder(), trials=2, ledger=ledger)
    data = ledger_json(ledger)
    del data["budget"]  # as a ledger written before the budget was recorded
    data["trials"][1]["index"] = 7
    ledger.write_text(old_ledger_text(data))
    rerun = Recorder()  # trial 1 is missing now: it trains; trial 7 is kept
    trials = sweep(config(), space, train=rerun, trials=2, ledger=ledger)
    assert [trial.index for trial in trials] == [0, 1, 7] and rerun.names == ["exp/trial-1"]
    assert ledger_json(ledger)["budget"] == 8  # what its trials tell
    assert sweep(config(), space, train=rerun, trials=2, ledger=ledger) == trials
    data["trials"][1]["index"] = 2**63 - 1
    ledger.write_text(old_ledger_text(data))
    _refused(
        tmp_path, ledger, r"has trial index 9223372036854775807, not an integer in \[0, 2\*\*63"
    )


def test_a_budget_larger_once_keeps_its_trials_readable(tmp_path):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True)}
    sweep(config(), space, train=Recorder(), trials=4, ledger=ledger)
    again = sweep(config(), space, train=Recorder(), trials=2, ledger=ledger)
    assert [trial.index for trial in again] == [0, 1, 2, 3]
    assert ledger_json(ledger)["budget"] == 4


@pytest.mark.parametrize(
    ("proposal", "match"),
    [
        (
            (5, {"optim.learning_rate": 0.01}),
            r"for trial 5: the proposal has trial index 5, not an integer in \[0, 3\)",
        ),
        (
            (0, {"optim.learning_rate": 0.5}),
            r"for trial 0: the proposal \(trial 0\) has optim.learning_rate = 0.5, not one",
        ),
        (
            (0, {"optim.lr": 0.01}),
            r"sets the paths \['optim.lr'\], not the space's \['optim.learning_rate'\]",
        ),
    ],
)
def test_a_search_proposing_what_the_ledger_would_refuse_is_refused_first(
    tmp_path, proposal, match
):
    class Run(SearchRun):
        def ask(self, taken):
            return None if taken else proposal

    class Fixed(Search):
        name = "fixed"

        def start(self, space, *, trials, finished, running):
            return Run()

    ledger = tmp_path / "l.json"
    train = Recorder()
    with pytest.raises(ValueError, match=r"the search proposed .*" + match):
        sweep(
            config(),
            {"optim.learning_rate": RATES},
            train=train,
            trials=3,
            ledger=ledger,
            search=Fixed(),
        )
    assert train.runs == []
    assert ledger_json(ledger)["running"] == []  # nothing it refuses was written


def test_a_ledger_write_leaves_no_temporary_files(tmp_path):
    ledger = tmp_path / "l.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=3, ledger=ledger)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["l.json", "l.json.lock"]
    (tmp_path / f".l.json.{'0a' * 16}.tmp").write_text("{")  # a process died mid-write
    (tmp_path / ".l.json.other.tmp").write_text("{")  # not a temporary file of this ledger
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=3, ledger=ledger)
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [".l.json.other.tmp", "l.json", "l.json.lock"]


# -- the tracker -------------------------------------------------------------------------------


def test_the_tracker_gets_each_score_and_record_once(tmp_path):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": RATES}
    tracker = InMemoryTracker()
    first = sweep(config(), space, train=Recorder(), trials=2, ledger=ledger, tracker=tracker)
    trials = sweep(config(), space, train=Recorder(), trials=3, ledger=ledger, tracker=tracker)
    assert trials[:2] == first
    assert tracker.scalars == {VALUE_TAG: [(trial.index, trial.value) for trial in trials]}
    assert tracker.artifacts == {
        "trial_finished": [
            (
                trial.index,
                TrialFinished(trial=trial.index, overrides=trial.overrides, value=trial.value),
            )
            for trial in trials
        ]
    }


def test_a_tracker_that_takes_scalars_gets_the_scores_and_a_non_tracker_trains_nothing(
    tmp_path,
):
    class OnlyScalars:  # document 000's "tracker that only takes scalars"
        def __init__(self):
            self.scores = []

        def log_metrics(self, values, *, step):
            self.scores.append((step, dict(values)))

    space, train = {"optim.learning_rate": RATES}, Recorder()
    tracker = OnlyScalars()
    trials = sweep(
        config(), space, train=train, trials=2, ledger=tmp_path / "l.json", tracker=tracker
    )
    assert tracker.scores == [(trial.index, {VALUE_TAG: trial.value}) for trial in trials]

    class Stepless:
        def log_metrics(self, values):
            pass

    trained = len(train.runs)
    with pytest.raises(TypeError, match="its log_metrics takes no step keyword"):
        sweep(
            config(), space, train=train, trials=2, ledger=tmp_path / "m.json", tracker=Stepless()
        )
    assert len(train.runs) == trained


def test_the_tracker_is_told_after_the_ledger(tmp_path):
    ledger = tmp_path / "l.json"

    class Checking(InMemoryTracker):
        def log_metrics(self, values, *, step):
            indices = [entry["index"] for entry in ledger_json(ledger)["trials"]]
            assert step in indices
            super().log_metrics(values, step=step)

    tracker = Checking()
    sweep(
        config(),
        {"optim.learning_rate": RATES},
        train=Recorder(),
        trials=3,
        ledger=ledger,
        tracker=tracker,
    )
    assert [step for step, _ in tracker.scalars[VALUE_TAG]] == [0, 1, 2]


def test_a_local_tracker_journals_the_sweep(tmp_path):
    folder = tmp_path / "tracking"
    with LocalTracker(folder) as tracker:
        trials = sweep(
            config(),
            {"optim.learning_rate": RATES, "trainer.batch_size": [8, 16]},
            train=Recorder(),
            trials=4,
            ledger=tmp_path / "l.json",
            tracker=tracker,
            search=grid_search,
        )
    journal = read_journal(folder)
    assert journal.scalars == {VALUE_TAG: [(trial.index, trial.value) for trial in trials]}
    assert journal.records == [
        (
            "trial_finished",
            trial.index,
            TrialFinished(trial=trial.index, overrides=trial.overrides, value=trial.value),
        )
        for trial in trials
    ]


# -- a sweep killed at random moments ----------------------------------------------------------


def _worker(*arguments, **kwargs):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, str(WORKER), *map(str, arguments)]
    return subprocess.Popen(
        command,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


def _ledger_state(path):
    """The finished indices of a ledger, whose every line but a torn last one must be JSON
    whenever it exists."""
    if not path.exists():
        return set()
    return {entry["index"] for entry in ledger_json(path)["trials"]}


@pytest.mark.slow
def test_a_sweep_killed_at_random_moments_finishes_without_retraining(tmp_path):
    rng = random.Random(20260)
    trials = 24
    ledger, side_log = tmp_path / "ledger.json", tmp_path / "side.log"
    arguments = ("--ledger", ledger, "--side-log", side_log, "--trials", trials, "--sleep", 0.06)
    checkpoints = []  # (side-log length, finished indices) after each kill
    kills = cut_off = 0
    for _ in range(15):
        if kills == 5 or len(_ledger_state(ledger)) == trials:
            break
        started = len(_lines(side_log))
        worker = _worker(*arguments)
        deadline = time.monotonic() + 60
        while len(_lines(side_log)) == started and worker.poll() is None:
            assert time.monotonic() < deadline, "the worker never started a trial"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.25))
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            kills += 1
        _, errors = worker.communicate()
        assert worker.returncode in (0, -signal.SIGKILL), errors
        finished = _ledger_state(ledger)  # whole JSON lines after every kill
        checkpoints.append((len(_lines(side_log)), finished))
        cut_off += bool(ledger_json(ledger)["running"])
    worker = _worker(*arguments)
    output, errors = worker.communicate(timeout=120)
    assert worker.returncode == 0, errors
    assert kills >= 3
    assert cut_off >= 1  # at least one kill landed mid-training

    lines = [line.split() for line in _lines(side_log)]
    for length, finished in checkpoints:
        restarted = [int(index) for kind, index, _ in lines[length:] if kind == "start"]
        assert not finished & set(restarted), (finished, restarted)
    starts = [int(index) for kind, index, _ in lines if kind == "start"]
    assert set(starts) == set(range(trials))
    assert len(starts) <= trials + kills  # only a trial cut off by a kill starts again

    data = ledger_json(ledger)
    assert data["running"] == []
    assert output.split() == [str(index) for index in range(trials)]
    uninterrupted = sweep(
        base_config(),
        SPACE,
        train=make_train(tmp_path / "other.log", 0.0),
        trials=trials,
        ledger=tmp_path / "uninterrupted.json",
        search=random_search(seed=3),
    )
    assert data["trials"] == ledger_json(tmp_path / "uninterrupted.json")["trials"]
    assert [trial.index for trial in uninterrupted] == list(range(trials))


# -- Optuna ----------------------------------------------------------------------------------------


@pytest.fixture
def optuna():
    optuna = pytest.importorskip("optuna")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield optuna
    optuna.logging.set_verbosity(verbosity)


def _spy_sampler(optuna):
    class Spy(optuna.samplers.RandomSampler):
        """A random sampler that records the trials the study held at each draw."""

        def __init__(self):
            super().__init__(seed=0)
            self.seen = []

        def sample_independent(self, study, trial, name, distribution):
            held = study.get_trials(deepcopy=False)
            self.seen.append([(t.number, t.state.name, t.params, t.value) for t in held])
            return super().sample_independent(study, trial, name, distribution)

    return Spy()


def test_optuna_search_tells_the_study_the_ledger(tmp_path, optuna):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True), "trainer.batch_size": [8, 16]}
    first = sweep(
        config(),
        space,
        train=Recorder(),
        trials=3,
        ledger=ledger,
        search=optuna_search(sampler=_spy_sampler(optuna)),
    )
    assert [trial.index for trial in first] == [0, 1, 2]
    assert ledger_json(ledger)["search"] == "optuna"
    spy = _spy_sampler(optuna)
    train = Recorder()
    trials = sweep(
        config(), space, train=train, trials=5, ledger=ledger, search=optuna_search(sampler=spy)
    )
    assert train.names == ["exp/trial-3", "exp/trial-4"]
    assert trials[:3] == first
    told = spy.seen[0]
    assert [(number, state) for number, state, _, _ in told[:3]] == [
        (i, "COMPLETE") for i in range(3)
    ]
    assert [(params, value) for _, _, params, value in told[:3]] == [
        (trial.overrides, trial.value) for trial in first
    ]
    for trial, run in zip(trials[3:], train.runs, strict=True):
        assert trial.overrides == {
            "optim.learning_rate": run.optim.learning_rate,
            "trainer.batch_size": run.trainer.batch_size,
        }


def test_optuna_search_retrains_a_cut_off_trial_at_its_point(tmp_path, optuna):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True)}
    crashing = Recorder(fail_at=1)
    with pytest.raises(RuntimeError, match="trial crashed"):
        sweep(config(), space, train=crashing, trials=3, ledger=ledger, search=optuna_search)
    cut_off = crashing.runs[-1].optim.learning_rate
    rerun = Recorder()
    trials = sweep(config(), space, train=rerun, trials=3, ledger=ledger, search=optuna_search)
    assert rerun.names == ["exp/trial-1", "exp/trial-2"]
    assert rerun.runs[0].optim.learning_rate == cut_off
    assert [trial.index for trial in trials] == [0, 1, 2]


def test_optuna_search_scores_nan_as_a_failed_trial(tmp_path, optuna):
    storage = optuna.storages.InMemoryStorage()
    search = optuna_search(storage=storage, study_name="nan")
    trials = sweep(
        config(),
        {"optim.learning_rate": RATES},
        train=lambda run: math.nan,
        trials=2,
        ledger=tmp_path / "l.json",
        search=search,
    )
    assert all(math.isnan(trial.value) for trial in trials)
    study = optuna.load_study(study_name="nan", storage=storage)
    assert [trial.state.name for trial in study.trials] == ["FAIL", "FAIL"]


def test_optuna_search_refuses_a_ledger_of_another_study(tmp_path, optuna):
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": RATES}
    storage = optuna.storages.InMemoryStorage()
    sweep(
        config(),
        space,
        train=Recorder(),
        trials=2,
        ledger=ledger,
        search=optuna_search(storage=storage, study_name="a"),
    )
    sweep(
        config(),
        space,
        train=Recorder(),
        trials=1,
        ledger=tmp_path / "b.json",
        search=optuna_search(storage=storage, study_name="b"),
    )
    with pytest.raises(
        ValueError,
        match=r"the ledger's trial \d trained .* but Optuna study 'b' of storage InMemoryStorage",
    ):
        sweep(
            config(),
            space,
            train=Recorder(),
            trials=3,
            ledger=ledger,
            search=optuna_search(storage=storage, study_name="b"),
        )


def test_optuna_search_refuses_choices_optuna_cannot_hold(tmp_path, optuna):
    with pytest.raises(
        ValueError, match=r"takes choices of None.*'optim.kwargs.b1' has \[0.9, 0.99\]"
    ):
        sweep(
            config(),
            {"optim.kwargs.b1": [[0.9, 0.99]]},
            train=Recorder(),
            trials=1,
            ledger=tmp_path / "l.json",
            search=optuna_search,
        )


def test_optuna_search_without_optuna_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    train = Recorder()
    with pytest.raises(ImportError, match=r'pip install "dew-ml\[hpo\]"'):
        sweep(
            config(),
            {"optim.learning_rate": RATES},
            train=train,
            trials=1,
            ledger=tmp_path / "l.json",
            search=optuna_search,
        )
    assert train.runs == []


@pytest.mark.slow
@pytest.mark.parametrize("shared_ledger", [True, False], ids=["one-ledger", "a-ledger-each"])
def test_two_workers_split_one_optuna_study(tmp_path, optuna, shared_ledger):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    if not shared_ledger:  # without a shared ledger's lock, create the study before the workers
        optuna.create_study(storage=storage, study_name="lm-rate")
    side_log, go = tmp_path / "side.log", tmp_path / "go"
    ledgers = [tmp_path / ("ledger.json" if shared_ledger else f"ledger-{n}.json") for n in (0, 1)]
    workers = [
        _worker(
            "--ledger",
            ledger,
            "--side-log",
            side_log,
            "--trials",
            8,
            "--sleep",
            0.2,
            "--search",
            "optuna",
            "--storage",
            storage,
            "--study",
            "lm-rate",
            "--ready",
            tmp_path / f"ready-{n}",
            "--go",
            go,
        )
        for n, ledger in enumerate(ledgers)
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{n}").exists() for n in (0, 1)):
        assert all(worker.poll() is None for worker in workers), [w.communicate() for w in workers]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    go.touch()
    for worker in workers:
        _, errors = worker.communicate(timeout=120)
        assert worker.returncode == 0, errors

    starts = [line.split() for line in _lines(side_log) if line.startswith("start")]
    indices = sorted(int(index) for _, index, _ in starts)
    assert indices == list(range(8))  # each trial number trained exactly once
    assert len({pid for _, _, pid in starts}) == 2  # both workers took trials
    finished = []
    for ledger in set(ledgers):
        finished += ledger_json(ledger)["trials"]
    assert sorted(entry["index"] for entry in finished) == list(range(8))
    study = optuna.load_study(study_name="lm-rate", storage=storage)
    complete = {trial.number: trial for trial in study.trials if trial.state.name == "COMPLETE"}
    assert sorted(complete) == list(range(8))
    for entry in finished:
        assert complete[entry["index"]].value == entry["value"]
        assert complete[entry["index"]].params == entry["overrides"]
    # A number drawn past the budget waits for a larger one (decision 0053), never trained.
    assert all(trial.state.name == "WAITING" for trial in study.trials if trial.number >= 8)


def test_optuna_search_resumes_a_persistent_study(tmp_path, optuna, monkeypatch):
    import dew.config.sweep as sweep_module

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    search = optuna_search(storage=storage, study_name="resume")
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True)}
    # Trial 0 reaches the ledger but its process stops before telling the study;
    # trial 1 is cut off mid-training.
    told = sweep_module._OptunaRun.tell

    def stop_before_telling(self, trial):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module._OptunaRun, "tell", stop_before_telling)
    with pytest.raises(KeyboardInterrupt):
        sweep(config(), space, train=Recorder(), trials=3, ledger=ledger, search=search)
    monkeypatch.setattr(sweep_module._OptunaRun, "tell", told)
    crashing = Recorder(fail_at=1)
    with pytest.raises(RuntimeError, match="trial crashed"):
        sweep(config(), space, train=crashing, trials=3, ledger=ledger, search=search)
    study = optuna.load_study(study_name="resume", storage=storage)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "RUNNING"]

    rerun = Recorder()
    trials = sweep(config(), space, train=rerun, trials=3, ledger=ledger, search=search)
    assert rerun.names == ["exp/trial-1", "exp/trial-2"]
    assert rerun.runs[0].optim.learning_rate == crashing.runs[-1].optim.learning_rate
    study = optuna.load_study(study_name="resume", storage=storage)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 3
    assert [trial.value for trial in study.trials] == [trial.value for trial in trials]


def test_a_search_of_ones_own(tmp_path):
    class Halving(IndexedSearch):
        """Trial i takes the i-th rate of a halving sequence."""

        name = "halving"

        def point(self, space, index):
            return {"optim.learning_rate": 0.1 / 2**index}

    train = Recorder()
    trials = sweep(
        config(),
        {"optim.learning_rate": Uniform(1e-4, 1e-1)},
        train=train,
        trials=3,
        ledger=tmp_path / "l.json",
        search=Halving(),
    )
    assert [trial.overrides["optim.learning_rate"] for trial in trials] == [0.1, 0.05, 0.025]
    assert ledger_json(tmp_path / "l.json")["search"] == "halving"

    class Wrong(Halving):
        name = "wrong"

        def point(self, space, index):
            return {"optim.lr": 0.1}

    with pytest.raises(ValueError, match=r"the search proposed \{'optim.lr': 0.1\} for trial 0"):
        sweep(
            config(),
            {"optim.learning_rate": RATES},
            train=Recorder(),
            trials=1,
            ledger=tmp_path / "w.json",
            search=Wrong(),
        )


@pytest.mark.parametrize(
    ("moment", "index"),
    [("ask", 5), ("ask", 2), ("create", 3), ("reserve", 4)],
    ids=["asked-last", "asked-midway", "created-before-its-params", "claimed-while-sampling"],
)
@pytest.mark.slow  # about 6 s; CI runs it with the slow tests
def test_an_optuna_worker_killed_before_its_ledger_write_loses_no_index(
    tmp_path, optuna, moment, index
):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    ledger, side_log = tmp_path / "ledger.json", tmp_path / "side.log"
    arguments = ["--ledger", ledger, "--side-log", side_log, "--trials", 6, "--sleep", 0.0]
    arguments += ["--search", "optuna", "--storage", storage, "--study", "killed"]
    worker = _worker(*arguments, "--kill-after", moment, "--kill-index", index)
    _, errors = worker.communicate(timeout=120)
    assert worker.returncode == -signal.SIGKILL, errors
    assert _ledger_state(ledger) == set(range(index))  # trial `index` never reached it
    assert ledger_json(ledger)["running"] == []
    study = optuna.load_study(study_name="killed", storage=storage)
    assert study.trials[index].state.name == "RUNNING"

    worker = _worker(*arguments)
    output, errors = worker.communicate(timeout=120)
    assert worker.returncode == 0, errors
    assert output.split() == [str(number) for number in range(6)]
    starts = [int(line.split()[1]) for line in _lines(side_log) if line.startswith("start")]
    assert sorted(starts) == list(range(6))  # every index trained exactly once overall
    study = optuna.load_study(study_name="killed", storage=storage)
    finished = {entry["index"]: entry for entry in ledger_json(ledger)["trials"]}
    assert [trial.state.name for trial in study.trials[:6]] == ["COMPLETE"] * 6
    for trial in study.trials[:6]:
        assert trial.params == finished[trial.number]["overrides"]
        assert trial.value == finished[trial.number]["value"]


def _ledger_lock_is_free(ledger):
    """Whether this process can take the ledger's lock (byte 0 of `<ledger>.lock`) now."""
    import fcntl

    descriptor = os.open(f"{ledger}.lock", os.O_RDWR)
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        return False
    finally:
        os.close(descriptor)  # drops the lock if it was taken
    return True


def _wait_for(path, workers, seconds=60):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert all(worker.poll() is None for worker in workers), [w.communicate() for w in workers]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.slow  # two worker processes: about 8 s
def test_an_optuna_worker_samples_outside_the_shared_ledger_s_lock(tmp_path, optuna):
    """Worker A holds its sampler while drawing trial 0 (created and claimed, not recorded):
    worker B, opening the same ledger and storage meanwhile, takes and trains trials 1 and
    2 (so A's sampling holds no lock B needs), does not adopt A's trial 0 as an orphan, and
    ends without calling it missing; A then trains 0 (decision 0056)."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    ledger, side_log = tmp_path / "ledger.json", tmp_path / "side.log"
    held, go_on = tmp_path / "held", tmp_path / "go-on"
    arguments = ["--ledger", ledger, "--side-log", side_log, "--trials", 3, "--sleep", 0.0]
    arguments += ["--search", "optuna", "--storage", storage, "--study", "held"]
    first = _worker(*arguments, "--hold-draw", 0, "--held", held, "--go-on", go_on)
    try:
        _wait_for(held, [first])
        assert _ledger_lock_is_free(ledger)  # A's sampler draws outside the lock
        second = _worker(*arguments)
        output, errors = second.communicate(timeout=120)
        assert second.returncode == 0, errors
        assert output.split() == ["1", "2"]  # A's trial 0 is not finished yet
        study = optuna.load_study(study_name="held", storage=storage)
        assert study.trials[0].state.name == "RUNNING" and study.trials[0].params == {}
    finally:
        go_on.touch()
    output, errors = first.communicate(timeout=120)
    assert first.returncode == 0, errors
    assert output.split() == ["0", "1", "2"]
    starts = [line.split() for line in _lines(side_log) if line.startswith("start")]
    assert sorted(int(index) for _, index, _ in starts) == [0, 1, 2]  # each trained once
    assert [pid for _, index, pid in starts if index == "0"] == [str(first.pid)]
    study = optuna.load_study(study_name="held", storage=storage)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 3


@pytest.mark.slow  # three worker processes: about 10 s
@pytest.mark.parametrize("sampler", ["grid", "brute"])
def test_workers_sharing_a_ledger_train_each_grid_point_once(tmp_path, optuna, sampler):
    """Optuna's GridSampler and BruteForceSampler still sample under the ledger's lock
    (they avoid the points of the running trials, optuna#2039): while worker A's sampler
    draws trial 0 it holds the lock, and A, B and C train the 12 points of the grid once
    each."""
    from _sweep_worker import GRID

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    ledger, side_log = tmp_path / "ledger.json", tmp_path / "side.log"
    held, go_on = tmp_path / "held", tmp_path / "go-on"
    arguments = ["--ledger", ledger, "--side-log", side_log, "--trials", 12, "--sleep", 0.05]
    arguments += ["--search", "optuna", "--storage", storage, "--study", "grid"]
    arguments += ["--sampler", sampler]
    workers = [_worker(*arguments, "--hold-draw", 0, "--held", held, "--go-on", go_on)]
    try:
        _wait_for(held, workers)
        assert not _ledger_lock_is_free(ledger)  # A's sampler draws under the lock
        workers += [_worker(*arguments) for _ in (1, 2)]
    finally:
        go_on.touch()
    for worker in workers:
        _, errors = worker.communicate(timeout=120)
        assert worker.returncode == 0, errors
    starts = [line.split() for line in _lines(side_log) if line.startswith("start")]
    assert sorted(int(index) for _, index, _ in starts) == list(range(12))
    points = [tuple(sorted(entry["overrides"].items())) for entry in ledger_json(ledger)["trials"]]
    grid = {
        tuple(sorted(zip(GRID, values, strict=True)))
        for values in itertools.product(*GRID.values())
    }
    assert sorted(points) == sorted(grid)  # every grid point trained, none twice


@pytest.mark.filterwarnings("ignore:BruteForceSampler is experimental")
def test_only_samplers_that_avoid_running_trials_sample_under_the_ledger_s_lock(tmp_path, optuna):
    from dew.config.sweep._space import _checked_space as checked_space

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    space = checked_space(config(), {"optim.learning_rate": [0.1, 0.01]})
    samplers = {
        "grid": optuna.samplers.GridSampler({"optim.learning_rate": [0.1, 0.01]}),
        "brute": optuna.samplers.BruteForceSampler(),
        "tpe": optuna.samplers.TPESampler(),
        "random": optuna.samplers.RandomSampler(),
    }
    reserves = {}
    for name, sampler in samplers.items():
        search = optuna_search(storage=storage, study_name=name, sampler=sampler)
        reserves[name] = search.start(space, trials=2, finished=[], running=[]).reserves
    assert reserves == {"grid": False, "brute": False, "tpe": True, "random": True}
    memory = optuna_search(sampler=optuna.samplers.TPESampler())  # one process's own study
    assert not memory.start(space, trials=2, finished=[], running=[]).reserves


def test_a_run_that_asks_under_the_lock_reserves_and_draws_what_it_asks():
    """`SearchRun.reserve` and `draw` by default: the whole `ask` under the lock, the index
    claimed, the point handed back by `draw`; a claim a live process holds is refused."""
    from dew.config.sweep._space import _checked_space as checked_space

    space = checked_space(config(), {"optim.learning_rate": [0.1, 0.01, 0.001]})
    asked = grid_search.start(space, trials=3, finished=[], running=[])
    reserving = grid_search.start(space, trials=3, finished=[], running=[])
    claimed = []
    for taken in (set(), {0}, {0, 1}):
        index = reserving.reserve(taken, lambda i: claimed.append(i) or True, lambda i: None)
        assert (index, reserving.draw(index)) == asked.ask(taken)
    assert claimed == [0, 1, 2]
    assert reserving.reserve({0, 1, 2}, lambda i: True, lambda i: None) is None
    fresh = grid_search.start(space, trials=3, finished=[], running=[])
    with pytest.raises(SweepStateError, match="proposed trial 0, which is already taken"):
        fresh.reserve(set(), lambda i: False, lambda i: None)


def test_another_ledgers_running_optuna_trial_is_not_taken(tmp_path, optuna):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    search = optuna_search(storage=storage, study_name="shared")
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True)}
    study = optuna.create_study(storage=storage, study_name="shared")
    other = study.ask()  # another worker's trial 0, still training
    other.set_user_attr("dew.ledger", "elsewhere:/their/ledger.json")
    train = Recorder()
    trials = sweep(
        config(), space, train=train, trials=3, ledger=tmp_path / "l.json", search=search
    )
    assert train.names == ["exp/trial-1", "exp/trial-2"]
    assert [trial.index for trial in trials] == [1, 2]
    assert optuna.load_study(study_name="shared", storage=storage).trials[0].state.name == "RUNNING"


def test_a_sweep_never_ends_quietly_with_an_index_missing(tmp_path, optuna, monkeypatch):
    import dew.config.sweep as sweep_module

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    search = optuna_search(storage=storage, study_name="gap")
    space = {"optim.learning_rate": Uniform(1e-4, 1e-1, log=True)}
    ledger = tmp_path / "l.json"
    reserved = sweep_module._OptunaRun.reserve

    def lose_trial_1(self, taken, claim, release):  # trial 1 is created, its process "dies"
        index = reserved(self, taken, claim, release)
        if index == 1:
            release(1)
            index = reserved(self, taken, claim, release)
        return index

    monkeypatch.setattr(sweep_module._OptunaRun, "reserve", lose_trial_1)
    with pytest.raises(RuntimeError, match=r"ended with trials \[1\] unfinished"):
        sweep(config(), space, train=Recorder(), trials=3, ledger=ledger, search=search)
    monkeypatch.setattr(sweep_module._OptunaRun, "reserve", reserved)
    train = Recorder()
    trials = sweep(config(), space, train=train, trials=3, ledger=ledger, search=search)
    assert train.names == ["exp/trial-1"]
    assert [trial.index for trial in trials] == [0, 1, 2]


def test_an_indexed_search_that_skips_an_index_fails_naming_it(tmp_path):
    class Skipping(IndexedSearch):
        name = "skipping"

        def start(self, space, *, trials, finished, running):
            run = super().start(space, trials=trials, finished=finished, running=running)
            original = run.ask
            run.ask = lambda taken: original(frozenset(taken) | {1})
            return run

        def point(self, space, index):
            return {"optim.learning_rate": 0.1 / 2**index}

    with pytest.raises(RuntimeError, match=r"ended with trials \[1\] unfinished"):
        sweep(
            config(),
            {"optim.learning_rate": Uniform(1e-4, 1e-1)},
            train=Recorder(),
            trials=3,
            ledger=tmp_path / "l.json",
            search=Skipping(),
        )
