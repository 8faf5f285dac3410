"""Damaged checkpoints: a resume passes over a damaged newest step for the newest intact one,
says which step and why in one line, and never restores damaged arrays.

Every case damages step 4 of one real run saved at steps 2 and 4 (a copy per test); the
reference states are the ones `Trainer.fit` returned at steps 2 and 4, not a restore.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import jax
import numpy as np
import optax
import pytest
from _builders import TINY, tiny_lm_objective

from dew import Trainer
from dew.checkpoints import Checkpointer, DamagedCheckpointWarning
from dew.cli import main
from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
from dew.data import Dataset
from dew.registry import datasets
from dew.steps import TrainState

OPTIMIZER = optax.adam(3e-3)


def _batches():
    rng = np.random.default_rng(7)
    while True:
        yield {"text": rng.integers(0, 8, (8, 9)).astype(np.int32)}


DATA = Dataset(train=lambda partition: _batches())


def _trainer(objective, directory):
    return Trainer(objective, OPTIMIZER, key=jax.random.key(11), checkpoint_dir=directory)


def _fit(objective, directory, steps):
    return _trainer(objective, directory).fit(
        DATA, steps=steps, log_every=2, checkpoint_every=2, progress=False
    )


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective(8, seed=3)


@pytest.fixture(scope="module")
def saved(objective, tmp_path_factory):
    """A run saved at steps 2 and 4, and the states `fit` returned at those steps."""
    folder = tmp_path_factory.mktemp("saved") / "checkpoints"
    at_two = _fit(objective, folder, 2)
    at_four = _fit(objective, folder, 4)  # resumes from step 2
    assert Checkpointer(folder).all_steps() == [2, 4]
    return folder, {2: at_two, 4: at_four}


@pytest.fixture
def run(saved, tmp_path):
    """A copy of the saved run to damage."""
    folder = tmp_path / "checkpoints"
    shutil.copytree(saved[0], folder)
    return folder


def _template(objective):
    return TrainState.create(objective, OPTIMIZER, key=jax.random.key(0))


def _equal(restored, expected):
    """Bitwise equal: step, params, optimizer state, run key and metric history."""
    pairs = [
        (restored.step, expected.step),
        (jax.random.key_data(restored.key), jax.random.key_data(expected.key)),
        *zip(
            jax.tree.leaves((restored.params, restored.opt_state)),
            jax.tree.leaves((expected.params, expected.opt_state)),
            strict=True,
        ),
    ]
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    return same and restored.metric_history == expected.metric_history


def _cut(path, keep=None):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep(len(data))])


def _array_files(step):
    return sorted(path for path in (step / "state").rglob("d/*") if path.is_file())


def _emptied(step):
    shutil.rmtree(step)
    step.mkdir()


def _replaced_by_a_file(step):
    shutil.rmtree(step)
    step.write_text("not a checkpoint\n")


DAMAGED = {
    "emptied folder": (_emptied, r"its folder is empty"),
    "extra/ deleted": (lambda step: shutil.rmtree(step / "extra"), r"its extra/ item is missing"),
    "state/ deleted": (lambda step: shutil.rmtree(step / "state"), r"its state/ item is missing"),
    "_METADATA cut in half": (
        lambda step: _cut(step / "state" / "_METADATA"),
        r"state/_METADATA is not valid JSON",
    ),
    "_METADATA emptied": (
        lambda step: _cut(step / "state" / "_METADATA", lambda size: 0),
        r"state/_METADATA is not valid JSON",
    ),
    "extra/metadata cut in half": (
        lambda step: _cut(step / "extra" / "metadata"),
        r"extra/metadata is not valid JSON",
    ),
    "half-written arrays": (
        lambda step: [_cut(path) for path in _array_files(step)],
        r"state/.*d/[0-9a-f]+ is cut short",
    ),
    "array files one byte short": (
        lambda step: [_cut(path, lambda size: size - 1) for path in _array_files(step)],
        r"state/.*d/[0-9a-f]+ is cut short",
    ),
    "array files deleted": (
        lambda step: [path.unlink() for path in _array_files(step)],
        r"state/.*d/[0-9a-f]+ is missing",
    ),
    "manifest deleted": (
        lambda step: (step / "state" / "manifest.ocdbt").unlink(),
        r"the array data under state/ is missing",
    ),
    "step folder replaced by a file": (
        _replaced_by_a_file,
        r"it is a file, not a checkpoint folder",
    ),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_newest_step_gives_way_to_the_intact_one(objective, saved, run, case):
    damage, why = DAMAGED[case]
    damage(run / "4")
    with pytest.warns(DamagedCheckpointWarning) as caught:
        restored, extra = Checkpointer(run).restore(_template(objective))
    assert len(caught) == 1
    assert str(caught[0].message) == _one_line(caught[0].message)
    assert caught[0].message.args[0].startswith(f"checkpoint step 4 under {run} is damaged (")
    assert _matches(why, str(caught[0].message))
    assert "restored step 2 instead; the damaged step is renamed 4.damaged." in str(
        caught[0].message
    )
    assert _equal(restored, saved[1][2])
    assert extra == {"data_start": 0}
    # Set aside, not deleted: the next restore is silent and a save of step 4 has its place.
    assert sorted(path.name for path in run.iterdir()) == ["2", "4.damaged"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Checkpointer(run) as checkpoints:
            assert checkpoints.all_steps() == [2]
            again, _ = checkpoints.restore(_template(objective))
            checkpoints.save(4, saved[1][4])
    assert _equal(again, saved[1][2])
    assert Checkpointer(run).all_steps() == [2, 4]


@pytest.mark.parametrize("case", DAMAGED)
def test_a_params_only_restore_passes_over_the_same_damage(objective, saved, run, case):
    """`restore_params` (what `dew.load_run` reads) passes over a damaged step as `restore`
    does, with the same warning, and restores the params of the step before it."""
    damage, why = DAMAGED[case]
    damage(run / "4")
    with pytest.warns(DamagedCheckpointWarning) as caught:
        step, params = Checkpointer(run).restore_params(objective.init_params())
    assert len(caught) == 1 and _matches(why, str(caught[0].message))
    assert caught[0].message.args[0].startswith(f"checkpoint step 4 under {run} is damaged (")
    assert step == 2
    expected = jax.tree.leaves(saved[1][2].params)
    assert all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(params), expected, strict=True)
    )
    assert sorted(path.name for path in run.iterdir()) == ["2", "4.damaged"]


def _one_line(message):
    return " ".join(str(message).splitlines())


def _matches(pattern, text):
    import re

    return re.search(pattern, text) is not None


WHOLE = {
    "_CHECKPOINT_METADATA cut in half": lambda step: _cut(step / "_CHECKPOINT_METADATA"),
    "_CHECKPOINT_METADATA deleted": lambda step: (step / "_CHECKPOINT_METADATA").unlink(),
    "commit_success.txt deleted": lambda step: [
        path.unlink() for path in step.rglob("commit_success.txt")
    ],
    "array_metadatas deleted": lambda step: shutil.rmtree(step / "state" / "array_metadatas"),
    "_sharding deleted": lambda step: (step / "state" / "_sharding").unlink(),
}


@pytest.mark.parametrize("case", WHOLE)
def test_damage_that_leaves_every_array_whole_restores_the_step(objective, saved, run, case):
    """orbax's bookkeeping files lost, the arrays and the JSON item whole: the step
    restores, bitwise what was saved."""
    WHOLE[case](run / "4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored, _ = Checkpointer(run).restore(_template(objective))
    assert _equal(restored, saved[1][4])


def test_no_intact_step_is_refused_naming_the_folder(objective, run):
    _emptied(run / "4")
    shutil.rmtree(run / "2" / "extra")
    with pytest.raises(ValueError, match=r"^no intact checkpoint") as caught:
        Checkpointer(run).restore(_template(objective))
    assert str(caught.value) == (
        f"no intact checkpoint under {str(run)!r} (step 2: its extra/ item is missing; step 4: "
        "its folder is empty): move those folders aside to start the run over, or use a new "
        "checkpoint directory."
    )
    assert sorted(path.name for path in run.iterdir()) == ["2", "4"]  # nothing moved


def test_a_damaged_step_asked_for_by_number_raises_naming_it(objective, run):
    shutil.rmtree(run / "4" / "extra")
    with pytest.raises(ValueError, match=r"^checkpoint step 4 under .* is damaged: its extra/"):
        Checkpointer(run).restore(_template(objective), step=4)
    assert (run / "4").is_dir()


def test_a_resumed_fit_passes_over_a_damaged_step(objective, saved, run, tmp_path):
    """A fit continues from step 2 as if step 4 had never been saved: it ends bitwise equal
    to a fit resumed from a run saved at step 2 alone."""
    shutil.rmtree(run / "4" / "extra")
    with pytest.warns(DamagedCheckpointWarning, match="checkpoint step 4 under"):
        resumed = _fit(objective, run, 6)
    clean = tmp_path / "clean"
    shutil.copytree(run, clean, ignore=shutil.ignore_patterns("4.damaged"))
    shutil.rmtree(clean / "4")
    shutil.rmtree(clean / "6")
    assert Checkpointer(clean).all_steps() == [2]
    assert _equal(resumed, _fit(objective, clean, 6))
    assert Checkpointer(run).all_steps() == [2, 4, 6]


def _dew(*arguments, cwd):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "dew.cli", *map(str, arguments)]
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True)


@pytest.mark.slow  # one fit in this process and two `dew train` runs, about 10 s each
def test_dew_train_says_in_one_line_which_step_it_passed_over(tmp_path, monkeypatch):
    config = RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="tiny",
            checkpoint_dir="runs",
            steps=4,
            batch_size=8,
            log_every=2,
            checkpoint_every=2,
        ),
    )
    config.dump_toml(tmp_path / "run.toml")
    # The run to damage is trained in this process; the two commands after it are real ones.
    monkeypatch.chdir(tmp_path)  # the configuration's checkpoint_dir is relative
    assert main(["train", "run.toml", "--quiet"]) == 0
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"
    shutil.copytree(checkpoints / "2", tmp_path / "step-2")
    shutil.rmtree(checkpoints / "4" / "extra")

    resumed = _dew("train", "run.toml", "--quiet", "--steps", "6", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr == (
        f"dew train: warning: checkpoint step 4 under {checkpoints} is damaged (its "
        "extra/ item is missing): restored step 2 instead; the damaged step is renamed "
        "4.damaged.\n"
    )
    records = (tmp_path / "runs" / "tiny" / "records.jsonl").read_text().splitlines()
    starts = [json.loads(line)["record"] for line in records if '"fit_started"' in line]
    assert [start["start_step"] for start in starts] == [0, 2]

    for step in ("2", "4", "6"):  # nothing intact left
        shutil.rmtree(checkpoints / step / "extra")
    refused = _dew("train", "run.toml", "--quiet", "--steps", "8", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(
        f"dew train: no intact checkpoint under {str(checkpoints)!r} (step 2: its "
        "extra/ item is missing; step 4: its extra/ item is missing; step 6: its extra/"
    )
    assert pathlib.Path(checkpoints / "4.damaged").is_dir()
