"""The examples in dew's docstrings run as doctests against the installed package."""

import doctest
import importlib
import pkgutil

import pytest

import dew

EXTRAS = {"tensorboard", "mlflow", "wandb", "optuna", "matplotlib", "orbax", "tensorboardX"}


def _modules():
    names = [dew.__name__]
    for info in pkgutil.walk_packages(dew.__path__, prefix="dew."):
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        if error.name and error.name.split(".")[0] in EXTRAS:
            pytest.skip(f"{name} needs the optional {error.name}")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs=dict(vars(module))):
        if test.examples:
            runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} docstring examples failed in {name}"


def test_the_docstrings_hold_examples():
    import dew.naming

    tests = doctest.DocTestFinder().find(dew.naming)
    assert sum(len(test.examples) for test in tests) >= 5
