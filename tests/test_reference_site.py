"""The API reference site (mkdocs.yml, docs/reference/) covers every public module, and every
public module, class, function and method has a docstring to render.

`mkdocs build --strict` (`.ci/run`) renders the pages and fails on a broken link or anchor;
these checks need no mkdocs: a module with no page, a page the nav leaves out, or a public
object with no docstring (which the site would leave out silently) fails here.
"""

import importlib
import inspect
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
# The optional extras a public module imports at import time (as in test_docstrings.py).
EXTRAS = {"tensorboard", "mlflow", "wandb", "optuna", "matplotlib", "orbax", "tensorboardX"}
# Decision records are reached from decisions/README.md, not the nav (mkdocs.yml's not_in_nav).
NOT_IN_NAV = re.compile(r"decisions/0\d{3}-[a-z0-9-]+\.md")
# What `@dataclass` writes into a class without a docstring: its name and signature.
GENERATED_DOC = r"{name}\(.*\)"


def public_modules() -> list[str]:
    """Every module of src/dew whose dotted name has no part starting with `_`."""
    src = ROOT / "src"
    names = []
    for path in sorted((src / "dew").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            names.append(".".join(parts))
    return names


def nav_pages() -> list[str]:
    """The page paths mkdocs.yml's nav lists (`- Title: path.md` or `- path.md`)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text.split("\nnav:\n", 1)[1]
    return re.findall(r"^\s*- (?:[^\n:]+: )?(\S+\.md)$", nav, re.MULTILINE)


def test_every_public_module_has_a_reference_page_and_no_other():
    modules = public_modules()
    assert {"dew", "dew.training", "dew.metrics", "dew.nn.backbones.vit"} <= set(modules)
    pages = {path.stem for path in REFERENCE.glob("*.md")}
    assert sorted(set(modules) - pages) == [], "public modules with no docs/reference/ page"
    assert sorted(pages - set(modules)) == [], "reference pages of no public module"


@pytest.mark.parametrize("module", public_modules())
def test_a_reference_page_renders_its_module(module):
    text = (REFERENCE / f"{module}.md").read_text()
    assert re.search(rf"^::: {re.escape(module)}$", text, re.MULTILINE), text


def test_the_nav_lists_every_page():
    listed = nav_pages()
    assert len(listed) == len(set(listed)), "a page listed twice"
    for module in public_modules():
        assert f"reference/{module}.md" in listed, f"the nav leaves out {module}'s page"
    pages = [path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")]
    unlisted = sorted(
        page for page in pages if page not in listed and not NOT_IN_NAV.fullmatch(page)
    )
    assert unlisted == [], "docs pages the nav leaves out"


def _import(name):
    try:
        return importlib.import_module(name)
    except ImportError as error:
        if error.name and error.name.split(".")[0] in EXTRAS:
            pytest.skip(f"{name} needs the optional {error.name}")
        raise


def _public_names(module) -> list[str]:
    """`__all__`, or the classes and functions a module without one defines."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    ]


def _class_doc(cls) -> str:
    doc = (cls.__dict__.get("__doc__") or "").strip()
    return "" if re.fullmatch(GENERATED_DOC.format(name=re.escape(cls.__name__)), doc) else doc


def _function(member):
    """The function behind a method, static or class method, or property (else None)."""
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if isinstance(member, property):
        member = member.fget
    return member if inspect.isfunction(member) else None


def _method_doc(cls, attribute: str) -> str:
    """The docstring of `cls`'s method, its own or the nearest base's that defines one, as
    `help()` shows it; builtins' slot docstrings ("Call self as a function.") do not count."""
    for base in cls.__mro__:
        function = _function(vars(base).get(attribute))
        if base.__module__ != "builtins" and function is not None and function.__doc__:
            return inspect.cleandoc(function.__doc__)
    return ""


def undocumented(module) -> list[str]:
    """The public objects of `module` with no docstring: the module itself, its classes
    and functions, and the public methods and properties its classes define (a method's
    docstring may be inherited, as `help()` shows it)."""
    missing = [] if (module.__doc__ or "").strip() else [module.__name__]
    for name in _public_names(module):
        value = getattr(module, name)
        path = f"{module.__name__}.{name}"
        if inspect.isclass(value):
            if not _class_doc(value):
                missing.append(path)
            for attribute, member in vars(value).items():
                if attribute.startswith("_") and attribute != "__call__":
                    continue
                if _function(member) is not None and not _method_doc(value, attribute):
                    missing.append(f"{path}.{attribute}")
        elif (inspect.isfunction(value) or inspect.isroutine(value)) and not inspect.getdoc(value):
            missing.append(path)
    return missing


@pytest.mark.parametrize("name", public_modules())
def test_every_public_object_has_a_docstring(name):
    missing = undocumented(_import(name))
    assert missing == [], f"public objects with no docstring: {missing}"


def test_a_missing_docstring_is_found(tmp_path, monkeypatch):
    (tmp_path / "undocumented_example.py").write_text(
        '"""A module."""\n\n'
        "import dataclasses\n\n"
        "import equinox as eqx\n\n"
        '__all__ = ["Layer", "Plain", "Record", "function"]\n\n\n'
        "class Layer(eqx.Module):\n"
        "    width: int\n\n"
        "    def __call__(self, x):\n"
        "        return x\n\n\n"
        "class Plain:\n"
        "    def method(self):\n"
        "        pass\n\n\n"
        "@dataclasses.dataclass\n"
        "class Record:\n"
        "    x: int\n\n\n"
        "def function():\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("undocumented_example")
    assert undocumented(module) == [
        "undocumented_example.Layer",
        "undocumented_example.Layer.__call__",
        "undocumented_example.Plain",
        "undocumented_example.Plain.method",
        "undocumented_example.Record",
        "undocumented_example.function",
    ]


def test_ci_builds_the_site_strictly_beside_the_slow_tests_and_fails_with_it():
    """`.ci/run` installs the docs extra, starts the strict build in the background, runs
    the slow and parity tests, then waits for the build: either failing fails the script."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    install = ci.index('python -m pip install --quiet ".[parity,docs,types]"')
    build = next(
        number
        for number, line in enumerate(ci)
        if line.startswith('mkdocs build --strict --site-dir "$scratch/site"')
    )
    tests = ci.index('python -m pytest -m "slow or parity" || tests=$?')
    waited = ci.index('wait "$mkdocs_pid" || docs=$?')
    failed = next(number for number, line in enumerate(ci) if '"$docs" -ne 0' in line)
    assert install < build < tests < waited < failed
    assert ci[failed + 2].strip() == "exit 1"
    assert "set -euo pipefail" in ci
