"""Checkpoints and resume (orbax-checkpoint), and profile windows (jax.profiler)."""

import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _builders import tiny_lm_objective
from hypothesis import given, settings
from hypothesis import strategies as st

from dew import Trainer, metrics
from dew.checkpoints import Checkpointer, history_from_json, history_to_json
from dew.data import Dataset, Partition, StepBatches, tokens
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.profiling import Profile, profile
from dew.steps import MetricHistory, TrainState
from dew.supervised import EarlyStopper
from dew.telemetry.records import CheckpointRequested, ProfileWindow, encode_json_value
from dew.tracking import InMemoryTracker

HERE = pathlib.Path(__file__).parent
OPTIMIZER = optax.adam(3e-3)  # one optimizer: the Trainers share one compiled step


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective(8, seed=3)


def _batches(fail_at=None):
    """Batches that differ per step, drawn in a fixed order; optionally raise at a step."""
    rng = np.random.default_rng(7)
    step = 0
    while True:
        step += 1
        if fail_at is not None and step == fail_at:
            raise RuntimeError(f"the loader broke at step {step}")
        yield {"text": rng.integers(0, 8, (8, 9)).astype(np.int32)}


VAL = np.random.default_rng(1).integers(0, 8, (8, 9)).astype(np.int32)


def _data(fail_at=None):
    return Dataset(
        train=lambda partition: _batches(fail_at), val=lambda partition: iter([{"text": VAL}])
    )


def _fit(objective, directory, *, steps=12, fail_at=None, tracker=None, **kwargs):
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11), checkpoint_dir=directory)
    options = {"checkpoint_every": 4, **kwargs}
    return trainer.fit(
        _data(fail_at),
        steps=steps,
        log_every=3,
        eval_every=6,
        metrics=(metrics.perplexity(),),
        tracker=tracker,
        progress=False,
        **options,
    )


def _same_bits(left, right):
    pairs = zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True)
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)


@pytest.mark.slow  # about 7 s; CI runs it with the slow tests
def test_a_resumed_run_ends_bitwise_equal_to_an_uninterrupted_one(objective, tmp_path):
    whole = _fit(objective, tmp_path / "whole")
    with pytest.raises(RuntimeError, match="loader broke at step 7"):
        _fit(objective, tmp_path / "broken", fail_at=7)
    assert Checkpointer(tmp_path / "broken").all_steps() == [4]
    tracker = InMemoryTracker()
    resumed = _fit(objective, tmp_path / "broken", tracker=tracker)
    assert int(resumed.step) == 12
    assert _same_bits(resumed.params, whole.params)
    assert _same_bits(resumed.opt_state, whole.opt_state)
    # The curves continue where the checkpoint left them: the same history as one run, but
    # for step 6, whose window began with the resumed fit (steps 5-6, not 4-6).
    for tag, series in whole.metric_history.items():
        kept = [(step, value) for step, value in resumed.metric_history[tag] if step != 6]
        assert kept == [(step, value) for step, value in series if step != 6]
    assert [step for step, _ in resumed.metric_history["lm/train/loss"]] == [3, 6, 9, 12]
    started = tracker.artifacts["fit_started"][0][1]
    assert (started.start_step, started.steps) == (4, 12)
    requested = [record for _, record in tracker.artifacts["checkpoint_requested"]]
    assert all(isinstance(record, CheckpointRequested) for record in requested)
    assert [record.step for record in requested] == [8, 12]  # 12 is not saved twice
    assert requested[0].directory == str((tmp_path / "broken").absolute())


def test_a_finished_run_resumes_to_its_end_without_training(objective, tmp_path):
    first = _fit(objective, tmp_path / "run", steps=5)
    assert Checkpointer(tmp_path / "run").all_steps() == [4, 5]  # the end is saved too
    again = _fit(objective, tmp_path / "run", steps=5, fail_at=1)  # no batch is drawn
    assert int(again.step) == 5
    assert _same_bits(again.params, first.params)
    longer = _fit(objective, tmp_path / "run", steps=8)
    assert _same_bits(longer.params, _fit(objective, tmp_path / "straight", steps=8).params)


def test_saves_are_durable_when_fit_returns(objective, tmp_path):
    _fit(objective, tmp_path / "run", steps=8)
    folder = tmp_path / "run"
    assert sorted(path.name for path in folder.iterdir() if path.is_dir()) == ["4", "8"]
    assert not [path for path in folder.rglob("*") if "tmp" in path.name]


def test_the_early_stopper_state_is_resumed(objective, tmp_path):
    stopper = EarlyStopper(metric="loss", mode="min", patience=100, source="train")
    whole = _fit(objective, tmp_path / "whole", early_stopper=stopper)
    with pytest.raises(RuntimeError):
        _fit(objective, tmp_path / "broken", fail_at=7, early_stopper=stopper)
    extra = Checkpointer(tmp_path / "broken").restore(
        TrainState.create(objective, OPTIMIZER, key=jax.random.key(11))
    )[1]
    assert extra["early_stopping"]["best_step"] == 3
    resumed = _fit(objective, tmp_path / "broken", early_stopper=stopper)
    assert _same_bits(resumed.params, whole.params)


def test_checkpoint_errors_are_clear(objective, tmp_path):
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11))
    with pytest.raises(ValueError, match="checkpoint_every=4 needs somewhere to save"):
        trainer.fit(_data(), steps=4, log_every=2, checkpoint_every=4, progress=False)
    with pytest.raises(ValueError, match="checkpoint_every must be None or an integer >= 1"):
        _fit(objective, tmp_path / "x", checkpoint_every=0)
    state = _fit(objective, tmp_path / "run", steps=4)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        Trainer(objective, OPTIMIZER, key=jax.random.key(11), checkpoint_dir=tmp_path / "run").fit(
            _data(), steps=8, log_every=2, state=state, progress=False
        )
    with pytest.raises(FileNotFoundError, match="no checkpoint for step 3"):
        Checkpointer(tmp_path / "run").restore(state, step=3)


def test_a_resume_that_cannot_replay_its_batches_raises(objective, tmp_path):
    _fit(objective, tmp_path / "run", steps=4)
    short = Dataset(train=lambda partition: iter([{"text": VAL}] * 2))
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11), checkpoint_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="the 4 training batches the checkpointed run consumed"):
        trainer.fit(short, steps=8, log_every=2, progress=False)


def test_the_history_json_round_trips_non_finite_values():
    history = MetricHistory({"lm/validation/psnr": ((1, float("inf")), (2, float("nan")))})
    back = history_from_json(history_to_json(history))
    assert back["lm/validation/psnr"][0] == (1, float("inf"))
    assert np.isnan(back["lm/validation/psnr"][1][1])
    assert back == history


_POINT_VALUES = st.one_of(  # NumPy's float64 is a float, not written by the fast path
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=True, allow_infinity=True).map(np.float64),
)


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["lm/train/loss", "lm/validation/psnr"]),
        st.lists(st.tuples(st.integers(0, 10**9), _POINT_VALUES), max_size=5).map(tuple),
        max_size=2,
    )
)
def test_the_history_json_is_the_generic_encoding_of_every_point(series):
    # The fast path for an int step and a finite float writes what encoding each point
    # with encode_json_value (the format checkpoints have always held) writes.
    history = MetricHistory(series)
    generic = encode_json_value({tag: [list(point) for point in s] for tag, s in series.items()})
    written = history_to_json(history)
    assert json.dumps(written) == json.dumps(generic)
    assert history_from_json(json.loads(json.dumps(written))) == history


def test_the_run_key_survives_a_checkpoint(objective, tmp_path):
    state = TrainState.create(objective, OPTIMIZER, key=jax.random.key(42), ema=True)
    with Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(0, state, {"note": float("nan")})
        checkpoints.wait()
        restored, extra = checkpoints.restore(state)
    assert jnp.array_equal(jax.random.key_data(restored.key), jax.random.key_data(state.key))
    assert jax.random.key_impl(restored.key) == jax.random.key_impl(state.key)
    assert _same_bits(restored.ema_params, state.ema_params)
    assert np.isnan(extra["note"])


@pytest.mark.slow
@pytest.mark.parametrize("source", ["iterator", "token file"])
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, source):
    """An iterator of batches is replayed to the checkpoint; a token file (dew.data.tokens)
    is read from the checkpoint's step: both end bitwise equal to a run never killed."""
    extra = []
    if source == "token file":
        np.save(tmp_path / "tokens.npy", np.random.default_rng(5).integers(0, 8, 3000))
        extra = [str(tmp_path / "tokens.npy")]
    # The uninterrupted run in this process (the same function the worker runs).
    import _checkpoint_worker

    token_file = extra[0] if extra else None
    _checkpoint_worker.main(str(tmp_path / "whole"), str(tmp_path / "whole.npz"), 0.0, token_file)
    worker = [sys.executable, str(HERE / "_checkpoint_worker.py")]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = tmp_path / "killed"
    killed = [*worker, str(run), str(tmp_path / "killed.npz")]
    process = subprocess.Popen([*killed, "0.15", *extra], env=env)
    deadline = time.monotonic() + 240
    # Kill it mid-run, once a checkpoint past the first is complete (and more are coming).
    while not (run / "8").is_dir():
        assert process.poll() is None, "the worker ended before it was killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed.npz").exists()
    assert 8 <= Checkpointer(run).latest_step() < 24
    subprocess.run([*killed, "0", *extra], check=True, env=env, timeout=300)
    whole, resumed = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "killed.npz")
    assert sorted(whole.files) == sorted(resumed.files)
    assert int(resumed["step"]) == 24
    for name in whole.files:
        assert np.array_equal(whole[name], resumed[name]), name


class _CountingRows:
    """Token windows that record every read (the rows each batch asked for)."""

    def __init__(self, rows):
        self.rows, self.fingerprint, self.reads = rows, rows.fingerprint, []

    def __len__(self):
        return len(self.rows)

    def read(self, indices):
        self.reads.append(np.array(indices))
        return self.rows.read(indices)


def _step_indexed(path):
    windows = tokens(path, seq_len=8, batch=8, vocab_size=8, seed=3)
    rows = _CountingRows(windows.train.rows)
    return windows.train, rows, Dataset(train=StepBatches(rows, 8, 3), batch=8)


def test_a_step_indexed_source_resumes_at_step_100000_reading_only_the_new_batches(
    objective, tmp_path
):
    np.save(tmp_path / "tokens.npy", np.random.default_rng(5).integers(0, 8, 3000))
    reference, rows, data = _step_indexed(tmp_path / "tokens.npy")
    start = TrainState.create(objective, OPTIMIZER, key=jax.random.key(11))
    far = eqx.tree_at(lambda state: state.step, start, jnp.asarray(100_000, jnp.int32))
    with Checkpointer(tmp_path / "run") as checkpoints:  # a run saved at step 100,000
        checkpoints.save(100_000, far, {"data_start": 0})
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11), checkpoint_dir=tmp_path / "run")
    resumed = trainer.fit(data, 100_003, log_every=1, progress=False)
    assert int(resumed.step) == 100_003
    # No replay: the three batches read are those of steps 100,000 to 100,002, nothing else.
    expected = [reference.indices(step, Partition()) for step in (100_000, 100_001, 100_002)]
    assert len(rows.reads) == 3
    for read, want in zip(rows.reads, expected, strict=True):
        np.testing.assert_array_equal(read, want)
    # A fit continued with state= reads the same batches (a batch is a function of the step).
    _, rows, data = _step_indexed(tmp_path / "tokens.npy")
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11))
    continued = trainer.fit(data, 100_003, log_every=1, state=far, progress=False)
    assert len(rows.reads) == 3
    assert _same_bits(continued.params, resumed.params)


@pytest.mark.slow  # about 7 s (a fused step's compilation)
def test_a_step_indexed_resume_ends_bitwise_equal_to_one_fit_fused_or_not(objective, tmp_path):
    np.save(tmp_path / "tokens.npy", np.random.default_rng(5).integers(0, 8, 3000))
    whole = Trainer(objective, OPTIMIZER, key=jax.random.key(11)).fit(
        _step_indexed(tmp_path / "tokens.npy")[2], 8, log_every=2, progress=False
    )
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11), checkpoint_dir=tmp_path / "r")
    trainer.fit(_step_indexed(tmp_path / "tokens.npy")[2], 4, log_every=2, progress=False)
    _, rows, data = _step_indexed(tmp_path / "tokens.npy")
    resumed = trainer.fit(data, 8, log_every=2, steps_per_call=2, progress=False)
    assert len(rows.reads) == 4  # steps 4 to 7, two fused calls of two
    assert _same_bits(resumed.params, whole.params)


def _traces(folder):
    return list(pathlib.Path(folder).rglob("*.xplane.pb"))


class _TraceChecker(InMemoryTracker):
    """Asserts the trace file exists when the ProfileWindow record arrives."""

    def log_artifact(self, name, value, *, step=None):
        if isinstance(value, ProfileWindow):
            assert _traces(value.directory), "ProfileWindow reported before the trace stopped"
        super().log_artifact(name, value, step=step)


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_a_profile_window_traces_its_steps_then_reports(objective, tmp_path):
    tracker = _TraceChecker()
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11))
    trainer.fit(
        _data(),
        steps=8,
        log_every=4,
        profile=Profile(tmp_path / "trace", start=3, steps=2),
        tracker=tracker,
        progress=False,
    )
    [(step, record)] = tracker.artifacts["profile_window"]
    assert record == ProfileWindow(str(tmp_path / "trace"), traced_steps=2, start_step=3)
    assert step == 4
    assert len(_traces(tmp_path / "trace")) == 1


def test_a_window_cut_short_reports_the_steps_it_traced(objective, tmp_path):
    tracker = InMemoryTracker()
    trainer = Trainer(objective, OPTIMIZER, key=jax.random.key(11))
    trainer.fit(
        _data(),
        steps=4,
        log_every=4,
        profile=Profile(tmp_path / "trace", start=3, steps=10),
        tracker=tracker,
        progress=False,
    )
    [(_, record)] = tracker.artifacts["profile_window"]
    assert (record.start_step, record.traced_steps) == (3, 2)
    assert _traces(tmp_path / "trace")
    # A window past the end of the fit traces nothing and reports nothing.
    tracker = InMemoryTracker()
    trainer.fit(
        _data(),
        steps=1,
        log_every=1,
        profile=Profile(tmp_path / "late"),
        tracker=tracker,
        progress=False,
    )
    assert "profile_window" not in tracker.artifacts
    assert not (tmp_path / "late").exists()


def test_a_standalone_capture_writes_its_directory(tmp_path):
    with profile(tmp_path / "capture") as directory:
        (jnp.ones((8, 8)) @ jnp.ones((8, 8))).block_until_ready()
    assert directory == str(tmp_path / "capture")
    assert _traces(directory)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": 0}, "Profile.start must be an integer >= 1, got 0"),
        ({"steps": True}, "Profile.steps must be an integer >= 1, got True"),
        ({"directory": ""}, "Profile.directory must be a non-empty path"),
    ],
)
def test_bad_profile_windows_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Profile(**{"directory": "trace", **kwargs})


@pytest.mark.parametrize(
    ("other", "optimizer", "differs"),
    [
        ("model", OPTIMIZER, r"\.params\.stack\.token_embedding\.weight: saved float32\[8, 16\], "),
        ("optimizer", optax.sgd(3e-3), r"saved array \d+ \(float32\[.*\]\): not in this state"),
    ],
)
def test_resuming_a_checkpoint_of_another_model_or_optimizer_says_what_differs(
    objective, tmp_path, other, optimizer, differs
):
    _fit(objective, tmp_path / "run", steps=4)
    if other == "model":  # twice the width
        objective = LMObjective(
            CausalTransformer(8, 32, 1, 2, 32, 16, key=jax.random.key(0)), seq_len=8
        )
    trainer = Trainer(objective, optimizer, key=jax.random.key(11), checkpoint_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="written for another model or optimizer") as caught:
        trainer.fit(_data(), steps=8, log_every=2, progress=False)
    message = str(caught.value)
    assert len(message.splitlines()) <= 12, message
    assert f"the checkpoint at step 4 under {str(tmp_path / 'run')!r}" in message
    assert re.search(differs, message), message


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_ctrl_c_inside_orbax_wait_leaves_the_interrupt_to_the_caller(objective, tmp_path):
    """orbax logged a Ctrl-C in its wait with the interrupt's traceback (absl), before the
    caller's own report; now only the `KeyboardInterrupt` comes out, and the save still
    completes when waited for again."""
    from orbax.checkpoint import checkpoint_manager

    manager = checkpoint_manager.CheckpointManager
    finalize = manager._finalize
    state = TrainState.create(objective, OPTIMIZER, key=jax.random.key(2))
    shown = _Records()
    logging.getLogger("absl").addHandler(shown)

    def slow(self, *args):
        time.sleep(1.5)
        return finalize(self, *args)

    try:
        manager._finalize = slow
        with Checkpointer(tmp_path) as checkpoints:
            checkpoints.save(1, state)
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            with pytest.raises(KeyboardInterrupt):
                checkpoints.wait()
    finally:
        manager._finalize = finalize
        logging.getLogger("absl").removeHandler(shown)
    assert [record.getMessage() for record in shown.records if record.exc_info] == []
    assert Checkpointer(tmp_path).all_steps() == [1]


def _saved_with_ema(objective, directory):
    """A state whose EMA params differ from its params, saved as checkpoint 3."""
    state = TrainState.create(objective, OPTIMIZER, key=jax.random.key(0), ema=True)
    state = eqx.tree_at(
        lambda held: held.ema_params, state, jax.tree.map(lambda leaf: leaf * 2, state.params)
    )
    with Checkpointer(directory) as checkpoints:
        checkpoints.save(3, state)
    return state


def test_restore_params_reads_the_params_alone(objective, tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    fitted = _fit(objective, tmp_path / "run", steps=4)
    asked = []
    restore = ocp.PyTreeCheckpointHandler.restore

    def spy(self, directory, args=None):
        asked.append(args.item)
        return restore(self, directory, args=args)

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "restore", spy)
    with Checkpointer(tmp_path / "run") as checkpoints:
        step, params = checkpoints.restore_params(objective.init_params())
    assert step == 4 and _same_bits(params, fitted.params)
    (item,) = asked  # one read, of the params' arrays alone: orbax's placeholders elsewhere
    count = len(jax.tree.leaves(fitted.params))
    assert [i for i, leaf in enumerate(item) if leaf is not ocp.PLACEHOLDER] == list(
        range(1, 1 + count)
    )
    assert len(item) == len(jax.tree.leaves(fitted)) > 2 * count  # Adam's moments left unread


def test_restore_params_reads_the_ema_params_or_the_live_ones(objective, tmp_path):
    state = _saved_with_ema(objective, tmp_path)
    with Checkpointer(tmp_path) as checkpoints:
        assert checkpoints.restore(state)[1] == {}  # the layout stays dew's, not the caller's
        step, ema = checkpoints.restore_params(objective.init_params(), ema=True)
        _, live = checkpoints.restore_params(objective.init_params(), 3)
    assert step == 3
    assert _same_bits(ema, state.ema_params) and _same_bits(live, state.params)
    assert not _same_bits(ema, live)


def test_restore_params_of_a_checkpoint_from_before_layouts_were_recorded(objective, tmp_path):
    """A checkpoint whose JSON item records no layout: the params start at array 1, the EMA
    params end the list."""
    state = _saved_with_ema(objective, tmp_path)
    metadata = tmp_path / "3" / "extra" / "metadata"
    saved = json.loads(metadata.read_text())
    del saved["layout"]
    metadata.write_text(json.dumps(saved))
    with Checkpointer(tmp_path) as checkpoints:
        _, ema = checkpoints.restore_params(objective.init_params(), ema=True)
        _, live = checkpoints.restore_params(objective.init_params())
    assert _same_bits(ema, state.ema_params) and _same_bits(live, state.params)


def test_restore_params_of_another_model_or_without_ema_params_is_one_line(objective, tmp_path):
    _fit(objective, tmp_path / "run", steps=4)
    wider = LMObjective(CausalTransformer(8, 32, 1, 2, 32, 16, key=jax.random.key(0)), seq_len=8)
    directory = str(tmp_path / "run")
    with Checkpointer(tmp_path / "run") as checkpoints:
        with pytest.raises(ValueError, match="another model") as caught:
            checkpoints.restore_params(wider.init_params())
        assert str(caught.value) == (
            f"checkpoint step 4 under {directory!r}: it was written for another model: its "
            "params are 18 arrays, this model's 18, and the first that differs is "
            ".stack.token_embedding.weight: saved float32[8, 16], expected float32[8, 32]."
        )
        with pytest.raises(ValueError, match="EMA") as caught:
            checkpoints.restore_params(objective.init_params(), ema=True)
        assert str(caught.value) == (
            f"checkpoint step 4 under {directory!r}: it holds no EMA params (the run kept none)."
        )
        with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 2 .*steps are \[4\]"):
            checkpoints.restore_params(objective.init_params(), 2)
