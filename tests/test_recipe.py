"""RunConfig.train: the run folder, run.json never overwritten, resume, objectives, trackers."""

import json
import os
import pathlib

import jax
import numpy as np
import pytest
from _builders import TINY as SIZES

from dew import metrics
from dew.config import (
    ModelConfig,
    ObjectiveConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
    override,
)
from dew.config._recipe import run_folder
from dew.config.sweep import grid_search, sweep
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.registry import datasets
from dew.tracking import InMemoryTracker, read_journal


def _config(root, **trainer):
    settings = {
        "name": "tiny",
        "checkpoint_dir": str(root),
        "steps": 6,
        "batch_size": 8,
        "log_every": 3,
        "eval_every": 3,
        "checkpoint_every": 3,
        **trainer,
    }
    return RunConfig(
        model=ModelConfig("causal_transformer", SIZES),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(**settings),
    )


def _same_bits(left, right):
    pairs = zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True)
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)


PERPLEXITY = (metrics.perplexity(),)


def test_a_run_folder_holds_its_record_checkpoints_and_journals(tmp_path):
    config = _config(tmp_path)
    state = config.train(metrics=PERPLEXITY, progress=False)
    folder = tmp_path / "tiny"
    assert int(state.step) == 6
    assert sorted(path.name for path in (folder / "checkpoints").iterdir()) == ["3", "6"]
    assert RunConfig.from_run_record(folder) == config
    record = json.loads((folder / "run.json").read_text())
    assert record["type"] == "run_record" and "jax" in record["packages"]
    journal = read_journal(folder)
    assert [step for step, _ in journal.scalars["lm/train/loss"]] == [3, 6]
    assert [step for step, _ in journal.scalars["lm/validation/perplexity"]] == [3, 6]
    kinds = [record.type for _, _, record in journal.records]
    assert kinds[:2] == ["run_record", "fit_started"] and kinds[-1] == "fit_ended"
    assert kinds.count("checkpoint_requested") == 2
    assert journal.params["config/optim/learning_rate"] == 0.01


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_run_json_is_never_overwritten_and_a_rerun_resumes(tmp_path):
    config = _config(tmp_path)
    first = config.train(metrics=PERPLEXITY, progress=False)
    run_json = tmp_path / "tiny" / "run.json"
    written = run_json.read_text()
    again = config.train(metrics=PERPLEXITY, progress=False)  # resumes at its end
    assert run_json.read_text() == written
    assert _same_bits(again.params, first.params)
    other = override(config, {"optim.learning_rate": 0.003})
    with pytest.raises(ValueError, match=r"records another configuration .*: optim\)"):
        other.train(progress=False)
    assert run_json.read_text() == written
    # Under another name the same change is an ordinary new run.
    other.train(name="tiny-0.003", progress=False)
    # run.json records the resolved configuration, the name the run trained under included.
    recorded = RunConfig.from_run_record(tmp_path / "tiny-0.003")
    assert recorded == override(other, {"trainer.name": "tiny-0.003"})


@pytest.mark.slow  # about 7 s; CI runs it with the slow tests
def test_a_given_objective_trains_the_configured_model(tmp_path):
    config = _config(tmp_path, eval_every=None, checkpoint_every=None)
    built = config.train(progress=False)
    other_init = CausalTransformer(**SIZES, key=jax.random.key(99))
    given = config.train(LMObjective(other_init, seq_len=8), name="given", progress=False)
    by_name = config.train("lm", name="by-name", progress=False)
    factory = config.train(
        lambda model: LMObjective(model, seq_len=8), name="factory", progress=False
    )
    for state in (given, by_name, factory):
        assert _same_bits(state.params, built.params)


def test_the_objective_section_builds_and_takes_seq_len_from_the_data(tmp_path):
    config = override(_config(tmp_path, eval_every=None), {"objective.kwargs.pad_id": 0})
    assert config.objective == ObjectiveConfig("lm", {"pad_id": 0})
    state = config.train(progress=False)
    assert int(state.step) == 6
    with pytest.raises(TypeError, match="the objective factory returned"):
        config.train(lambda model: model, name="bad", progress=False)


def test_a_tracker_receives_what_the_local_tracker_does(tmp_path):
    tracker = InMemoryTracker()
    _config(tmp_path).train(metrics=PERPLEXITY, tracker=tracker, progress=False)
    journal = read_journal(tmp_path / "tiny")
    assert tracker.scalars == journal.scalars
    assert tracker.params == journal.params
    assert [type(record).type for _, record in tracker.artifacts["run_record"]] == ["run_record"]
    assert not tracker.closed
    assert "samples" not in tracker.artifacts  # previews only when asked for


def test_names_are_required_and_checked(tmp_path):
    config = _config(tmp_path, name=None)
    with pytest.raises(ValueError, match=r"RunConfig\.train needs a run name"):
        config.train(progress=False)
    with pytest.raises(ValueError, match="name"):
        config.train(name="../escape", progress=False)


def test_a_run_at_a_file_uri_is_a_local_run_folder_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    root = tmp_path / "my runs"
    config = _config(root.as_uri(), steps=3, eval_every=None)  # file:///.../my%20runs
    assert run_folder(config, "tiny") == (str(root / "tiny" / "checkpoints"), root / "tiny")
    config.train(progress=False)
    resumed = _config(root.as_uri(), steps=6, eval_every=None).train(progress=False)
    assert int(resumed.step) == 6
    assert sorted(path.name for path in (root / "tiny" / "checkpoints").iterdir()) == ["3", "6"]
    starts = [
        r.start_step for _, _, r in read_journal(root / "tiny").records if r.type == "fit_started"
    ]
    assert starts == [0, 3]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["my runs"]
    assert capsys.readouterr().out == ""  # a local run: nothing to say where


def test_checkpoints_at_a_uri_keep_tracking_local(tmp_path):
    config = _config("gs://bucket/runs")
    checkpoints, folder = run_folder(config, "tiny")
    assert checkpoints == "gs://bucket/runs/tiny/checkpoints"
    assert folder == pathlib.Path("runs") / "tiny"
    checkpoints, folder = run_folder(_config(tmp_path), "a/b")
    assert (checkpoints, folder) == (str(tmp_path / "a" / "b" / "checkpoints"), tmp_path / "a/b")


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_each_sweep_trial_is_an_ordinary_run_with_its_own_record(tmp_path):
    from dew._lock import FolderLockedError, check_unlocked

    config = _config(tmp_path, name="rate", eval_every=None, checkpoint_every=None)
    holders = []

    class LockProbe(InMemoryTracker):
        """Asks, while the trial trains, who holds its run folder."""

        def _log_metrics(self, values, *, step):
            try:
                check_unlocked(run_folder(self.run, self.run.trainer.name)[1])
            except FolderLockedError as error:
                holders.append(error.pid)

    def trial(run):
        probe = LockProbe()
        probe.run = run
        state = run.train(progress=False, tracker=probe)
        return state.metric_history["lm/train/loss"][-1][1]

    trials = sweep(
        config,
        {"optim.learning_rate": [0.01, 0.001]},
        train=trial,
        trials=2,
        ledger=tmp_path / "ledger.json",
        search=grid_search,
    )
    assert [trial.overrides for trial in trials] == [
        {"optim.learning_rate": 0.01},
        {"optim.learning_rate": 0.001},
    ]
    for index, rate in enumerate((0.01, 0.001)):
        recorded = RunConfig.from_run_record(tmp_path / "rate" / f"trial-{index}")
        assert recorded.optim.learning_rate == rate
        assert recorded.trainer.name == f"rate/trial-{index}"
    # Each trial's folder was locked by this process while it trained.
    assert holders and set(holders) == {os.getpid()}


@pytest.mark.parametrize("progress", [True, False])
def test_a_run_checkpointing_to_a_uri_tracks_locally_and_says_where(
    tmp_path, monkeypatch, capsys, progress
):
    import dew.config._recipe as recipe

    given = []

    class LocalStandIn(recipe.Trainer):
        """Records the URI the recipe chose, and checkpoints to a local folder instead
        (orbax has no local URI scheme to test with)."""

        def __init__(self, *args, checkpoint_dir=None, **kwargs):
            given.append(checkpoint_dir)
            super().__init__(*args, checkpoint_dir=tmp_path / "remote", **kwargs)

    monkeypatch.setattr(recipe, "Trainer", LocalStandIn)
    monkeypatch.chdir(tmp_path)
    config = _config("gs://bucket/runs", eval_every=None, checkpoint_every=None)
    config.train(progress=progress)  # said whatever the progress setting
    assert given == ["gs://bucket/runs/tiny/checkpoints"]
    local = tmp_path / "runs" / "tiny"
    assert f"local tracking at {local}" in capsys.readouterr().out
    assert RunConfig.from_run_record(local) == config
    assert read_journal(local).scalars["lm/train/loss"]


def test_the_data_seq_len_reaches_only_objectives_that_name_it():
    from dew.objectives.dpo import DPOObjective

    model = CausalTransformer(**SIZES, key=jax.random.key(0))
    dpo = ObjectiveConfig("dpo", {"beta": 0.1}).build(model, seq_len=8)  # **kwargs: not offered
    assert isinstance(dpo, DPOObjective)
    assert ObjectiveConfig("lm").build(model, seq_len=8).seq_len == 8


def _fit_starts(folder):
    return [
        (record.start_step, record.steps)
        for _, _, record in read_journal(folder).records
        if record.type == "fit_started"
    ]


@pytest.mark.slow  # about 8 s; CI runs it with the slow tests
def test_a_moved_run_folder_resumes_where_it_is_now(tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    # Relative checkpoint_dir first, then the same folder by its absolute path.
    _config("runs", steps=3, eval_every=None).train(progress=False)
    state = _config(tmp_path / "runs", eval_every=None).train(progress=False)
    assert int(state.step) == 6
    assert _fit_starts(tmp_path / "runs" / "tiny") == [(0, 3), (3, 6)]
    # Moved to another root: the run continues there, from its checkpoint.
    shutil.move(tmp_path / "runs", tmp_path / "elsewhere")
    moved = tmp_path / "elsewhere" / "tiny"
    state = _config(tmp_path / "elsewhere", steps=9, eval_every=None).train(progress=False)
    assert int(state.step) == 9
    assert _fit_starts(moved)[-1] == (6, 9)
    # Read back from the moved folder, from another working directory, the run is located
    # where it is now, so training it again resumes it there.
    monkeypatch.chdir(tmp_path.parent)
    recorded = RunConfig.from_run_record(moved)
    assert (recorded.trainer.checkpoint_dir, recorded.trainer.name) == (str(moved.parent), "tiny")
    assert run_folder(recorded, "tiny")[1] == moved
    assert int(override(recorded, {"trainer.steps": 12}).train(progress=False).step) == 12
    assert _fit_starts(moved)[-1] == (9, 12)
    # A truly different configuration is still refused.
    with pytest.raises(ValueError, match=r"records another configuration .*: optim\)"):
        override(recorded, {"optim.learning_rate": 0.5}).train(progress=False)


def test_a_run_folder_another_holder_locks_is_refused_before_anything_is_written(tmp_path):
    from dew._lock import FolderLockedError, folder_lock

    folder = tmp_path / "tiny"
    folder.mkdir()
    with folder_lock(folder), pytest.raises(FolderLockedError, match="in use by process"):
        _config(tmp_path).train(progress=False)
    assert sorted(path.name for path in folder.iterdir()) == ["run.lock"]


def test_what_can_be_checked_is_checked_before_anything_is_written(tmp_path):
    typo = override(_config(tmp_path), {"optim.optimizer": "adamm"})
    with pytest.raises(KeyError, match="no optimizer is registered as 'adamm'"):
        typo.train(progress=False)
    images = override(
        _config(tmp_path), {"data": {"name": "shapes"}, "objective.kwargs.seq_len": 8}
    )
    with pytest.raises(ValueError, match=r"does not fit the 'lm' objective: .*batch key 'text'"):
        images.train(progress=False)
    assert list(tmp_path.iterdir()) == []  # no run folder, no run.json, no journal


class _FailingTracker(InMemoryTracker):
    """A tracker whose store cannot be reached: it fails at the run's first report."""

    def _log_artifact(self, name, value, *, step):
        raise OSError("the tracking store is unreachable")


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_a_run_that_never_completed_a_step_starts_over_with_another_configuration(tmp_path, capsys):
    first = _config(tmp_path, eval_every=None)
    with pytest.raises(OSError, match="unreachable"):
        first.train(tracker=_FailingTracker(), progress=False)
    folder = tmp_path / "tiny"
    written = (folder / "run.json").read_text()  # the failed attempt recorded its config
    corrected = override(first, {"optim.learning_rate": 0.003})
    state = corrected.train(progress=True)
    assert int(state.step) == 6
    said = [line for line in capsys.readouterr().out.splitlines() if "starts over" in line]
    assert said == [
        f"{folder}: its run.json recorded another configuration (sections that differ: optim) "
        "and the run never completed a step, so it starts over with this one (the old record "
        "is now run.json.previous)"
    ]
    assert RunConfig.from_run_record(folder) == corrected
    assert (folder / "run.json.previous").read_text() == written
    journal = read_journal(folder)
    assert journal.params["config/optim/learning_rate"] == 0.003
    records = [record for _, _, record in journal.records if record.type == "run_record"]
    assert [record.optim["learning_rate"] for record in records] == [0.01, 0.003]
    # Once it has completed a step, its record is never replaced.
    with pytest.raises(ValueError, match=r"records another configuration .*: optim\)"):
        first.train(progress=False)
    assert RunConfig.from_run_record(folder) == corrected


@pytest.mark.slow  # about 6 s; CI runs it with the slow tests
def test_relative_data_paths_are_recorded_absolute_and_read_from_anywhere(tmp_path, monkeypatch):
    from dew.config import evaluate_run

    project = tmp_path / "project"
    project.mkdir()
    tokens = np.random.default_rng(0).integers(0, 16, 4096).astype(np.int32)
    np.save(project / "licenses.npy", tokens)
    monkeypatch.chdir(project)
    config = override(
        _config("runs", eval_every=None),
        {"data": {"name": "token_windows", "kwargs": {"seq_len": 8, "path": "licenses.npy"}}},
    )
    config.train(progress=False)
    record = json.loads((project / "runs" / "tiny" / "run.json").read_text())
    assert record["data"]["kwargs"]["path"] == str(project / "licenses.npy")
    assert record["paths"] == {"data.kwargs.path": "licenses.npy"}  # as given, for display
    # Another working directory: evaluation and a resume read the same file.
    monkeypatch.chdir(tmp_path)
    scores = evaluate_run(project / "runs" / "tiny", metrics=PERPLEXITY)
    assert scores.step == 6 and np.isfinite(scores.scores["perplexity"])
    recorded = RunConfig.from_run_record(project / "runs" / "tiny")
    assert int(override(recorded, {"trainer.steps": 8}).train(progress=False).step) == 8
    # The configuration as first written, from its own directory, is the same run.
    monkeypatch.chdir(project)
    assert int(override(config, {"trainer.steps": 10}).train(progress=False).step) == 10


def test_a_link_where_the_journal_goes_is_refused_and_nothing_is_written_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "runs" / "tiny"
    folder.mkdir(parents=True)
    (folder / "scalars.jsonl").symlink_to(outside / "scalars.jsonl")
    with pytest.raises(OSError, match="is a symbolic link") as caught:
        _config(tmp_path / "runs").train(progress=False)
    assert caught.value.filename == str(folder / "scalars.jsonl")
    assert list(outside.iterdir()) == []
    assert not (folder / "run.json").exists()
