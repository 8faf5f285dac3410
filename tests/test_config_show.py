"""`dew config show`: a configuration back as the TOML `dew train FILE` reads, for every built-in
configuration and for a run folder; `RunConfig.load` of a run folder; run.json's section names."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.cli import main
from dew.cli._inputs import _configure
from dew.cli._parser import _parser
from dew.config import BUILTIN_CONFIGS, RunConfig, builtin, override
from dew.config._recipe import _check_same_run, _record
from dew.telemetry.records import RunRecord, record_from_dict


def _show(*arguments):
    """`dew config show ARGUMENTS`'s exit status and standard output, in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["config", "show", *map(str, arguments)])
    return code, out.getvalue()


def _as_dew_train_reads_it(path, *options):
    """The configuration `dew train PATH OPTIONS` trains: its own parser and loader."""
    return _configure(_parser().parse_args(["train", str(path), *options]))


@pytest.mark.parametrize("name", BUILTIN_CONFIGS)
def test_every_builtin_configuration_round_trips_through_config_show(name, tmp_path):
    code, text = _show(name)
    assert code == 0
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    assert RunConfig.load(path) == builtin(name)
    assert _as_dew_train_reads_it(path) == builtin(name)
    assert text == builtin(name).to_toml()


def test_config_show_defaults_to_tiny_lm_and_applies_the_train_overrides(tmp_path):
    assert _show() == (0, builtin("tiny_lm").to_toml())
    assert "log_throughput = true" in _show()[1].splitlines()  # dew train reports it by default
    arguments = ("--set", "optim.learning_rate=0.01", "--name", "lr", "--steps", 7)
    arguments += ("--set", "trainer.log_throughput=false")
    code, text = _show("tiny_lm", *arguments, "--on-nonfinite", "continue")
    expected = override(
        builtin("tiny_lm"),
        {
            "optim.learning_rate": 0.01,
            "trainer.name": "lr",
            "trainer.steps": 7,
            "trainer.on_nonfinite": "continue",
            "trainer.log_throughput": False,
        },
    )
    assert code == 0 and RunConfig.from_toml(text) == expected
    assert 'on_nonfinite = "continue"' in text.splitlines()
    assert "log_throughput = false" in text.splitlines()


def test_config_show_of_a_toml_file_prints_the_file_s_configuration(tmp_path):
    path = tmp_path / "run.toml"
    config = override(builtin("tiny_lm"), {"optim.clipping": 1.0, "trainer.eval_every": None})
    config.dump_toml(path)
    code, text = _show(path)
    assert code == 0 and RunConfig.from_toml(text) == config


def test_config_show_names_what_it_cannot_show(tmp_path, capsys):
    assert main(["config", "show", str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err
    assert "nowhere" in error and "tiny_lm, tiny_diffusion" in error
    run_json = tmp_path / "old" / "run.json"
    run_json.parent.mkdir()
    run_json.write_text(json.dumps({"type": "fit_ended", "status": "completed", "step": 1}))
    assert main(["config", "show", str(run_json.parent)]) == 2
    assert "holds a 'fit_ended' record, not a run_record" in capsys.readouterr().err


def test_config_show_refuses_a_none_it_cannot_write_and_names_its_path(tmp_path, capsys):
    folder = tmp_path / "lib-run"
    folder.mkdir()
    config = override(builtin("tiny_lm"), {"model.kwargs.dtype": None})
    (folder / "run.json").write_text(RunRecord(**config.to_dict()).to_json())
    assert RunConfig.load(folder) == config  # the JSON holds it: only TOML cannot
    assert main(["config", "show", str(folder)]) == 2
    assert "model.kwargs.dtype is None, which TOML cannot hold" in capsys.readouterr().err


# -- a run folder --------------------------------------------------------------------------


SMALL = {
    "model.kwargs.num_layers": 1,
    "model.kwargs.emb_features": 16,
    "model.kwargs.mlp_features": 16,
    "data.kwargs.num_tokens": 2048,
    "trainer.batch_size": 4,
}


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A two-step run of a shrunk tiny_lm, trained by `dew train` in this process."""
    root = tmp_path_factory.mktemp("runs")
    arguments = ["train", "--name", "shown", "--steps", 2, "--checkpoint-dir", root, "--quiet"]
    for path, value in SMALL.items():
        arguments += ["--set", f"{path}={value}"]
    assert main(list(map(str, arguments))) == 0
    return root / "shown"


def test_a_run_folder_round_trips_through_config_show(run_folder, tmp_path):
    trained = override(
        builtin("tiny_lm"),
        {
            **SMALL,
            "trainer.name": "shown",
            "trainer.steps": 2,
            "trainer.checkpoint_dir": str(run_folder.parent),
        },
    )
    assert RunConfig.from_run_record(run_folder) == trained
    for given_as in (run_folder, run_folder / "run.json"):
        assert RunConfig.load(given_as) == trained
        code, text = _show(given_as)
        assert code == 0
        path = tmp_path / "shown.toml"
        path.write_text(text, encoding="utf-8")
        assert RunConfig.load(path) == trained
        assert _as_dew_train_reads_it(path) == trained
    assert _as_dew_train_reads_it(run_folder) == trained  # dew train RUN_FOLDER: the same run


def test_a_new_run_json_names_its_sections_as_run_config_does(run_folder):
    saved = json.loads((run_folder / "run.json").read_text())
    assert {"model", "data", "optim", "trainer", "objective"} <= set(saved)
    assert "optimizer" not in saved
    assert saved["optim"] == builtin("tiny_lm").optim.to_dict()


def _old_style(folder, config):
    """A run.json as dew wrote it before `optimizer` became `optim`, by hand."""
    plain = config.to_dict()
    saved = {
        "type": "run_record",
        "model": plain["model"],
        "data": plain["data"],
        "optimizer": plain["optim"],
        "trainer": plain["trainer"],
        "objective": plain["objective"],
        "packages": {"dew-ml": "0.1.0"},
    }
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(saved, sort_keys=True))


def test_an_old_run_folder_that_says_optimizer_still_reads(tmp_path):
    config = override(builtin("tiny_lm"), {"optim.learning_rate": 0.01, "trainer.name": "old"})
    folder = tmp_path / "old"
    _old_style(folder, config)
    # Read back located where the folder is (decision 0031), not at the recorded `runs/old`.
    here = override(config, {"trainer.checkpoint_dir": str(tmp_path)})
    assert RunConfig.from_run_record(folder) == here
    assert RunConfig.load(folder / "run.json") == here
    code, text = _show(folder)
    assert code == 0 and RunConfig.from_toml(text) == here
    _check_same_run(folder, _record(config))  # the same run: it resumes
    other = override(config, {"optim.learning_rate": 0.02})
    with pytest.raises(ValueError, match=r"sections that differ: optim\)"):
        _check_same_run(folder, _record(other))


def test_an_old_run_record_in_a_journal_still_reads():
    old = {"type": "run_record", "model": {"name": "a"}, "data": {}, "optimizer": {"lr": 0.1}}
    assert record_from_dict(old) == RunRecord(model={"name": "a"}, data={}, optim={"lr": 0.1})
    both = {**old, "optim": {"lr": 0.2}}
    with pytest.raises(ValueError, match=r"unknown fields \['optimizer'\]"):
        record_from_dict(both)  # never one silently dropped


# -- the law: a configuration round-trips through TOML ------------------------------------

positive = st.floats(1e-12, 1e6, allow_nan=False)
counts = st.integers(1, 2**31)
segments = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,8}", fullmatch=True).filter(
    lambda text: text not in {".", ".."}
)
plain = st.recursive(
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(min_size=1, max_size=4).filter(lambda key: "." not in key), inner)
    ),
    max_leaves=6,
)
FIELDS = {
    "optim.learning_rate": positive,
    "optim.weight_decay": st.floats(0, 1),
    "optim.clipping": st.none() | positive,
    "optim.schedule": st.sampled_from(("constant", "cosine", "linear")),
    "optim.optimizer": st.sampled_from(("adam", "adamw", "sgd")),
    "optim.kwargs": st.dictionaries(st.sampled_from(("b1", "b2", "eps")), positive, max_size=2),
    "trainer.name": st.none() | st.lists(segments, min_size=1, max_size=3).map("/".join),
    "trainer.checkpoint_dir": st.text(min_size=1, max_size=8).filter(str.strip),
    "trainer.steps": counts,
    "trainer.batch_size": counts,
    "trainer.log_every": counts,
    "trainer.eval_every": st.none() | counts,
    "trainer.checkpoint_every": st.none() | counts,
    "trainer.seed": st.integers(0, 2**32 - 1),
    "trainer.preview": st.booleans(),
    "trainer.train_reduction": st.sampled_from(["mean", "last"]),
    "trainer.log_optimizer": st.booleans(),
    "trainer.log_throughput": st.booleans(),
    "trainer.on_nonfinite": st.sampled_from(["raise", "continue"]),
    "trainer.strategy": st.sampled_from(["data", "fsdp"]),
}


@st.composite
def builtin_overrides(draw):
    """A built-in configuration with random valid overrides: of the typed fields, and of the
    keys its model, data and objective kwargs hold (any TOML-writable value)."""
    config = builtin(draw(st.sampled_from(BUILTIN_CONFIGS)))
    paths = sorted(FIELDS) + [
        f"{section}.kwargs.{key}"
        for section in ("model", "data", "objective")
        for key in getattr(config, section).kwargs
    ]
    point = {}
    for path in draw(st.lists(st.sampled_from(paths), unique=True, max_size=6)):
        point[path] = draw(FIELDS.get(path, plain))
    if point.get("trainer.steps", config.trainer.steps) < config.optim.warmup_steps:
        point["trainer.steps"] = config.optim.warmup_steps
    return override(config, point)


@settings(max_examples=60, deadline=None)
@given(builtin_overrides())
def test_an_overridden_builtin_configuration_round_trips_through_toml(config):
    text = config.to_toml()
    assert RunConfig.from_toml(text) == config
    assert RunConfig.from_toml(text).to_toml() == text


# -- the real command ----------------------------------------------------------------------


@pytest.mark.slow
def test_config_show_piped_into_a_file_trains_with_dew_train(tmp_path):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    dew = f"{sys.executable} -m dew.cli"
    shown = subprocess.run(
        f"{dew} config show tiny_lm > run.toml && {dew} train run.toml --steps 2 --quiet",
        shell=True,
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr
    trained = RunConfig.from_run_record(tmp_path / "runs" / "quickstart")
    # run.json records local paths absolute (decision 0031): the run's folder is where it is
    where = {"trainer.steps": 2, "trainer.checkpoint_dir": str(tmp_path / "runs")}
    assert trained == override(builtin("tiny_lm"), where)
    assert RunConfig.load(tmp_path / "run.toml") == builtin("tiny_lm")
