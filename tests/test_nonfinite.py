"""A training loss that turns non-finite stops the run (`on_nonfinite`), in both runners."""

import contextlib
import itertools
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _builders import tiny_lm_objective

from dew import Trainer
from dew._finite_params import check_params
from dew._nonfinite import check_loss, nonfinite_advice
from dew.checkpoints import Checkpointer
from dew.data import Dataset
from dew.steps import TrainState
from dew.supervised import Batch, create_optimizer, initialize_training_state, run_supervised
from dew.tracking import InMemoryTracker

TRAIN = np.tile(np.array([0, 1, 2, 3, 0, 1, 2, 3, 0], np.int32), (8, 1))
# One optimizer object each, so the Trainers of a kind share one compiled step.
NAN = optax.adam(float("nan"))  # the params are NaN after the first update
# Finite updates for steps 1-5, NaN from step 6's update: the loss of step 7 on is NaN.
LATE = optax.adam(lambda count: jnp.where(count >= 5, jnp.nan, 1e-2))


def _data():
    return Dataset(train=lambda partition: itertools.repeat({"text": TRAIN}))


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective()


def _fit(objective, optimizer, *, directory=None, tracker=None, **options):
    trainer = Trainer(objective, optimizer, key=jax.random.key(0), checkpoint_dir=directory)
    return trainer.fit(_data(), tracker=tracker, progress=False, **options)


def _ended(tracker):
    [(step, ended)] = tracker.artifacts["fit_ended"]
    assert step == ended.step
    return ended


def _finite(tree):
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


def test_a_nan_loss_stops_the_fit_at_the_next_log_step(objective):
    tracker = InMemoryTracker()
    with pytest.raises(ValueError, match="training loss is nan at step 2;") as caught:
        _fit(objective, NAN, steps=10, log_every=2, tracker=tracker)
    assert "on_nonfinite='continue'" in str(caught.value)
    ended = _ended(tracker)
    assert (ended.status, ended.step) == ("failed", 2)
    assert ended.error == f"NonFiniteTrainingError: {caught.value}"
    # The non-finite loss is data: it is reported before the fit stops.
    [(step, loss)] = tracker.scalars["lm/train/loss"]
    assert step == 2 and math.isnan(loss)


def test_the_advice_names_the_callers_switch():
    python = "; pass on_nonfinite='continue' to train on."
    command = "; pass --on-nonfinite continue to train on."
    params = {"w": jnp.full((2,), jnp.inf)}
    for advice, ending in ((None, python), ("--on-nonfinite continue", command)):
        with nonfinite_advice(advice) if advice else contextlib.nullcontext():
            for check in (lambda: check_loss(math.nan, 3), lambda: check_params(params, 3)):
                with pytest.raises(ValueError, match=f"at step 3.*{re.escape(ending)}$"):
                    check()


def test_the_error_names_the_last_step_seen_finite(objective):
    with pytest.raises(ValueError, match=r"nan at step 9 \(finite at step 6, the last step"):
        _fit(objective, LATE, steps=12, log_every=3)


def test_fused_calls_are_looked_at_through_their_last_step(objective):
    tracker = InMemoryTracker()
    with pytest.raises(ValueError, match="training loss is nan at step 4;"):
        _fit(objective, NAN, steps=8, log_every=4, steps_per_call=2, tracker=tracker)
    assert _ended(tracker).step == 4


def test_no_checkpoint_of_a_non_finite_state_and_the_last_good_one_resumes(objective, tmp_path):
    tracker = InMemoryTracker()
    with pytest.raises(ValueError, match="training loss is nan at step 8"):
        # log steps 3 and 6 see finite losses; the checkpoint step 8 fetches its loss.
        _fit(
            objective,
            LATE,
            directory=tmp_path,
            steps=12,
            log_every=3,
            checkpoint_every=4,
            tracker=tracker,
        )
    assert Checkpointer(tmp_path).all_steps() == [4]
    assert [record.step for _, record in tracker.artifacts["checkpoint_requested"]] == [4]
    assert (_ended(tracker).status, _ended(tracker).step) == ("failed", 8)
    template = TrainState.create(objective, LATE, key=jax.random.key(0))
    saved, _ = Checkpointer(tmp_path).restore(template)
    assert int(saved.step) == 4 and _finite(saved.params)
    resumed = _fit(objective, LATE, directory=tmp_path, steps=5, log_every=5)
    assert int(resumed.step) == 5 and _finite(resumed.params)
    assert Checkpointer(tmp_path).all_steps() == [4, 5]


@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_state_is_checked_before_the_final_save_or_return(objective, tmp_path, checkpointing):
    # Step 6's loss is finite (it is taken before the update) but its update is NaN.
    tracker = InMemoryTracker()
    directory = tmp_path if checkpointing else None
    with pytest.raises(ValueError, match="training params are not finite at step 6 "):
        _fit(objective, LATE, directory=directory, steps=6, log_every=3, tracker=tracker)
    assert (_ended(tracker).status, _ended(tracker).step) == ("failed", 6)
    assert "checkpoint_requested" not in tracker.artifacts
    if checkpointing:
        assert Checkpointer(tmp_path).all_steps() == []


def test_continue_trains_on(objective, tmp_path):
    tracker = InMemoryTracker()
    state = _fit(
        objective,
        NAN,
        directory=tmp_path,
        steps=4,
        log_every=2,
        checkpoint_every=2,
        tracker=tracker,
        on_nonfinite="continue",
    )
    assert int(state.step) == 4 and not _finite(state.params)
    assert _ended(tracker).status == "completed"
    assert Checkpointer(tmp_path).all_steps() == [2, 4]


@pytest.mark.parametrize("value", ["ignore", "RAISE", ""])
def test_a_bad_on_nonfinite_is_refused_before_any_work(objective, tmp_path, value):
    tracker = InMemoryTracker()
    with pytest.raises(ValueError, match="on_nonfinite must be 'raise' or 'continue'") as caught:
        _fit(
            objective,
            NAN,
            directory=tmp_path / "run",
            steps=2,
            log_every=1,
            tracker=tracker,
            on_nonfinite=value,
        )
    assert str(caught.value).endswith(f"got {value!r}.")
    assert not tracker.artifacts and not (tmp_path / "run").exists()


# -- run_supervised ---------------------------------------------------------------------

INPUTS = jnp.linspace(-1.0, 1.0, 16).reshape(-1, 1)
TARGETS = 3.0 * INPUTS + 2.0


def _squared_error(model, inputs, targets, sample_weight, key, training):
    return jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets))


def _supervised(transformation, *, batches=2, **options):
    model = eqx.nn.Linear(1, 1, key=jax.random.key(0))
    optimizer = create_optimizer(model, transformation)
    state = initialize_training_state(model, optimizer, jax.random.key(0))
    rows = len(INPUTS) // batches

    def loader(*, split, epoch):
        return [Batch(INPUTS[i : i + rows], TARGETS[i : i + rows]) for i in range(0, 16, rows)]

    return run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=_squared_error,
        state=state,
        **options,
    )


def test_run_supervised_stops_at_the_end_of_the_first_non_finite_epoch():
    tracker = InMemoryTracker()
    with pytest.raises(ValueError, match=r"training loss is nan at step 2 \(the end of epoch 0\);"):
        _supervised(optax.sgd(float("nan")), epochs=3, tracker=tracker)
    assert _ended(tracker).status == "failed"


def test_run_supervised_checks_the_params_it_returns():
    with pytest.raises(ValueError, match="training params are not finite at step 1;"):
        _supervised(optax.sgd(float("nan")), batches=1, epochs=1)


def test_run_supervised_continues_on_request():
    state = _supervised(optax.sgd(float("nan")), epochs=2, on_nonfinite="continue")
    assert int(state.step) == 4 and not _finite(state.params)


def test_run_supervised_refuses_a_bad_on_nonfinite():
    with pytest.raises(ValueError, match="on_nonfinite must be 'raise' or 'continue', got 'no'"):
        _supervised(optax.sgd(0.1), epochs=1, on_nonfinite="no")
