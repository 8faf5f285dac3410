"""Every Python example in README.md and docs/ runs, and prints what the page shows.

A page's examples run in order in one namespace, as a reader would run them. A
```text block right after a ```python block is that example's expected output.
An HTML comment `<!-- xfail: reason -->` right before a block marks it as
expected to fail until the named work lands (strict: it must then fail).
"""

import contextlib
import io
import pathlib
import re

import pytest
from conftest import registrations, restore_registrations

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"(?:<!-- xfail: (?P<xfail>.*?) -->\n)?```python\n(?P<code>.*?)```\n"
    r"(?:\s*```text\n(?P<output>.*?)```\n)?",
    re.DOTALL,
)


def _examples():
    for page in PAGES:
        for index, match in enumerate(BLOCK.finditer(page.read_text())):
            yield page, index, match


def _params():
    params = []
    for page, index, match in _examples():
        marks = []
        if match["xfail"]:
            marks.append(pytest.mark.xfail(reason=match["xfail"], raises=ImportError, strict=True))
        name = f"{page.relative_to(ROOT)}::{index}"
        params.append(pytest.param(page, index, id=name, marks=marks))
    return params


_namespaces: dict[pathlib.Path, tuple[dict, int]] = {}
# A page's registrations (a module it imports registers names once), put back before each of
# its examples: the test-wide fixture takes them away after each test.
_registered: dict[pathlib.Path, dict] = {}


def _run(code: str, namespace: dict, name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), namespace)
    return out.getvalue()


def _normalised(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@pytest.mark.parametrize(("page", "index"), _params())
def test_example(page, index, tmp_path_factory, monkeypatch):
    examples = [match for p, _, match in _examples() if p == page]
    workdir = tmp_path_factory.getbasetemp() / "docs" / page.stem
    workdir.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(workdir)
    namespace, done = _namespaces.get(page, ({"__name__": f"docs_{page.stem}"}, 0))
    if page in _registered:
        restore_registrations(_registered[page])
    for earlier in range(done, index):
        if not examples[earlier]["xfail"]:
            _run(examples[earlier]["code"], namespace, f"{page.name}::{earlier}")
    _namespaces[page] = (namespace, index)
    example = examples[index]
    scope = dict(namespace) if example["xfail"] else namespace
    try:
        printed = _run(example["code"], scope, f"{page.name}::{index}")
    finally:
        _registered[page] = registrations()
    if not example["xfail"]:
        _namespaces[page] = (namespace, index + 1)
    if example["output"] is not None:
        assert _normalised(printed) == _normalised(example["output"])


def test_the_pages_hold_examples():
    assert sum(1 for _ in _examples()) >= 8
