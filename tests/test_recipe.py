"""RunConfig.train: the run folder, run.json never overwritten, resume, objectives, trackers."""

import json
import pathlib

import jax
import numpy as np
import pytest

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

SIZES = {
    "vocab_size": 16,
    "emb_features": 16,
    "num_layers": 1,
    "num_heads": 2,
    "mlp_features": 32,
    "max_seq_len": 16,
}


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
    config = _config(tmp_path, name="rate", eval_every=None, checkpoint_every=None)

    def trial(run):
        state = run.train(progress=False)
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
