"""Trainer.fit: the guide's LM example, cadence rules, events, records and failures."""

import inspect
import itertools
import json
import re
import traceback

import jax
import numpy as np
import optax
import pytest
from _builders import Recorder, tiny_lm_objective

from dew import Trainer, metrics
from dew.data import Dataset
from dew.naming import Split, flatten_parameters, parse_metric_tag
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import MissingBatchKeyError
from dew.objectives.lm import LMObjective
from dew.supervised import EarlyStopper
from dew.tracking import InMemoryTracker

TRAIN = np.tile(np.array([0, 1, 2, 3, 0, 1, 2, 3, 0], np.int32), (8, 1))
VAL = np.tile(np.array([1, 2, 3, 0, 1, 2, 3, 0, 1], np.int32), (8, 1))


def _data(val=True):
    return Dataset(
        train=lambda partition: itertools.repeat({"text": TRAIN}),
        val=(lambda partition: iter([{"text": VAL}])) if val else None,
        records=8,
        batch=8,
    )


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective()


def test_the_guides_language_model_example(objective, capsys):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    tracker = InMemoryTracker()
    state = trainer.fit(
        _data(),
        steps=10,
        log_every=5,
        eval_every=5,
        metrics=(metrics.perplexity(),),
        tracker=tracker,
    )
    assert int(state.step) == 10
    assert [step for step, _ in tracker.scalars["lm/train/loss"]] == [5, 10]
    assert [step for step, _ in tracker.scalars["lm/validation/perplexity"]] == [5, 10]
    assert set(state.metric_history) == set(tracker.scalars)
    for tag, series in tracker.scalars.items():
        assert list(state.metric_history[tag]) == series
    printed = capsys.readouterr().out
    assert "step 5  lm/train/loss" in printed
    assert "step 10  lm/validation/perplexity" in printed
    assert not tracker.closed  # fit borrows the tracker
    kinds = [
        type(record).__name__
        for _, record in tracker.artifacts["fit_started"] + tracker.artifacts["fit_ended"]
    ]
    assert kinds == ["FitStarted", "FitEnded"]
    assert tracker.artifacts["fit_ended"][0][1].status == "completed"


def test_metrics_alone_do_not_turn_evaluation_on(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    # Nothing to score, or no cadence to score at: no validation data needed either.
    for kwargs, val in (({"metrics": (metrics.perplexity(),)}, True), ({"eval_every": 5}, False)):
        tracker = InMemoryTracker()
        data = _data(val=val)
        trainer.fit(data, steps=5, log_every=5, tracker=tracker, progress=False, **kwargs)
        assert set(tracker.scalars) == {"lm/train/loss", "lm/train/token_accuracy"}


def test_an_evaluation_cadence_without_validation_data_is_refused_before_training(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    tracker = InMemoryTracker()
    asked = (metrics.perplexity(), metrics.token_accuracy())
    message = (
        "eval_every=2 asks for metrics perplexity, token_accuracy every 2 steps, but the "
        "Dataset has no validation data (Dataset.val is None; a built-in dataset with "
        "val_fraction=0): give it validation data, or leave eval_every unset "
        "(trainer.eval_every in a RunConfig)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        trainer.fit(
            _data(val=False), steps=4, log_every=2, eval_every=2, metrics=asked, tracker=tracker
        )
    with pytest.raises(ValueError, match=r"^eval_every=2 asks for previews every 2 steps, but"):
        trainer.fit(
            _data(val=False), steps=4, log_every=2, eval_every=2, preview=True, tracker=tracker
        )
    assert not tracker.scalars and not tracker.artifacts  # refused before the fit started


def test_previews_need_preview_true_and_a_tracker(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    common = {
        "steps": 5,
        "log_every": 5,
        "eval_every": 5,
        "metrics": (metrics.perplexity(),),
        "progress": False,
    }
    quiet = InMemoryTracker()
    trainer.fit(_data(), tracker=quiet, **common)
    assert "samples" not in quiet.artifacts
    shown = InMemoryTracker()
    trainer.fit(_data(), tracker=shown, preview=True, **common)
    ((step, preview),) = shown.artifacts["lm/validation/samples"]
    assert step == 5
    assert preview.artifact.tokens.shape[0] == objective.samples.num_samples
    assert (preview.classes, preview.tokenizer) == (None, None)  # the data names nothing
    trainer.fit(_data(), preview=True, **common)  # no tracker: no preview work, no error


@pytest.mark.slow
def test_two_stages_previews_into_one_tracker_keep_their_own(objective, tmp_path):
    """Two fits of different stages share one tracker: each keeps its own preview files,
    journal lines and TensorBoard tags; neither overwrites the other."""
    from dew.tracking import LocalTracker, Trackers, read_journal

    tensorboard = pytest.importorskip("dew.tracking.tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    memory = InMemoryTracker()
    common = {"steps": 5, "log_every": 5, "eval_every": 5, "preview": True, "progress": False}
    with Trackers(
        LocalTracker(tmp_path / "local"), tensorboard.TensorBoardTracker(tmp_path / "tb"), memory
    ) as tracker:
        for stage, seed in (("pretrain", 1), ("finetune", 2)):
            trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(seed), stage=stage)
            trainer.fit(_data(), tracker=tracker, **common)
    shown = {
        stage: memory.artifacts[f"{stage}/validation/samples"][0][1].artifact.tokens
        for stage in ("pretrain", "finetune")
    }
    assert not np.array_equal(*shown.values())  # two keys drew two different previews
    previews = read_journal(tmp_path / "local").artifacts
    assert [(name, step) for name, step, _ in previews] == [
        ("pretrain/validation/samples", 5),
        ("finetune/validation/samples", 5),
    ]
    for (_, _, files), (stage, tokens) in zip(previews, shown.items(), strict=True):
        folder = f"previews/{stage}/validation/samples/5"
        assert files == [f"{folder}/tokens.json", f"{folder}/text.md"]
        written = json.loads((tmp_path / "local" / files[0]).read_text())["tokens"]
        assert written == np.asarray(tokens).tolist()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(tag for tag in events.Tags()["tensors"] if "samples" in tag) == [
        f"{stage}/validation/samples/{part}"
        for stage in ("finetune", "pretrain")
        for part in ("text", "tokens")
    ]


class ExperimentTracker:
    """Document 001's InMemoryTracker, as its page writes it (an ExperimentTracker)."""

    def __init__(self):
        self.params = {}
        self.scalars = {}
        self.artifacts = {}

    def log_params(self, values):
        self.params.update(flatten_parameters(values))

    def log_metrics(self, values, *, step):
        for tag, value in values.items():
            self.scalars.setdefault(tag, []).append((step, value))

    def log_artifact(self, name, value):
        self.artifacts[name] = value


class OnlyScalars:
    """Document 000's "tracker that only takes scalars"."""

    def __init__(self):
        self.scalars = {}

    def log_metrics(self, values, *, step):
        for tag, value in values.items():
            self.scalars.setdefault(tag, []).append((step, value))


def test_a_tracker_that_takes_scalars_gets_them_and_turns_no_preview_on(objective, capsys):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    for tracker in (ExperimentTracker(), OnlyScalars()):
        trainer.fit(_data(), steps=5, log_every=5, eval_every=5, tracker=tracker, preview=True)
        assert [step for step, _ in tracker.scalars["lm/train/loss"]] == [5]
        assert "previewed" not in capsys.readouterr().out  # no evaluation event at all
    assert {parse_metric_tag(tag).split for tag in tracker.scalars} == {Split.TRAIN}
    experiment = ExperimentTracker()
    trainer.fit(
        _data(),
        steps=5,
        log_every=5,
        eval_every=5,
        metrics=(metrics.perplexity(),),
        tracker=experiment,
        preview=True,
        progress=False,
    )
    assert [step for step, _ in experiment.scalars["lm/validation/perplexity"]] == [5]
    assert experiment.artifacts == {}  # no record, no preview


def test_a_tracker_without_log_metrics_is_refused_before_any_work(objective, tmp_path):
    class OldProtocol:  # document 000's wording: log(scalars, step), artifact(value, step)
        def log(self, scalars, step):
            pass

        def artifact(self, value, step):
            pass

    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0), checkpoint_dir=tmp_path)
    fit = inspect.unwrap(Trainer.fit)  # past the session's type checker, as a user calls it
    with pytest.raises(TypeError, match="has no log_metrics method; a tracker has log_metrics"):
        fit(trainer, _data(), steps=5, log_every=5, tracker=OldProtocol(), progress=False)
    assert list(tmp_path.iterdir()) == []  # nothing trained, nothing saved


def test_a_tracker_does_not_change_the_scores(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(3))
    common = {
        "steps": 5,
        "log_every": 5,
        "eval_every": 5,
        "metrics": (metrics.perplexity(),),
        "progress": False,
    }
    plain = trainer.fit(_data(), **common)
    tracked = trainer.fit(_data(), tracker=InMemoryTracker(), preview=True, **common)
    assert (
        plain.metric_history["lm/validation/perplexity"]
        == (tracked.metric_history["lm/validation/perplexity"])
    )


def test_events_reach_every_sink_with_their_split(objective):
    recorder = Recorder()
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0), stage="pretrain")
    trainer.fit(
        _data(),
        steps=4,
        log_every=2,
        eval_every=4,
        metrics=(metrics.perplexity(),),
        event_sinks=[recorder],
        progress=False,
    )
    seen = [(e.name, e.split, e.step, sorted(e.metrics)) for e in recorder.events]
    assert seen == [
        ("step_end", Split.TRAIN, 2, ["loss", "token_accuracy"]),
        ("step_end", Split.TRAIN, 4, ["loss", "token_accuracy"]),
        ("validation_end", Split.VALIDATION, 4, ["perplexity"]),
    ]
    assert {e.stage for e in recorder.events} == {"pretrain"}
    assert int(recorder.events[-1].state.step) == 4


def test_early_stopping_emits_decisions_and_stops(objective):
    recorder = Recorder()
    trainer = Trainer(objective, optax.sgd(0.0), key=jax.random.key(0))  # nothing improves
    state = trainer.fit(
        _data(),
        steps=20,
        log_every=1,
        event_sinks=[recorder],
        progress=False,
        early_stopper=EarlyStopper(metric="loss", patience=1, source=Split.TRAIN),
    )
    decisions = [(e.name, e.step) for e in recorder.events if e.decision is not None]
    assert decisions == [("best_model", 1), ("early_stop", 3)]
    assert int(state.step) == 3
    assert all(not e.metrics for e in recorder.events if e.decision is not None)


def test_a_failing_step_reports_failed_and_reraises(objective):
    bad = Dataset(train=lambda partition: iter([{"text": TRAIN}, {"text": TRAIN[:, :4]}]))
    tracker = InMemoryTracker()
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    with pytest.raises(ValueError, match="rows of at least 9 token IDs"):
        trainer.fit(bad, steps=5, log_every=1, tracker=tracker, progress=False)
    ((step, ended),) = tracker.artifacts["fit_ended"]
    assert (ended.status, ended.step, step) == ("failed", 1, 1)  # the last completed step
    assert "rows of at least 9 token IDs" in ended.error


def test_an_interrupt_reports_interrupted(objective):
    def batches(partition):
        yield {"text": TRAIN}
        raise KeyboardInterrupt

    tracker = InMemoryTracker()
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(Dataset(train=batches), steps=5, log_every=1, tracker=tracker, progress=False)
    assert tracker.artifacts["fit_ended"][0][1].status == "interrupted"


def test_a_state_passed_in_stays_usable(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    first = trainer.fit(_data(), steps=2, log_every=1, progress=False)
    second = trainer.fit(_data(), steps=4, log_every=1, state=first, progress=False)
    assert int(first.step) == 2  # not donated away
    assert int(second.step) == 4
    assert [step for step, _ in second.metric_history["lm/train/loss"]] == [1, 2, 3, 4]


def test_an_early_stopper_on_a_metric_the_split_lacks_raises(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    stopper = EarlyStopper(metric="perplexty", source=Split.TRAIN)
    with pytest.raises(ValueError, match="monitors 'perplexty' on the train split, but the train"):
        trainer.fit(_data(), steps=2, log_every=1, early_stopper=stopper, progress=False)


def test_running_out_of_batches_and_bad_cadences_raise(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    short = Dataset(train=lambda partition: iter([{"text": TRAIN}]))
    with pytest.raises(ValueError, match="ran out of batches at step 2 of 3"):
        trainer.fit(short, steps=3, log_every=1, progress=False)
    with pytest.raises(ValueError, match="log_every must be an integer >= 1, got 0"):
        trainer.fit(_data(), steps=3, log_every=0)
    with pytest.raises(ValueError, match="eval_every must be None or an integer >= 1"):
        trainer.fit(_data(), steps=3, log_every=1, eval_every=-1)


def _varied(partition):
    """Batches that differ per step (rows shifted through the cycle)."""
    for index in itertools.count():
        yield {"text": np.roll(TRAIN, index % 4, axis=1)}


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_fused_calls_match_one_call_per_step(objective):
    data = Dataset(train=_varied, val=lambda partition: iter([{"text": VAL}]))
    runs = {}
    # SGD: the two compiled programs round differently in the last bits, which Adam's
    # normalisation would amplify for near-zero gradients; SGD keeps them at rounding size.
    for steps_per_call in (1, 5):
        trainer = Trainer(objective, optax.sgd(0.1), key=jax.random.key(0))
        tracker = InMemoryTracker()
        runs[steps_per_call] = (
            trainer.fit(
                data,
                steps=12,
                log_every=5,
                eval_every=10,
                metrics=(metrics.perplexity(),),
                tracker=tracker,
                progress=False,
                steps_per_call=steps_per_call,
            ),
            tracker,
        )
    (single, single_tracker), (fused, fused_tracker) = runs[1], runs[5]
    assert int(fused.step) == 12  # two fused calls of 5, then two single steps
    for left, right in zip(
        jax.tree.leaves(single.params), jax.tree.leaves(fused.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(left), np.asarray(right), rtol=1e-5, atol=1e-6)
    assert single_tracker.scalars.keys() == fused_tracker.scalars.keys()
    for tag, series in single_tracker.scalars.items():
        steps, values = zip(*series, strict=True)
        fused_steps, fused_values = zip(*fused_tracker.scalars[tag], strict=True)
        # validation: the cadence's step 10, then the final evaluation at step 12
        assert fused_steps == steps == ((5, 10) if "train" in tag else (10, 12))
        np.testing.assert_allclose(fused_values, values, rtol=1e-5)


def test_fused_cadences_must_be_multiples_of_the_call(objective):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    with pytest.raises(ValueError, match="log_every=5 is not a multiple of steps_per_call=2"):
        trainer.fit(_data(), steps=10, log_every=5, steps_per_call=2)
    with pytest.raises(ValueError, match="eval_every=3 is not a multiple of steps_per_call=2"):
        trainer.fit(_data(), steps=10, log_every=2, eval_every=3, steps_per_call=2)
    with pytest.raises(ValueError, match="steps_per_call must be an integer >= 1, got 0"):
        trainer.fit(_data(), steps=10, log_every=2, steps_per_call=0)


def _with_bad_id(value=7, row=3, position=5):
    bad = TRAIN.copy()
    bad[row, position] = value
    return bad


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_out_of_vocabulary_ids_raise_the_host_check_not_jax_noise(objective, steps_per_call):
    # The bad batch is the third of four, between log steps: the failure may surface at
    # the call or only at the next synchronisation, and must name the bad value either way.
    batches = [{"text": TRAIN}, {"text": TRAIN}, {"text": _with_bad_id()}, {"text": TRAIN}]
    tracker = InMemoryTracker()
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    message = (
        "LMObjective: batch['text'] holds token ID 7 at row 3, position 5; "
        "valid IDs are 0 to 3 (vocab_size=4)."
    )
    with pytest.raises(ValueError, match="token ID 7") as caught:
        trainer.fit(
            Dataset(train=lambda partition: iter(batches)),
            steps=4,
            log_every=4,
            tracker=tracker,
            progress=False,
            steps_per_call=steps_per_call,
        )
    assert str(caught.value) == message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    shown = "".join(traceback.format_exception(caught.value))
    for noise in ("EquinoxRuntimeError", "JaxRuntimeError", "CpuCallback", "filter_jit"):
        assert noise not in shown, shown
    ((_, ended),) = tracker.artifacts["fit_ended"]
    assert ended.status == "failed"
    assert ended.error == f"ValueError: {message}"


_RENAMED = {"tokens": TRAIN, "weights": np.ones(TRAIN.shape, np.float32)}


@pytest.mark.parametrize(
    "batches",
    [
        pytest.param([_RENAMED], id="first"),
        pytest.param([{"text": TRAIN}, _RENAMED], id="later", marks=pytest.mark.slow),
    ],
)
def test_a_batch_without_the_objectives_keys_fails_on_the_host_before_compiling(objective, batches):
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    tracker = InMemoryTracker()
    data = Dataset(train=lambda partition: iter(batches))
    with pytest.raises(MissingBatchKeyError) as caught:
        trainer.fit(data, steps=2, log_every=1, tracker=tracker, progress=False)
    assert str(caught.value) == (
        "LMObjective reads batch key 'text', but the batch has 'tokens', 'weights'."
    )
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)
    assert not getattr(caught.value, "__notes__", ())  # not raised inside a JAX trace
    assert len(trainer._names) == len(batches) - 1  # the renamed batch was never traced
    ((_, ended),) = tracker.artifacts["fit_ended"]
    assert (ended.status, ended.step) == ("failed", len(batches) - 1)


def test_a_batch_that_disagrees_with_the_declared_batch_size_names_its_step(objective):
    short = {"text": TRAIN[:4]}
    batches = [{"text": TRAIN}, {"text": TRAIN}, short]
    data = Dataset(train=lambda partition: iter(batches), records=16, batch=8)
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    with pytest.raises(
        ValueError, match=r"batch of 4 rows at step 3, but the Dataset declares batch=8"
    ):
        trainer.fit(data, steps=3, log_every=1, progress=False)
    undeclared = Dataset(train=lambda partition: iter(batches))
    assert int(trainer.fit(undeclared, steps=3, log_every=1, progress=False).step) == 3


def test_a_dataset_batch_larger_than_its_records_is_refused():
    with pytest.raises(ValueError, match=r"Dataset\.batch=9 is more than Dataset\.records=8"):
        Dataset(train=lambda partition: iter([]), records=8, batch=9)


def test_a_ctrl_c_that_a_finalizer_swallowed_still_stops_the_fit(objective):
    import contextlib
    import os
    import signal

    def batches(partition):
        for step in itertools.count(1):
            if step == 3:
                # What Python does when SIGINT lands in a __del__ or weakref callback:
                with contextlib.suppress(KeyboardInterrupt):
                    os.kill(os.getpid(), signal.SIGINT)
            yield {"text": TRAIN}

    tracker = InMemoryTracker()
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(Dataset(train=batches), steps=50, log_every=1, tracker=tracker, progress=False)
    (ended,) = [record for _, record in tracker.artifacts["fit_ended"]]
    assert (ended.status, ended.step) == ("interrupted", 3)  # it stops after that step
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_param_sharding_places_a_one_process_fit_on_the_data_mesh(objective):
    from jax.sharding import NamedSharding, PartitionSpec

    from dew.distributed import data_mesh

    def by_rows(path, leaf):
        return NamedSharding(data_mesh(), PartitionSpec("data" if leaf.ndim else None))

    key = jax.random.key(0)
    placed = Trainer(objective, optax.sgd(0.1), key=key, param_sharding=by_rows).fit(
        _data(val=False), steps=3, log_every=3, progress=False
    )
    plain = Trainer(objective, optax.sgd(0.1), key=key).fit(
        _data(val=False), steps=3, log_every=3, progress=False
    )
    assert int(placed.step) == 3
    for got, want in zip(
        jax.tree.leaves(placed.params), jax.tree.leaves(plain.params), strict=True
    ):
        assert isinstance(got.sharding, NamedSharding) and got.sharding.mesh == data_mesh()
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


def test_param_sharding_must_give_a_sharding_for_every_param(objective):
    trainer = Trainer(
        objective, optax.sgd(0.1), key=jax.random.key(0), param_sharding=lambda path, leaf: "rows"
    )
    with pytest.raises(ValueError, match=r"param_sharding\..* returned 'rows'; it must return a"):
        trainer.fit(_data(val=False), steps=1, log_every=1, progress=False)


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_a_fit_on_host_batches_compiles_steps_the_persistent_cache_keeps(steps_per_call, caplog):
    # A traced batch check is a host callback, and JAX's persistent compilation cache
    # writes no executable holding one: every process would compile its step anew. Batches
    # held on the host are checked there instead, so the step holds none. (A model of a
    # shape no other test compiles, so this fit compiles its steps here; conftest.py
    # gives the test run its persistent cache.)
    model = CausalTransformer(5, 8, 1, 2, 16, 7, key=jax.random.key(0))
    objective = LMObjective(model, seq_len=6)
    batch = {"text": np.tile(np.arange(7, dtype=np.int32) % 5, (4, 1))}
    trainer = Trainer(objective, optax.adam(0.01), key=jax.random.key(0))
    with caplog.at_level("DEBUG", logger="jax._src.compiler"):
        trainer.fit(
            Dataset(train=lambda partition: itertools.repeat(batch)),
            steps=4,
            log_every=4,
            progress=False,
            steps_per_call=steps_per_call,
        )
    compiled = [record.getMessage() for record in caplog.records]
    name = "jit_step" if steps_per_call == 1 else "jit_fused"
    assert not [message for message in compiled if "host callbacks" in message], compiled
    assert any(f"CACHE MISS for '{name}'" in message for message in compiled), compiled
