"""dew's built-in run configurations: `dew train --config NAME` end to end (the run folder,
its previews, `dew eval` on it), their TOML round trip, and `TrainerConfig.preview`.

The full-length runs (each trains its full steps in under two minutes on 2 CPU cores) are
checked by hand, not here: these runs take a few steps of a CI-sized model."""

import contextlib
import dataclasses
import io
import json
import re

import jaxtyping
import numpy as np
import pytest
from _grids import check_grid, gif_colours, uint8
from PIL import Image, ImageSequence

from dew.cli import main
from dew.config import BUILTIN_CONFIGS, RunConfig, TrainerConfig, builtin, override
from dew.config._builtin import tiny_diffusion, tiny_jepa, tiny_lm, tiny_video_diffusion
from dew.data import Partition
from dew.naming import parse_metric_tag
from dew.registry import SHAPE_KINDS
from dew.tracking import InMemoryTracker, read_journal

STEPS = 2
# Each run: two steps of a CI-sized model, logged, evaluated (so previewed) and
# checkpointed at its last step.
SHORT = [
    "--steps",
    str(STEPS),
    "--set",
    "trainer.log_every=1",
    "--set",
    f"trainer.eval_every={STEPS}",
    "--set",
    f"trainer.checkpoint_every={STEPS}",
    "--quiet",
]
CI_MODEL = ["model.kwargs.width=32", "model.kwargs.depth=1", "model.kwargs.heads=2"]
VISION = ("tiny_diffusion", "tiny_video_diffusion", "tiny_jepa")


def _run(arguments):
    """`dew ARGUMENTS` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(arguments)
    return status, out.getvalue(), err.getvalue()


def _no_weights(path):
    return (
        f"no weights at {path}, named by $DEW_FID_WEIGHTS (save pytorch-fid's "
        "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/"
        "pt_inception-2015-12-05-6726825d.pth there)"
    )


def _sets(items):
    return [part for item in items for part in ("--set", item)]


@pytest.fixture(scope="module", autouse=True)
def missing_fid_weights(tmp_path_factory):
    """$DEW_FID_WEIGHTS names a file that is not there, for this module's runs: the image
    config skips FID (tests/test_default_fid.py scores it with weights)."""
    missing = tmp_path_factory.mktemp("no_fid_weights") / "pt_inception.pth"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEW_FID_WEIGHTS", str(missing))
        yield missing


@pytest.fixture(scope="module", params=VISION)
def trained(request, tmp_path_factory):
    """(name, run folder, dew train's result) of a short `dew train --config NAME`."""
    name = request.param
    root = tmp_path_factory.mktemp(name)
    arguments = ["train", "--config", name, "--checkpoint-dir", str(root), *SHORT]
    result = _run([*arguments, *_sets(CI_MODEL)])
    return name, root / builtin(name).trainer.name, result


@pytest.mark.slow
def test_dew_train_config_writes_the_run_folder_and_its_previews(trained, missing_fid_weights):
    name, folder, (status, out, err) = trained
    assert status == 0, err
    assert f"run folder {folder}" in out
    skipped = [line for line in out.splitlines() if "skipped" in line]
    if name == "tiny_diffusion":  # images get FID when its weights are there
        assert skipped == [f"fid skipped: {_no_weights(missing_fid_weights)}"]
    else:  # clips and JEPA's representations: no FID to skip
        assert skipped == []
    recorded = RunConfig.from_run_record(folder)
    expected = builtin(name)
    assert recorded.data == expected.data and recorded.objective == expected.objective
    assert recorded.trainer.steps == STEPS and recorded.trainer.preview is True
    assert [path.name for path in (folder / "checkpoints").iterdir()] == [str(STEPS)]
    journal = read_journal(folder)
    stage = expected.objective.name
    losses = journal.scalars[f"{stage}/train/loss"]
    assert [step for step, _ in losses] == list(range(1, STEPS + 1))
    previews = folder / "previews" / stage / "validation" / "samples" / str(STEPS)
    files = sorted(previews.iterdir())
    if name == "tiny_jepa":  # the scored features' spread, one count per feature
        assert [path.name for path in files] == ["histogram.json"]
        histogram = json.loads(files[0].read_text())
        assert histogram["dimensions"] == 32 and sum(histogram["counts"]) == 32
        assert histogram["non_finite"] == 0
    else:  # one labelled grid: four samples above the four real rows that conditioned them
        frames = expected.model.kwargs.get("frames")
        assert [path.name for path in files] == ["grid.gif" if frames else "grid.png"]
        data = expected.data.build(batch_size=expected.trainer.batch_size, seed=0)
        batch = next(data.val(Partition()))
        real = batch["clips" if frames else "images"][:4]
        real = real if frames else real[:, None]
        captions = [SHAPE_KINDS[label] for label in batch["labels"][:4]]
        with Image.open(files[0]) as image:
            assert image.format == ("GIF" if frames else "PNG")
            shown = [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]
        assert len(shown) == (frames or 1)
        for number, picture in enumerate(shown):  # read back against the layout rule
            cells = [picture[2 : 2 + 64 : 4, 62 + 66 * column :][:, :64:4] for column in range(4)]
            lines = [("generated", np.stack(cells)), ("real", uint8(real[:, number]))]
            check_grid(picture, lines, captions, colours=gif_colours if frames else lambda x: x)
    # The journal points at the files.
    entries = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    (shown,) = [entry for entry in entries if entry["name"] == f"{stage}/validation/samples"]
    assert shown["step"] == STEPS and len(shown["files"]) == len(files)


@pytest.mark.slow
def test_dew_eval_rescores_the_last_checkpoint(trained, missing_fid_weights):
    name, folder, (status, _, err) = trained
    assert status == 0, err
    status, out, err = _run(["eval", str(folder), "--verbose"])  # the counts too
    assert status == 0, err
    lines = out.splitlines()
    if name == "tiny_jepa":  # the probes of the EMA encoder: what the last event scored
        journal = read_journal(folder)
        scores = []
        for metric in ("batch_linear_probe_accuracy", "batch_knn_probe_accuracy"):
            ((step, value),) = journal.scalars[f"jepa/validation/{metric}"]
            assert step == STEPS
            scores.append(f"{metric} {value:.4f}")
        assert lines[0] == f"step {STEPS}  " + "  ".join(scores)
        assert "evaluation/coordinated_batches 2  evaluation/records 128" in lines[1]
        return
    if name == "tiny_diffusion":  # FID skipped, naming the missing file
        assert lines.pop(0) == f"fid skipped: {_no_weights(missing_fid_weights)}"
    # The shape scores of the EMA params' samples: what the last event scored.
    journal = read_journal(folder)
    scores = []
    for tag, series in journal.scalars.items():
        if tag.startswith("diffusion/validation/"):
            ((step, value),) = series
            assert step == STEPS
            scores.append(f"{parse_metric_tag(tag).metric} {value:.4f}")
    assert scores[0].startswith("class_accuracy ") and len(scores) == 7
    assert lines[0] == f"step {STEPS}  " + "  ".join(scores)
    # 64 of the 1024 rows are held out: the batches and rows the pass read.
    batches = 64 // builtin(name).trainer.batch_size
    assert f"evaluation/coordinated_batches {batches}  evaluation/records 64" in lines[1]


@pytest.mark.parametrize("name", BUILTIN_CONFIGS)
def test_each_built_in_config_round_trips_through_toml_and_plain_data(name, tmp_path):
    config = builtin(name)
    assert config.trainer.name is not None and config.trainer.checkpoint_dir == "runs"
    path = tmp_path / f"{name}.toml"
    config.dump_toml(path)
    assert RunConfig.load(path) == config
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert builtin(name) == config  # a fresh config each call, equal


def test_the_built_in_names():
    assert BUILTIN_CONFIGS[0] == "tiny_lm"
    assert set(BUILTIN_CONFIGS) == {"tiny_lm", *VISION, "tiny_classifier"}
    assert builtin("tiny_lm") == tiny_lm()
    assert builtin("tiny_diffusion") == tiny_diffusion()
    assert builtin("tiny_video_diffusion") == tiny_video_diffusion()
    assert builtin("tiny_jepa") == tiny_jepa()
    assert tiny_lm().trainer.preview is False  # the LM keeps its behaviour: no previews
    for name in VISION:
        assert builtin(name).trainer.preview is True
    with pytest.raises(ValueError, match="no built-in run configuration is named 'tiny'") as caught:
        builtin("tiny")
    assert all(repr(name) in str(caught.value) for name in BUILTIN_CONFIGS)


def test_an_unknown_config_name_is_one_line_naming_it_and_the_built_in_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, err = _run(["train", "--config", "tiny_nope"])
    assert status == 2
    assert (
        err.startswith("dew train: tiny_nope: No such file or directory") and err.count("\n") == 1
    )
    assert "'tiny_nope' is neither a file nor a built-in configuration's name" in err
    assert all(name in err for name in BUILTIN_CONFIGS)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_config_file_named_like_a_path_still_trains_from_the_file(tmp_path):
    config = override(tiny_lm(), {"trainer.checkpoint_dir": str(tmp_path / "runs")})
    path = tmp_path / "run.toml"
    config.dump_toml(path)
    short = ["--steps", "1", "--set", "trainer.log_every=1", "--quiet"]
    status, out, err = _run(["train", "--config", str(path), *short])
    assert status == 0, err
    assert "step 1  lm/train/loss" in out
    assert RunConfig.from_run_record(tmp_path / "runs" / "quickstart").model == config.model


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["train", "tiny_lm", "--config", "tiny_lm"], "give the config once"),
        (["sweep", "--config", "tiny_lm", "a.toml", "b.toml", "--trials", "1"], "takes a CONFIG"),
        (["sweep", "tiny_lm", "--trials", "1"], "takes a CONFIG (a TOML file or a built-in"),
    ],
)
def test_config_arguments_given_twice_or_missing_are_usage_errors(arguments, message, capsys):
    with pytest.raises(SystemExit) as caught:
        main(arguments)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_dew_sweep_takes_a_built_in_config_by_name(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.003]\n')
    arguments = [
        "sweep",
        "--config",
        "tiny_lm",
        str(space),
        "--trials",
        "1",
        "--search",
        "grid",
        "--metric",
        "loss",
        "--checkpoint-dir",
        str(tmp_path),
        "--steps",
        "1",
        "--set",
        "trainer.log_every=1",
        "--quiet",
    ]
    status, out, err = _run(arguments)
    assert status == 0, err
    assert out.splitlines()[-1].startswith("best trial 0  loss ")
    trial = RunConfig.from_run_record(tmp_path / "quickstart" / "trial-0")
    assert trial.model == tiny_lm().model and trial.optim.learning_rate == 0.003


@pytest.fixture
def dew_checks_only(monkeypatch):
    """Switch off the test session's runtime type checker, so the configs' own validation
    runs, as it does for a user without one."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)


def test_trainer_preview_is_a_bool_that_round_trips(dew_checks_only, tmp_path):
    config = override(tiny_lm(), {"trainer.preview": True})
    assert config.trainer.preview is True
    assert "preview = true" in config.to_toml()
    assert RunConfig.from_toml(config.to_toml()) == config
    assert RunConfig.from_dict(config.to_dict()) == config
    for bad in (1, "yes", None):
        with pytest.raises(
            TypeError, match=re.escape(f"trainer.preview must be true or false, got {bad!r}")
        ):
            override(tiny_lm(), {"trainer.preview": bad})
    with pytest.raises(TypeError, match=r"TrainerConfig\.preview must be true or false, got 0"):
        TrainerConfig(preview=0)
    path = tmp_path / "bad.toml"
    path.write_text(config.to_toml().replace("preview = true", 'preview = "yes"'))
    # A wrong type read from a file is the file's problem: a ValueError naming it.
    with pytest.raises(ValueError, match=r"trainer\.preview must be true or false, got 'yes'") as e:
        RunConfig.load(path)
    assert e.value.__notes__ == [f"(in the run config {path})"]


def test_trainer_log_throughput_is_a_bool_on_by_default(dew_checks_only):
    """`dew train` reports throughput unless told not to (decision 0087)."""
    assert TrainerConfig().log_throughput is True
    assert all(builtin(name).trainer.log_throughput for name in BUILTIN_CONFIGS)
    config = override(tiny_lm(), {"trainer.log_throughput": False})
    assert "log_throughput = false" in config.to_toml().splitlines()
    assert RunConfig.from_toml(config.to_toml()) == config
    for bad in (1, "no", None):
        with pytest.raises(
            TypeError, match=re.escape(f"trainer.log_throughput must be true or false, got {bad!r}")
        ):
            override(tiny_lm(), {"trainer.log_throughput": bad})


def _tiny_run(root, **trainer):
    """tiny_lm at CI size for two steps, evaluated at the last one."""
    config = override(
        tiny_lm(),
        {
            "model.kwargs.emb_features": 16,
            "model.kwargs.num_layers": 1,
            "model.kwargs.mlp_features": 32,
            "data.kwargs.num_tokens": 2048,
            "trainer.checkpoint_dir": str(root),
            "trainer.steps": 2,
            "trainer.log_every": 1,
            "trainer.eval_every": 2,
            "trainer.checkpoint_every": None,
        },
    )
    return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, **trainer))


@pytest.mark.slow
def test_the_recipe_previews_into_the_local_run_folder_when_the_config_asks(tmp_path):
    from dew import metrics

    scored = (metrics.perplexity(),)
    _tiny_run(tmp_path, name="quiet").train(metrics=scored, progress=False)
    assert not (tmp_path / "quiet" / "previews").exists()  # tiny_lm's default: no previews
    watched = InMemoryTracker()
    config = _tiny_run(tmp_path, name="shown", preview=True)
    config.train(metrics=scored, tracker=watched, progress=False)
    shown = tmp_path / "shown" / "previews" / "lm" / "validation" / "samples"
    assert sorted(path.name for path in shown.iterdir())
    assert [step for step, _ in watched.artifacts["lm/validation/samples"]] == [2]  # and to it
    # The argument overrides the field: preview=False turns the configured previews off.
    _tiny_run(tmp_path, name="off", preview=True).train(
        metrics=scored, preview=False, progress=False
    )
    assert not (tmp_path / "off" / "previews").exists()


def test_the_recipe_refuses_a_preview_that_is_no_bool(dew_checks_only, tmp_path):
    with pytest.raises(TypeError, match="preview must be None, True or False, got 1"):
        _tiny_run(tmp_path, name="bad").train(preview=1, progress=False)
    assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_a_run_json_written_before_trainer_preview_existed_still_resumes(tmp_path):
    config = _tiny_run(tmp_path, name="old", eval_every=None)
    config.train(progress=False)
    record = tmp_path / "old" / "run.json"
    saved = json.loads(record.read_text())
    del saved["trainer"]["preview"]  # as an earlier dew wrote it
    record.write_text(json.dumps(saved))
    other = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, log_every=2))
    with pytest.raises(ValueError, match="sections that differ: trainer"):
        other.train(progress=False)  # a real difference is still refused (steps is none)
    state = config.train(progress=False)  # the same run: resumes
    assert int(state.step) == 2
