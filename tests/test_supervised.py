"""run_supervised: equality with a hand-written loop, events, validation, early stopping."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _builders import Recorder
from _checks import rejects

from dew.events import TrackerEventSink
from dew.naming import Split
from dew.supervised import (
    Batch,
    EarlyStopper,
    HeldOutValidation,
    create_optimizer,
    initialize_training_state,
    run_supervised,
)
from dew.tracking import InMemoryTracker

INPUTS = jnp.linspace(-1.0, 1.0, 16).reshape(-1, 1)
TARGETS = 3.0 * INPUTS + 2.0


def squared_error(model, inputs, targets, sample_weight, key, training):
    errors = jnp.square(jax.vmap(model)(inputs) - targets)[:, 0]
    if sample_weight is None:
        return jnp.mean(errors)
    return jnp.sum(errors * sample_weight) / jnp.sum(sample_weight)


def loader(*, split, epoch):
    return [Batch(INPUTS[:8], TARGETS[:8]), Batch(INPUTS[8:], TARGETS[8:])]


def _setup(learning_rate=0.1):
    model = eqx.nn.Linear(1, 1, key=jax.random.key(0))
    optimizer = create_optimizer(model, optax.sgd(learning_rate))
    return model, optimizer, initialize_training_state(model, optimizer, jax.random.key(0))


def test_parameters_equal_a_hand_written_optax_loop():
    model, optimizer, state = _setup()
    state = run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=squared_error,
        state=state,
        epochs=3,
    )
    params = eqx.filter(model, eqx.is_inexact_array)
    opt = optax.sgd(0.1)
    opt_state = opt.init(params)
    for _ in range(3):
        for batch in loader(split="train", epoch=0):
            grads = eqx.filter_grad(
                lambda m, b=batch: squared_error(m, b.inputs, b.targets, None, None, True)
            )(params)
            updates, opt_state = opt.update(grads, opt_state)
            params = eqx.apply_updates(params, updates)
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert int(state.step) == 6


def test_events_history_and_tracker_tags_agree():
    model, optimizer, state = _setup()
    recorder, tracker = Recorder(), InMemoryTracker()
    state = run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=squared_error,
        state=state,
        epochs=3,
        validation=HeldOutValidation(model=model, loader=loader, loss=squared_error),
        early_stopper=EarlyStopper(metric="loss", mode="min", patience=1),
        event_sinks=[recorder, TrackerEventSink(tracker)],
        stage="mean",
    )
    names = [(e.name, e.split, e.step) for e in recorder.events]
    assert names == [
        ("epoch_end", Split.TRAIN, 0),
        ("validation_end", Split.VALIDATION, 0),
        ("best_model", Split.VALIDATION, 0),
        ("epoch_end", Split.TRAIN, 1),
        ("validation_end", Split.VALIDATION, 1),
        ("best_model", Split.VALIDATION, 1),
        ("epoch_end", Split.TRAIN, 2),
        ("validation_end", Split.VALIDATION, 2),
        ("best_model", Split.VALIDATION, 2),
    ]
    assert dict(state.metric_history) == {tag: tuple(v) for tag, v in tracker.scalars.items()}
    assert set(tracker.scalars) == {"mean/train/loss", "mean/validation/loss"}
    losses = [value for _, value in tracker.scalars["mean/train/loss"]]
    assert losses[2] < losses[0]


def test_early_stop_ends_training_with_a_decision_event():
    model, optimizer, state = _setup(learning_rate=0.0)  # nothing improves after epoch 0
    recorder = Recorder()
    state = run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=squared_error,
        state=state,
        epochs=10,
        early_stopper=EarlyStopper(metric="loss", patience=1, source=Split.TRAIN),
        event_sinks=[recorder],
    )
    decisions = [(e.name, e.step, e.decision.metric) for e in recorder.events if e.decision]
    assert decisions == [("best_model", 0, "loss"), ("early_stop", 2, "loss")]
    assert int(state.step) == 6


def test_sample_weight_reaches_the_loss():
    model, optimizer, state = _setup()
    weights = jnp.zeros(8).at[0].set(1.0)

    def weighted(*, split, epoch):
        return [Batch(INPUTS[:8], TARGETS[:8], weights)]

    tracker = InMemoryTracker()
    run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=weighted,
        loss=squared_error,
        state=state,
        epochs=1,
        event_sinks=[TrackerEventSink(tracker)],
    )
    ((_, loss),) = tracker.scalars["supervised/train/loss"]
    first = squared_error(model, INPUTS[:1], TARGETS[:1], None, None, True)
    np.testing.assert_allclose(loss, float(first), rtol=1e-6)


def test_bad_arguments_raise():
    model, optimizer, state = _setup()
    with pytest.raises(ValueError, match="epochs must be an integer >= 0, got -1"):
        run_supervised(
            model=model,
            optimizer=optimizer,
            train_loader=loader,
            loss=squared_error,
            state=state,
            epochs=-1,
        )
    with pytest.raises(ValueError, match="stage 'a/b' may not contain '/'"):
        run_supervised(
            model=model,
            optimizer=optimizer,
            train_loader=loader,
            loss=squared_error,
            state=state,
            epochs=1,
            stage="a/b",
        )
    with pytest.raises(ValueError, match="no floating-point arrays to train"):
        create_optimizer({"n": 3}, optax.sgd(0.1))


def test_the_shared_engine_reports_records_and_prints(capsys):
    model, optimizer, state = _setup()
    tracker = InMemoryTracker()
    final = run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=squared_error,
        state=state,
        epochs=2,
        validation=HeldOutValidation(model, loader, squared_error),
        event_sinks=[TrackerEventSink(tracker)],
        tracker=tracker,
        progress=True,
    )
    [(_, started)] = tracker.artifacts["fit_started"]
    [(_, ended)] = tracker.artifacts["fit_ended"]
    assert (started.stage, started.start_step, started.steps) == ("supervised", 0, 2)
    assert (ended.status, ended.step) == ("completed", int(final.step))
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in printed] == ["step 0", "step 0", "step 1", "step 1"]
    assert printed[0].startswith("step 0  supervised/train/loss ")
    assert printed[1].startswith("step 0  supervised/validation/loss ")
    assert len(printed) == 4


def test_a_failing_epoch_reports_failed_and_reraises():
    model, optimizer, state = _setup()
    tracker = InMemoryTracker()

    def broken(*, split, epoch):
        yield from loader(split=split, epoch=epoch)
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        run_supervised(
            model=model,
            optimizer=optimizer,
            train_loader=broken,
            loss=squared_error,
            state=state,
            epochs=2,
            tracker=tracker,
        )
    [(_, ended)] = tracker.artifacts["fit_ended"]
    assert ended.status == "failed" and ended.error == "OSError: disk gone"


def test_a_second_run_of_the_same_structure_traces_nothing_again():
    traces = []

    def counted(model, inputs, targets, sample_weight, key, training):
        traces.append(training)  # runs only while JAX traces the loss
        return squared_error(model, inputs, targets, sample_weight, key, training)

    _, optimizer, _ = _setup()

    def run(seed):
        model = eqx.nn.Linear(1, 1, key=jax.random.key(seed))
        return run_supervised(
            model=model,
            optimizer=optimizer,
            train_loader=loader,
            loss=counted,
            state=initialize_training_state(model, optimizer, jax.random.key(seed)),
            epochs=2,
            validation=HeldOutValidation(model, loader, counted),
        )

    first = run(0)
    assert sorted(set(traces)) == [False, True]  # the training step and the validation pass
    traced = len(traces)
    second = run(1)
    assert len(traces) == traced
    assert not np.allclose(first.params.weight, second.params.weight)  # a different model


def test_validation_is_the_row_weighted_mean_of_the_batch_losses():
    model, _, state = _setup()
    batches = [Batch(INPUTS[:4], TARGETS[:4]), Batch(INPUTS[4:], TARGETS[4:])]
    validation = HeldOutValidation(model, lambda *, split, epoch: batches, squared_error)
    scores = validation.evaluate(state.params, 0, jax.random.key(0))
    losses = [float(squared_error(model, b.inputs, b.targets, None, None, False)) for b in batches]
    np.testing.assert_allclose(scores["loss"], (4 * losses[0] + 12 * losses[1]) / 16, rtol=1e-6)
    assert (
        HeldOutValidation(model, lambda *, split, epoch: [], squared_error).evaluate(
            state.params, 0, jax.random.key(0)
        )
        == {}
    )


def test_a_loader_yielding_something_else_is_refused():
    model, optimizer, state = _setup()
    message = r"must yield Batch\(inputs, targets, sample_weight\), got tuple\.$"
    with rejects(TypeError, message, parameter="batch"):
        run_supervised(
            model=model,
            optimizer=optimizer,
            train_loader=lambda *, split, epoch: [(INPUTS, TARGETS)],
            loss=squared_error,
            state=state,
            epochs=1,
        )


def test_the_callers_state_survives_the_run():
    model, optimizer, state = _setup()
    before = np.asarray(state.params.weight)
    run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=squared_error,
        state=state,
        epochs=1,
    )
    np.testing.assert_array_equal(np.asarray(state.params.weight), before)  # not donated
