"""dew._lazy: the packages whose public names are imported on first use (PEP 562) give the
same names as before, type checkers see the same names, and importing them imports no JAX."""

import ast
import importlib
import inspect
import subprocess
import sys

import pytest

LAZY = ("dew", "dew.tracking", "dew.config", "dew.config.sweep", "dew.checkpoints", "dew.registry")


def _type_checking_names(package: str) -> dict[str, str]:
    """Each name the package's `if TYPE_CHECKING:` block imports, and its module."""
    tree = ast.parse(inspect.getsource(importlib.import_module(package)))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    names = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, ast.unparse(node)  # `X as X`: a re-export
            submodule = f"{node.module}.{alias.name}"
            names[alias.name] = submodule if node.module == package else node.module
    return names


@pytest.mark.parametrize("package", LAZY)
def test_the_names_type_checkers_see_are_the_names_the_package_gives(package):
    module = importlib.import_module(package)
    assert _type_checking_names(package) == module._HOMES
    assert set(module.__all__) <= set(module._HOMES)
    for name in module.__all__:
        value = getattr(module, name)
        home = importlib.import_module(module._HOMES[name])
        assert value is (home if home.__name__ == f"{package}.{name}" else getattr(home, name))
        assert name in dir(module)


def test_the_names_come_as_before():
    from dew import Trainer, metrics
    from dew.config import RunConfig
    from dew.tracking import read_journal
    from dew.training import Trainer as Trained

    assert Trainer is Trained and metrics.__name__ == "dew.metrics"
    assert RunConfig.__module__ == "dew.config._config"
    assert read_journal.__module__ == "dew.tracking._journal"


def test_an_unknown_name_is_an_attribute_error_naming_it():
    import dew
    import dew.tracking

    with pytest.raises(AttributeError, match="module 'dew' has no attribute 'Trainr'"):
        dew.Trainr  # noqa: B018
    with pytest.raises(ImportError, match=r"cannot import name 'Journl' from 'dew\.tracking'"):
        from dew.tracking import Journl  # noqa: F401


def test_importing_the_packages_imports_no_jax():
    code = (
        "import sys\n"
        f"for name in {LAZY!r}:\n"
        "    __import__(name)\n"
        "import dew\n"
        "dew.__version__, dew.naming, dew.tracking.read_journal, dew.tracking.Tracker\n"
        "loaded = {name.partition('.')[0] for name in sys.modules}\n"
        "print(sorted(loaded & {'jax', 'jaxlib', 'equinox', 'optax', 'orbax', 'numpy'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"
