"""`Trainer.fit(callbacks=...)`, `dew.training.Callback` and their configuration
(`trainer.callbacks`, `[trainer.early_stopping]`) through `dew train` (decision 0066)."""

import contextlib
import dataclasses
import inspect
import io
import itertools
import re
import sys
import uuid

import jax
import numpy as np
import optax
import pytest
from _builders import tiny_lm_objective

from dew import Trainer, metrics
from dew.cli import main
from dew.config import RunConfig, TrainerConfig, builtin, override
from dew.data import Dataset
from dew.naming import Split
from dew.supervised import EarlyStopper
from dew.tracking import InMemoryTracker
from dew.training import Callback, Loop

TRAIN = np.tile(np.array([0, 1, 2, 3, 0, 1, 2, 3, 0], np.int32), (8, 1))
VAL = np.tile(np.array([1, 2, 3, 0, 1, 2, 3, 0, 1], np.int32), (8, 1))


def _data():
    return Dataset(
        train=lambda partition: itertools.repeat({"text": TRAIN}),
        val=lambda partition: iter([{"text": VAL}]),
        records=8,
        batch=8,
    )


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective()


class Journal(Callback):
    """Writes every hook it gets into a shared list, with what the loop says then."""

    def __init__(self, name, calls, every=1):
        self.name, self.calls, self.every = name, calls, every

    def on_fit_start(self, loop):
        self.calls.append((self.name, "start", loop.start, loop.steps))

    def on_step(self, step, loop):
        # what the loop's own policies did at this step is already in the history
        logged = [point for point, _ in loop.history.get("lm/train/loss", ())]
        self.calls.append((self.name, "step", step, logged[-1] if logged else None))

    def on_evaluation(self, step, split, values, loop):
        self.calls.append((self.name, "evaluation", step, split.value, sorted(values)))

    def on_fit_end(self, loop):
        self.calls.append((self.name, "end", int(loop.state().step)))


def test_a_callback_runs_every_n_steps_after_the_fits_own_policies(objective):
    calls = []
    first, second = Journal("a", calls, every=3), Journal("b", calls, every=2)
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    state = trainer.fit(
        _data(),
        steps=6,
        log_every=3,
        eval_every=6,
        metrics=(metrics.perplexity(),),
        callbacks=[first, second],
        progress=False,
    )
    assert int(state.step) == 6
    assert [call for call in calls if call[1] == "start"] == [
        ("a", "start", 0, 6),
        ("b", "start", 0, 6),
    ]
    steps = [
        (name, step, logged)
        for name, kind, step, *rest in calls
        if kind == "step"
        for logged in rest
    ]
    # a every 3 steps, b every 2, in the order given at a shared step; each after the step's
    # training report (its loss is already in the history at a log step)
    assert steps == [("b", 2, None), ("a", 3, 3), ("b", 4, 3), ("a", 6, 6), ("b", 6, 6)]
    evaluations = [(call[0], call[2], call[3]) for call in calls if call[1] == "evaluation"]
    assert evaluations == [
        ("a", 3, "train"), ("b", 3, "train"),
        ("a", 6, "train"), ("b", 6, "train"),
        ("a", 6, "validation"), ("b", 6, "validation"),
    ]  # fmt: skip
    assert ("a", "evaluation", 6, "validation", ["perplexity"]) in calls
    assert calls[-2:] == [("a", "end", 6), ("b", "end", 6)]


class StopAt(Callback):
    every = 2

    def __init__(self, at):
        self.at = at

    def on_step(self, step, loop):
        loop.report("step_end", Split.TRAIN, step, {"custom": float(step)})
        if step == self.at:
            loop.stop = True


def test_a_callback_reports_its_own_metric_and_stops_the_fit(objective, tmp_path):
    tracker = InMemoryTracker()
    trainer = Trainer(
        objective, optax.adam(0.01), key=jax.random.key(0), checkpoint_dir=tmp_path / "ckpt"
    )
    state = trainer.fit(
        _data(), steps=10, log_every=5, tracker=tracker, callbacks=[StopAt(4)], progress=False
    )
    assert int(state.step) == 4  # stopped after step 4, as an early stop stops
    assert [step for step, _ in state.metric_history["lm/train/custom"]] == [2, 4]
    assert [step for step, _ in tracker.scalars["lm/train/custom"]] == [2, 4]
    assert [record.step for _, record in tracker.artifacts["checkpoint_requested"]] == [4]
    assert tracker.artifacts["fit_ended"][0][1].status == "completed"


def test_fit_refuses_bad_callbacks_and_unknown_keywords_in_one_line(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    fit = inspect.unwrap(Trainer.fit)  # past the session's type checker, as a user calls it
    with pytest.raises(TypeError, match=r"callbacks\[0\] is <class .*StopAt'>, which is not a"):
        fit(trainer, _data(), steps=2, log_every=1, callbacks=[StopAt], progress=False)
    with pytest.raises(ValueError, match=r"callbacks\[0\]\.every=2 is not a multiple of steps_"):
        trainer.fit(_data(), 4, log_every=4, callbacks=[StopAt(9)], steps_per_call=4)
    with pytest.raises(ValueError, match=r"callbacks\[0\]\.every is 0; it must be None or an"):
        trainer.fit(_data(), steps=2, log_every=1, callbacks=[Journal("a", [], every=0)])
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'eval_evry'; besides"):
        fit(trainer, _data(), steps=2, log_every=1, eval_evry=1)


def test_the_loop_a_callback_gets_is_a_loop(objective):
    seen = []

    class Look(Callback):
        every = None  # on_step never

        def on_fit_start(self, loop):
            seen.append(isinstance(loop, Loop))

        def on_step(self, step, loop):
            seen.append(step)

    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    trainer.fit(_data(), steps=2, log_every=1, callbacks=[Look()], progress=False)
    assert seen == [True]


# -- through a run configuration and `dew train` ----------------------------------------------


def _run(arguments):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(arguments)
    return status, out.getvalue(), err.getvalue()


CALLBACKS = """
from dew.training import Callback

SEEN = []


class EveryTwo(Callback):
    every = 2

    def on_step(self, step, loop):
        SEEN.append((step, loop.stage))


class NeedsAnArgument(Callback):
    def __init__(self, how_often):
        self.every = how_often
"""


@pytest.fixture
def callbacks_module(tmp_path, monkeypatch):
    stem = f"callbacks_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{stem}.py").write_text(CALLBACKS)
    monkeypatch.chdir(tmp_path)  # imported from the working directory, as trainer.imports are
    yield stem
    sys.modules.pop(stem, None)


def _config(root, **trainer):
    config = override(
        builtin("tiny_lm"),
        {
            "model.kwargs.emb_features": 16,
            "model.kwargs.num_layers": 1,
            "model.kwargs.mlp_features": 32,
            "data.kwargs.num_tokens": 2048,
            "trainer.checkpoint_dir": str(root),
            "trainer.name": "called",
            "trainer.steps": 8,
            "trainer.log_every": 1,
            "trainer.eval_every": None,
            "trainer.checkpoint_every": None,
        },
    )
    return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, **trainer))


def test_dew_train_runs_the_configured_callbacks_and_early_stopping(tmp_path, callbacks_module):
    config = _config(
        tmp_path / "runs",
        callbacks=[f"{callbacks_module}:EveryTwo"],
        # the training loss must fall by 100 to count: the second log step stops the run
        early_stopping={"metric": "loss", "split": "train", "patience": 0, "min_delta": 100.0},
    )
    path = tmp_path / "run.toml"
    config.dump_toml(path)
    assert "[trainer.early_stopping]" in path.read_text()
    assert RunConfig.load(path) == config
    status, _, err = _run(["train", "--config", str(path), "--quiet"])
    assert status == 0, err
    assert sys.modules[callbacks_module].SEEN == [(2, "lm")]  # stopped at step 2
    recorded = RunConfig.load(tmp_path / "runs" / "called")  # run.json keeps both
    assert recorded.trainer.callbacks == (f"{callbacks_module}:EveryTwo",)
    assert recorded.trainer.early_stopping["min_delta"] == 100.0


def test_configured_callbacks_that_cannot_be_made_are_one_line_each(tmp_path, callbacks_module):
    for target, message in (
        (f"{callbacks_module}:Missing", f"names '{callbacks_module}:Missing', but the module"),
        (f"{callbacks_module}:NeedsAnArgument", "which dew makes with no arguments"),
        ("no_module_here_at_all:Thing", "'no_module_here_at_all' (trainer.callbacks[0]) failed"),
    ):
        with pytest.raises((TypeError, ValueError, ImportError), match=re.escape(message)):
            _config(tmp_path / "runs", callbacks=[target]).train(progress=False)
        assert not (tmp_path / "runs" / "called").exists()  # checked before anything is written


def test_early_stopping_from_the_config_and_from_train_at_once_is_refused(tmp_path):
    config = _config(tmp_path / "runs", early_stopping={"metric": "loss"})
    with pytest.raises(ValueError, match="was given early_stopper= and the configuration declares"):
        config.train(early_stopper=EarlyStopper(metric="loss"), progress=False)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"metric": "loss", "split": "val"}, "split must be 'validation' or 'train', got 'val'."),
        (
            {"metric": "loss", "mode": "up"},
            "early_stopping.mode must be 'minimize' or 'maximize' or 'min' or 'max', got 'up'.",
        ),
        ({"patience": 2}, "early_stopping needs a metric"),
        ({"metric": "loss", "patient": 2}, "has unknown key 'patient'; allowed keys are 'metric'"),
        ({"metric": "loss", "patience": -1}, "patience must be an integer >= 0, got -1."),
    ],
)
def test_a_bad_early_stopping_table_is_one_line_naming_the_value(table, message):
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        TrainerConfig(early_stopping=table)


@pytest.mark.parametrize("callbacks", [["callbacks.EveryTwo"], ["a:b:c"], [":Name"], "mod:Name"])
def test_a_bad_callbacks_list_is_one_line_naming_the_value(callbacks):
    with pytest.raises((TypeError, ValueError), match=r"TrainerConfig\.callbacks"):
        TrainerConfig(callbacks=callbacks)
