"""dew._plugins: the modules a run imports (`trainer.imports`, `dew ... --import MODULE`) and the
installed `dew.plugins` entry points, each registering its pieces in `dew.registry`; and the
`dew` command finding them (a run trained on user registrations evaluated, extended and swept
without being told again)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import tomllib
import uuid

import pytest

from dew import _plugins
from dew._plugins import (
    PLUGIN_GROUP,
    RegistrationImportError,
    check_module_names,
    import_modules,
    load_plugins,
    plugin_distributions,
)
from dew.cli import main
from dew.config import RunConfig, TrainerConfig
from dew.registry import datasets, models

# A module that registers a dataset of 8-bit parity rows (`Rows` read by step) and a small
# MLP: what a user writes to train on their own data from the command.
PARITY = '''
"""Registers the dataset {dataset!r} and the model {model!r}."""
import equinox as eqx
import numpy as np

from dew.data import indexed_dataset
from dew.registry import datasets, models


class Parity:
    def __init__(self, count):
        self.count = count
        self.fingerprint = f"parity-{{count}}"

    def __len__(self):
        return self.count

    def read(self, indices):
        bits = ((np.asarray(indices)[:, None] >> np.arange(8)) & 1).astype(np.float32)
        return {{"inputs": bits, "labels": (bits.sum(1) % 2).astype(np.int32)}}


@datasets.register({dataset!r})
def parity(*, count=256, val_fraction=0.25, batch_size, seed):
    return indexed_dataset(Parity(count), batch=batch_size, seed=seed, val_fraction=val_fraction)


@models.register({model!r})
def mlp(*, width=16, key):
    return eqx.nn.MLP(8, 2, width, 1, key=key)
'''


def _config_toml(dataset, model, *, root, name, imports=()):
    listed = ", ".join(json.dumps(module) for module in imports)
    return textwrap.dedent(
        f"""\
        [model]
        name = "{model}"

        [data]
        name = "{dataset}"

        [objective]
        name = "classifier"

        [objective.kwargs]
        classes = 2

        [optim]
        optimizer = "adam"
        learning_rate = 0.01

        [trainer]
        name = "{name}"
        checkpoint_dir = "{root}"
        steps = 4
        batch_size = 16
        log_every = 2
        eval_every = 4
        checkpoint_every = 4
        imports = [{listed}]
        """
    )


@pytest.fixture
def registering(tmp_path, monkeypatch):
    """A module file in a folder on `sys.path` that registers a dataset and a model under
    fresh names; both names and the module are gone after the test."""
    stem = f"parity_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / f"{stem}.py").write_text(PARITY.format(dataset=stem, model=f"{stem}_mlp"))
    monkeypatch.syspath_prepend(str(folder))
    yield stem
    sys.modules.pop(stem, None)
    for registry, name in ((datasets, stem), (models, f"{stem}_mlp")):
        if name in registry:
            registry.unregister(name)


def _forget(stem):
    """As a new process would start: the module not imported, its names not registered."""
    sys.modules.pop(stem)
    datasets.unregister(stem)
    models.unregister(f"{stem}_mlp")


def test_module_names_are_dotted_identifiers_each_kept_once():
    assert check_module_names("x", ["a", "lab.models", "a"]) == ("a", "lab.models")
    assert check_module_names("x", ()) == ()
    for bad in (["my-data"], ["a..b"], [""], ["a."], [3]):
        with pytest.raises(ValueError, match="is not a module name"):
            check_module_names("trainer.imports", bad)
    with pytest.raises(TypeError, match="must be a list of module names"):
        check_module_names("trainer.imports", "my_data")


def test_trainer_imports_round_trip_through_toml_and_refuse_a_bad_name():
    config = RunConfig.from_toml(_config_toml("d", "m", root="runs", name="r", imports=["a.b"]))
    assert config.trainer.imports == ("a.b",)
    assert RunConfig.from_toml(config.to_toml()) == config
    with pytest.raises(ValueError, match=r"^trainer\.imports holds 'my-data', which is not a"):
        RunConfig.from_toml(_config_toml("d", "m", root="runs", name="r", imports=["my-data"]))
    with pytest.raises(ValueError, match=r"^TrainerConfig\.imports holds 'a b'"):
        TrainerConfig(imports=["a b"])


def test_importing_a_module_registers_its_pieces(registering):
    assert registering not in datasets
    import_modules([registering], named_by="--import")
    assert registering in datasets and f"{registering}_mlp" in models


def test_a_module_in_the_working_directory_imports(tmp_path, monkeypatch):
    stem = f"here_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{stem}.py").write_text("VALUE = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", ".")])
    try:
        import_modules([stem], named_by="--import")
        assert sys.modules[stem].VALUE == 3
        assert sys.path[-1] == str(tmp_path)  # last: it never hides an installed package
    finally:
        sys.modules.pop(stem, None)


def test_a_module_that_cannot_be_imported_is_one_error_naming_it_and_why(tmp_path, monkeypatch):
    with pytest.raises(RegistrationImportError) as missing:
        import_modules(["no_such_module_anywhere"], named_by="--import")
    assert str(missing.value) == (
        "the module 'no_such_module_anywhere' (--import) failed to import: ModuleNotFoundError: "
        "No module named 'no_such_module_anywhere'; put the folder that holds it on "
        "PYTHONPATH, run from that folder, or install it."
    )
    stem = f"broken_{uuid.uuid4().hex[:8]}"
    source = tmp_path / f"{stem}.py"
    source.write_text("import numpy\n\nraise RuntimeError('half written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistrationImportError) as broken:
        import_modules([stem], named_by="trainer.imports")
    assert str(broken.value) == (
        f"the module {stem!r} (trainer.imports) failed to import: RuntimeError: half written "
        f"({source} line 3); fix the module."
    )
    assert stem not in sys.modules


def _distribution(site, name, module, source):
    """An installed distribution as pip leaves one in a target folder: the module, and a
    `.dist-info` holding its metadata and its `dew.plugins` entry point."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n{module} = {module}\n")


@pytest.fixture
def fresh_plugins(monkeypatch):
    monkeypatch.setattr(_plugins, "_loaded", {})
    monkeypatch.setattr(_plugins, "_distributions", {})


def test_load_plugins_imports_every_installed_entry_point_once(
    tmp_path, monkeypatch, fresh_plugins
):
    stem = f"plugin_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    _distribution(site, f"dew-{stem}", stem, PARITY.format(dataset=stem, model=f"{stem}_mlp"))
    monkeypatch.syspath_prepend(str(site))
    try:
        assert load_plugins()[stem] == stem
        assert stem in datasets and f"{stem}_mlp" in models
        assert plugin_distributions()[f"dew-{stem}"] == "0.1"
        load_plugins()  # again: the module is not imported twice (it would register twice)
    finally:
        sys.modules.pop(stem, None)
        for registry, name in ((datasets, stem), (models, f"{stem}_mlp")):
            if name in registry:
                registry.unregister(name)


def test_a_plugin_that_fails_to_import_names_its_entry_point_and_distribution(
    tmp_path, monkeypatch, fresh_plugins
):
    stem = f"plugin_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    _distribution(site, f"dew-{stem}", stem, "import not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(RegistrationImportError) as failed:
        load_plugins()
    assert str(failed.value) == (
        f"the dew.plugins entry point {stem!r} (distribution dew-{stem} 0.1, module {stem!r}) "
        "failed to import: ModuleNotFoundError: No module named 'not_installed_anywhere' "
        f"({site / stem}.py line 1); fix it or uninstall it (pip uninstall dew-{stem})."
    )


def test_a_command_refuses_a_failing_plugin_in_one_line_and_help_loads_none(
    tmp_path, monkeypatch, capsys, fresh_plugins
):
    stem = f"plugin_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    _distribution(site, f"dew-{stem}", stem, "raise ValueError('no')\n")
    monkeypatch.syspath_prepend(str(site))
    assert main(["config", "show", "tiny_lm"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(
        f"dew config show: the dew.plugins entry point {stem!r} (distribution dew-{stem} 0.1"
    )
    with pytest.raises(SystemExit) as shown:
        main(["train", "--help"])
    assert shown.value.code == 0 and stem not in sys.modules
    assert main(["runs", str(tmp_path)]) == 0  # a command that reads no configuration


def test_an_unregistered_name_says_how_the_command_finds_the_user_s_own(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(_config_toml("my_data", "my_mlp", root=tmp_path, name="r"))
    assert main(["train", str(path), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "dew train: no model is registered as 'my_mlp'; registered: "
        "'bidirectional_transformer', 'causal_transformer', 'dit', 'vit'. (a name you register "
        "reaches the command through --import MODULE, the run's trainer.imports, or an "
        "installed dew.plugins entry point)\n"
    )


def test_import_that_fails_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(_config_toml("my_data", "my_mlp", root=tmp_path, name="r"))
    assert main(["train", str(path), "--import", "no_such_module_anywhere"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith("dew train: the module 'no_such_module_anywhere' (--import) failed")
    assert not (tmp_path / "r").exists()  # refused before anything is written


@pytest.mark.slow  # five short fits and two evaluations, in process: about 20 s
def test_a_run_on_registrations_from_import_is_evaluated_extended_and_swept_untold(
    tmp_path, registering, capsys
):
    path = tmp_path / "run.toml"
    path.write_text(_config_toml(registering, f"{registering}_mlp", root=tmp_path, name="flag"))
    assert main(["train", str(path), "--import", registering, "--quiet"]) == 0
    folder = tmp_path / "flag"
    recorded = json.loads((folder / "run.json").read_text())
    assert recorded["trainer"]["imports"] == [registering]
    capsys.readouterr()

    _forget(registering)  # each later command finds the registrations through run.json
    assert main(["eval", str(folder)]) == 0
    assert capsys.readouterr().out.startswith("step 4  accuracy ")
    _forget(registering)
    assert main(["train", str(folder), "--steps", "6", "--quiet"]) == 0  # an extension
    assert RunConfig.load(folder).trainer.steps == 6
    capsys.readouterr()  # the extension's end-of-run summary
    _forget(registering)
    assert main(["config", "show", str(folder)]) == 0
    assert tomllib.loads(capsys.readouterr().out)["trainer"]["imports"] == [registering]

    # The same run configured in TOML (`trainer.imports`) records the same truth.
    named = tmp_path / "named.toml"
    named.write_text(
        _config_toml(
            registering,
            f"{registering}_mlp",
            root=tmp_path,
            name="named",
            imports=[registering],
        )
    )
    _forget(registering)
    assert main(["train", str(named), "--quiet"]) == 0
    assert json.loads((tmp_path / "named" / "run.json").read_text())["trainer"]["imports"] == [
        registering
    ]
    _forget(registering)
    assert main(["eval", str(tmp_path / "named")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("step 4  accuracy ")

    # A sweep told once: its rerun (a larger budget) finds the modules in its ledger.
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.01, 0.003]\n')
    sweep = ["sweep", str(path), str(space), "--search", "grid", "--name", "lr", "--quiet"]
    _forget(registering)
    assert main([*sweep, "--trials", "1", "--import", registering]) == 0
    _forget(registering)
    assert main([*sweep, "--trials", "2"]) == 0
    for index in (0, 1):
        trial = json.loads((tmp_path / "lr" / f"trial-{index}" / "run.json").read_text())
        assert trial["trainer"]["imports"] == [registering]


@pytest.mark.slow  # pip builds and installs a distribution, then two dew subprocesses: ~40 s
def test_dew_train_finds_an_installed_plugin_s_dataset_and_records_its_distribution(tmp_path):
    stem = f"dew_parity_{uuid.uuid4().hex[:8]}"
    package = tmp_path / "package"
    (package / "src" / stem).mkdir(parents=True)
    (package / "src" / stem / "__init__.py").write_text(
        PARITY.format(dataset="parity", model="parity_mlp")
    )
    (package / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{stem.replace("_", "-")}"
            version = "0.3"

            [project.entry-points."dew.plugins"]
            parity = "{stem}"
            """
        )
    )
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    installed = subprocess.run(
        [*pip, "--no-index", "--quiet", "--target", str(site), str(package)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    assert installed.returncode == 0, installed.stderr
    shutil.rmtree(package)  # what runs is the installed copy
    config = tmp_path / "run.toml"
    config.write_text(_config_toml("parity", "parity_mlp", root=tmp_path / "runs", name="p"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), _src()])}

    def dew(*arguments):
        return subprocess.run(
            [sys.executable, "-m", "dew", *arguments],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
        )

    trained = dew("train", str(config), "--quiet")
    assert trained.returncode == 0, trained.stderr
    record = json.loads((tmp_path / "runs" / "p" / "run.json").read_text())
    assert record["packages"][stem.replace("_", "-")] == "0.3"
    assert record["trainer"]["imports"] == []  # installed: found by every command, untold
    scored = dew("eval", str(tmp_path / "runs" / "p"))
    assert scored.returncode == 0 and scored.stdout.startswith("step 4  accuracy "), scored.stderr

    (site / stem / "__init__.py").write_text("import numpy\nraise ImportError('gone')\n")
    broken = dew("eval", str(tmp_path / "runs" / "p"))
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1
    assert broken.stderr.startswith(
        f"dew eval: the dew.plugins entry point 'parity' (distribution "
        f"{stem.replace('_', '-')} 0.3, module {stem!r}) failed to import: ImportError: gone ("
    )


def _src() -> str:
    """The folder this checkout's `dew` package is imported from."""
    import dew

    return str(pathlib.Path(dew.__file__).parents[1])
