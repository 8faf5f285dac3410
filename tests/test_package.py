"""The package's shape: what importing dew loads, the README's commands, CI, ruff."""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
OPTIONAL = [
    "tensorboard",
    "tensorboardX",
    "mlflow",
    "wandb",
    "optuna",
    "matplotlib",
    "orbax",
    "tokenizers",
    "sentencepiece",
    "PIL",
    "safetensors",
    "tomli_w",
    "hypothesis",
    "datasets",
    "pyarrow",
    "torch",
    "tensorflow",
]


def _readme_commands():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1]
    block = re.search(r"```sh\n(.*?)```", quick_start, re.DOTALL)
    assert block, "the Quick start section has no fenced sh block"
    return block.group(1).strip().splitlines()


def test_importing_dew_imports_no_optional_extra():
    code = (
        "import sys, dew, dew.naming, dew.events, dew.tracking, dew.telemetry.records, "
        "dew.supervised\n"
        f"loaded = sorted(name for name in {OPTIONAL!r} if name in sys.modules)\n"
        "print(','.join(loaded))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_quick_start_holds_exactly_the_two_commands():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    main_job, tests = commands
    assert "pip install" in main_job
    assert "dew train" in main_job
    assert '".[test]"' in tests
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command_exactly():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in ci
    assert "set -euo pipefail" in ci
    # The README's command leaves the slow and parity tests out; CI runs them after it.
    slow = ci.index('python -m pytest -m "slow or parity" || tests=$?')
    assert slow > ci.index(_readme_commands()[1])


def test_the_quick_start_is_the_first_sh_block():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)```", readme, re.DOTALL)
    assert first.group(1).strip().splitlines() == _readme_commands()
    assert readme.index("## Quick start") < first.start()


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed by the test extra")
def test_ruff_is_clean():
    check = subprocess.run(["ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    form = subprocess.run(["ruff", "format", "--check", str(ROOT)], capture_output=True, text=True)
    assert form.returncode == 0, form.stdout + form.stderr


def test_the_package_is_typed():
    import dew

    assert (pathlib.Path(dew.__file__).parent / "py.typed").exists()
