"""A run's lifecycle in the library: extending a fit, the final evaluation, Ctrl-C."""

import itertools
import os
import signal

import jax
import numpy as np
import optax
import pytest
from _builders import tiny_lm_objective

from dew import Trainer, metrics
from dew._interrupts import InterruptLatch
from dew.checkpoints import Checkpointer
from dew.config import OptimConfig
from dew.config._builtin import tiny_lm
from dew.config._overrides import override
from dew.data import Dataset
from dew.supervised import EarlyStopper
from dew.tracking import InMemoryTracker, read_journal
from dew.training import FitInterrupted

ROWS = np.random.default_rng(0).integers(0, 4, (64, 9)).astype(np.int32)
VAL = np.tile(np.array([1, 2, 3, 0, 1, 2, 3, 0, 1], np.int32), (8, 1))


def _data(drawn=None, interrupt_at=None):
    """Eight-row windows in a fixed order; `drawn` counts the batches drawn, and the draw
    of batch `interrupt_at` (1-based) raises KeyboardInterrupt, as Ctrl-C would there."""

    def train(partition):
        for index in itertools.count():
            if drawn is not None:
                drawn.append(index)
            if interrupt_at is not None and index + 1 == interrupt_at:
                raise KeyboardInterrupt
            yield {"text": ROWS[index * 8 % 64 : index * 8 % 64 + 8]}

    return Dataset(train=train, val=lambda partition: iter([{"text": VAL}]), records=8, batch=8)


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective()


def _trainer(objective, directory=None, optimizer=None):
    return Trainer(
        objective,
        optax.adam(0.01) if optimizer is None else optimizer,
        key=jax.random.key(0),
        checkpoint_dir=directory,
    )


def _equal(a, b):
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _steps(tracker, name):
    return [step for step, _ in tracker.artifacts[name]]


# -- extending a fit -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whole(objective):
    """The uninterrupted 8-step fit the others are compared with."""
    return _trainer(objective).fit(_data(), steps=8, log_every=2, progress=False)


@pytest.mark.slow
def test_a_larger_steps_continues_a_finished_fit_without_retraining(objective, whole, tmp_path):
    directory = tmp_path / "run"
    _trainer(objective, directory).fit(_data(), steps=4, log_every=2, progress=False)
    tracker, drawn = InMemoryTracker(), []
    extended = _trainer(objective, directory).fit(
        _data(drawn), steps=8, log_every=2, tracker=tracker, progress=False
    )
    [(_, started)] = tracker.artifacts["fit_started"]
    assert (started.start_step, started.steps) == (4, 8)  # resumed from step 4
    assert int(extended.step) == 8
    # Steps 5..8 trained (the first four batches replayed, not trained on), the journal of
    # the two fits one series.
    assert tracker.scalars["lm/train/loss"] == [
        (step, value) for step, value in extended.metric_history["lm/train/loss"][2:]
    ]
    assert [step for step, _ in extended.metric_history["lm/train/loss"]] == [2, 4, 6, 8]
    assert len(drawn) == 8
    assert _equal(whole.params, extended.params) and _equal(whole.opt_state, extended.opt_state)
    with Checkpointer(directory) as saved:
        assert saved.all_steps() == [4, 8]


def test_a_smaller_steps_than_the_checkpoint_is_refused_naming_both(objective, tmp_path):
    directory = tmp_path / "run"
    _trainer(objective, directory).fit(_data(), steps=6, log_every=2, progress=False)
    tracker = InMemoryTracker()
    with pytest.raises(ValueError, match=r"checkpoint at step 6, past steps=4.*steps >= 6"):
        _trainer(objective, directory).fit(
            _data(), steps=4, log_every=2, tracker=tracker, progress=False
        )
    assert tracker.artifacts == {}  # refused before the fit started
    with Checkpointer(directory) as saved:
        assert saved.all_steps() == [6]


def _linear_run(root, steps):
    config = override(
        tiny_lm(),
        {
            "model.kwargs.emb_features": 16,
            "model.kwargs.num_layers": 1,
            "model.kwargs.mlp_features": 32,
            "data.kwargs.num_tokens": 2048,
            "trainer.checkpoint_dir": str(root),
            "trainer.steps": steps,
            "trainer.log_every": 2,
            "trainer.eval_every": None,
            "trainer.checkpoint_every": None,
            "optim.schedule": "linear",
        },
    )
    return config


@pytest.mark.slow
def test_an_extended_recipe_run_rebuilds_the_schedule_over_the_new_total(tmp_path):
    short = _linear_run(tmp_path, 4)
    at_four = short.train(progress=False)
    # Kept over 4 steps, a linear schedule is 0 from step 4 on: Adam would not move.
    assert float(OptimConfig(schedule="linear").learning_rate_schedule(4)(4)) == 0.0
    extended = _linear_run(tmp_path, 8).train(progress=False)
    assert int(extended.step) == 8
    assert not _equal(at_four.params, extended.params)  # the new total's rates, not zero
    # The same as the library's two fits: four steps over build(4), then on over build(8).
    config = _linear_run(tmp_path / "by_hand", 4)
    from dew._domains import run_key
    from dew.config._recipe import build_objective

    seed = jax.random.key(config.trainer.seed)
    built = build_objective(config, None, seed)
    data = config.data.build(batch_size=config.trainer.batch_size, seed=config.trainer.seed)
    for total in (4, 8):
        trainer = Trainer(
            built,
            config.optim.build(total),
            key=run_key(seed),
            checkpoint_dir=tmp_path / "by_hand" / "checkpoints",
        )
        by_hand = trainer.fit(data, total, log_every=2, progress=False)
    assert _equal(by_hand.params, extended.params)
    # The journal notes the change; run.json keeps the first total.
    journal = read_journal(tmp_path / "quickstart")
    assert [value for name, _, value in journal.artifacts if name == "step_budget"] == [
        {"from_step": 4, "steps": 8, "previous_steps": 4}
    ]
    starts = [(r.start_step, r.steps) for _, _, r in journal.records if r.type == "fit_started"]
    assert starts == [(0, 4), (4, 8)]
    assert [step for step, _ in journal.scalars["lm/train/loss"]] == [2, 4, 6, 8]
    from dew.config import RunConfig

    # Read back, the run's configuration carries its latest total, not run.json's first.
    assert RunConfig.from_run_record(tmp_path / "quickstart").trainer.steps == 8
    # Another trainer change is still refused; a smaller total names both numbers.
    other = override(_linear_run(tmp_path, 8), {"trainer.log_every": 4})
    with pytest.raises(ValueError, match="sections that differ: trainer"):
        other.train(progress=False)
    with pytest.raises(ValueError, match=r"at step 8 .*past trainer.steps=6"):
        _linear_run(tmp_path, 6).train(progress=False)
    again = read_journal(tmp_path / "quickstart")
    assert again.records == journal.records  # refused before anything was written


# -- the final evaluation --------------------------------------------------------------------


def _evaluated(trainer, steps, eval_every, **kwargs):
    tracker = InMemoryTracker()
    state = trainer.fit(
        _data(),
        steps=steps,
        log_every=kwargs.pop("log_every", 2),
        eval_every=eval_every,
        metrics=(metrics.perplexity(),),
        tracker=tracker,
        progress=False,
        **kwargs,
    )
    return [step for step, _ in state.metric_history.get("lm/validation/perplexity", [])]


@pytest.mark.slow
def test_the_fit_evaluates_at_its_last_step_when_the_cadence_misses_it(objective):
    trainer = _trainer(objective)  # compiled once for the five fits
    assert _evaluated(trainer, 5, 3) == [3, 5]
    assert _evaluated(trainer, 6, 3) == [3, 6]  # on the cadence: once
    assert _evaluated(trainer, 5, 3, final_eval=False) == [3]
    assert _evaluated(trainer, 2, 100) == [2]  # the quickstart's "--steps 60" case
    # An early stop at a training log step off the cadence ends the fit: evaluated there.
    stopper = EarlyStopper(metric="loss", source="train", patience=0, min_delta=100.0)
    assert _evaluated(trainer, 10, 5, early_stopper=stopper, log_every=2) == [4]


def test_a_resumed_finished_fit_does_not_evaluate_again(objective, tmp_path):
    kwargs = {"log_every": 2, "eval_every": 3, "metrics": (metrics.perplexity(),)}
    _trainer(objective, tmp_path / "run").fit(_data(), steps=4, progress=False, **kwargs)
    tracker = InMemoryTracker()
    state = _trainer(objective, tmp_path / "run").fit(
        _data(), steps=4, tracker=tracker, progress=False, **kwargs
    )
    assert "lm/validation/perplexity" not in tracker.scalars
    assert [step for step, _ in state.metric_history["lm/validation/perplexity"]] == [3, 4]


# -- Ctrl-C ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_saves_the_last_completed_step_and_the_fit_resumes_bitwise(
    objective, whole, tmp_path
):
    directory = tmp_path / "run"
    tracker = InMemoryTracker()
    with pytest.raises(KeyboardInterrupt) as caught:  # still a KeyboardInterrupt
        _trainer(objective, directory).fit(
            _data(interrupt_at=6), steps=8, log_every=2, tracker=tracker, progress=False
        )
    assert isinstance(caught.value, FitInterrupted)
    assert (caught.value.step, caught.value.saved) == (5, 5)
    assert str(caught.value) == "interrupted at step 5; resumes from step 5"
    # The save came before FitEnded, which names the same step.
    assert _steps(tracker, "checkpoint_requested") == [5]
    [(_, ended)] = tracker.artifacts["fit_ended"]
    assert (ended.status, ended.step) == ("interrupted", 5)
    with Checkpointer(directory) as saved:
        assert saved.all_steps() == [5]
    resumed = _trainer(objective, directory).fit(_data(), steps=8, log_every=2, progress=False)
    assert _equal(whole.params, resumed.params) and _equal(whole.opt_state, resumed.opt_state)


def test_ctrl_c_without_a_checkpoint_dir_or_before_a_step_saves_nothing(objective, tmp_path):
    with pytest.raises(FitInterrupted) as caught:
        _trainer(objective).fit(_data(interrupt_at=3), steps=8, log_every=2, progress=False)
    assert (caught.value.step, caught.value.saved) == (2, None)
    with pytest.raises(FitInterrupted) as caught:
        _trainer(objective, tmp_path / "run").fit(
            _data(interrupt_at=1), steps=8, log_every=2, progress=False
        )
    assert (caught.value.step, caught.value.saved) == (0, None)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())


def test_a_second_ctrl_c_while_the_save_completes_leaves_at_once(objective, tmp_path, monkeypatch):
    closing = Checkpointer.close

    def interrupted_close(self):
        closing(self)  # the save lands; the point is what fit raises
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "close", interrupted_close)
    with pytest.raises(FitInterrupted) as caught:
        _trainer(objective, tmp_path / "run").fit(
            _data(interrupt_at=4), steps=8, log_every=2, progress=False
        )
    assert (caught.value.step, caught.value.saved) == (3, None)


def test_the_latch_holds_a_ctrl_c_back_until_the_step_is_bound():
    reached = []

    def step(latch):
        with latch.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")  # not raised inside
        reached.append("never")

    with InterruptLatch() as latch, pytest.raises(KeyboardInterrupt):
        step(latch)
    assert reached == ["after the signal"]
