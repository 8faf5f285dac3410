"""Your own registrations where the `dew` command finds them: the modules a run imports
(`trainer.imports`, `--import MODULE`) and the installed `dew.plugins` entry points.

A module that registers models, datasets, objectives or optimizers in `dew.registry` when it is
imported reaches every command two ways:

- named by the run: `trainer.imports = ["my_data"]` in its configuration (`dew train --import
  my_data` adds it there), so its `run.json` records it and `dew eval`, an extension and a
  sweep's rerun import it again without being told;
- installed: a distribution whose `pyproject.toml` declares
  `[project.entry-points."dew.plugins"] my_data = "my_data"` is imported by every command that
  reads a configuration, and by `load_plugins()` in Python.

A module that fails to import is one `RegistrationImportError` naming it, what named it and the
error (its file and line where it raised), which the command prints as one line.
"""

import importlib
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Iterable

__all__ = [
    "PLUGIN_GROUP",
    "RegistrationImportError",
    "check_module_names",
    "check_targets",
    "import_modules",
    "load_plugins",
    "plugin_distributions",
    "resolve_target",
]

PLUGIN_GROUP = "dew.plugins"
"""The entry-point group whose modules register in `dew.registry` when imported."""

_loaded: dict[str, str] = {}  # entry point name -> module, once loaded in this process
_distributions: dict[str, str] = {}  # their distributions' names -> versions


class RegistrationImportError(ImportError):
    """A module named to register pieces in `dew.registry` (an `--import`, a run's
    `trainer.imports`, a `dew.plugins` entry point) that could not be imported: one line
    naming the module, what named it and why."""


def check_module_names(where: str, value: object) -> tuple[str, ...]:
    """`value` as a tuple of dotted module names (`"my_data"`, `"lab.models"`), each once;
    a `TypeError` or `ValueError` naming `where` otherwise."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(
            f'{where} must be a list of module names (e.g. ["my_data"]), got {value!r}.'
        )
    names: list[str] = []
    for name in value:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(
                f"{where} holds {name!r}, which is not a module name: dotted Python "
                "identifiers, as `import` takes them (e.g. 'my_data' or 'lab.models')."
            )
        if name not in names:
            names.append(str.__str__(name))
    return tuple(names)


def _is_target(text: object) -> bool:
    """Whether `text` is `"module:Name"`: a dotted module name, a colon, an identifier."""
    if not isinstance(text, str):
        return False
    module, colon, name = text.partition(":")
    dotted = all(part.isidentifier() for part in module.split("."))
    return bool(colon) and dotted and name.isidentifier()


def check_targets(where: str, value: object) -> tuple[str, ...]:
    """`value` as a tuple of `"module:Name"` strings (`"my_callbacks:EveryHundred"`), in
    order; a `TypeError` or `ValueError` naming `where` and the bad item otherwise. Nothing
    is imported: `resolve_target` does that when the run is built."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(
            f'{where} must be a list of "module:Name" strings (e.g. ["my_callbacks:Every100"]), '
            f"got {value!r}."
        )
    targets = tuple(value)
    for index, target in enumerate(targets):
        if not _is_target(target):
            raise ValueError(
                f'{where}[{index}] is {target!r}, which is not "module:Name": a dotted '
                "module name, a colon and a name defined in it (e.g. 'my_callbacks:Every100')."
            )
    return tuple(str.__str__(target) for target in targets)


def resolve_target(target: str, *, named_by: str) -> object:
    """The object `"module:Name"` names: the module imported as `import_modules` imports
    it (the working directory included), then its attribute `Name`.

    **Raises:** `RegistrationImportError` when the module cannot be imported, and
    `ValueError` when it has no `Name`; both name `target` and `named_by`.
    """
    if not _is_target(target):
        raise ValueError(f'{named_by} holds {target!r}, which is not "module:Name".')
    module, _, name = target.partition(":")
    import_modules([module], named_by=named_by)
    found = getattr(sys.modules[module], name, _MISSING)
    if found is _MISSING:
        raise ValueError(
            f"{named_by} names {target!r}, but the module {module!r} defines no {name!r}."
        )
    return found


_MISSING = object()


def _where_it_raised(error: BaseException) -> str:
    """` (file line N)`: the innermost frame of `error`'s traceback outside importlib, or
    a syntax error's own place; empty when there is none."""
    if isinstance(error, SyntaxError) and error.filename:
        return f" ({error.filename} line {error.lineno})"
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if "importlib" not in frame.filename and frame.filename != __file__
    ]
    return f" ({frames[-1].filename} line {frames[-1].lineno})" if frames else ""


def _failure(what: str, error: BaseException, hint: str) -> RegistrationImportError:
    detail = " ".join(str(error).split()) or "(no message)"
    return RegistrationImportError(
        f"{what} failed to import: {type(error).__name__}: {detail}{_where_it_raised(error)}; "
        f"{hint}."
    )


def _working_directory_importable() -> None:
    """Let a module in the working directory be imported, as `python -m` does (last on
    `sys.path`, so it never hides an installed package)."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def import_modules(modules: Iterable[str], *, named_by: str) -> None:
    """Import each of `modules` (dotted names; a module imported before is not imported
    again), a module in the working directory included. `named_by` says in an error what
    named the module (`"--import"`, `"trainer.imports"`).

    **Raises:** `RegistrationImportError` for the first module that cannot be imported
    (not found, or raising while it runs), naming it, `named_by` and the error.
    """
    names = check_module_names(named_by, modules)
    if names:
        _working_directory_importable()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:
            missing = isinstance(error, ModuleNotFoundError) and error.name == name.split(".")[0]
            hint = (
                "put the folder that holds it on PYTHONPATH, run from that folder, or install it"
                if missing
                else "fix the module"
            )
            raise _failure(f"the module {name!r} ({named_by})", error, hint) from error


def load_plugins() -> dict[str, str]:
    """Import the module of every installed `dew.plugins` entry point (once a process) and
    return `{entry point name: module}` of those loaded. Each registers its pieces in
    `dew.registry` as it is imported.

    **Raises:** `RegistrationImportError` for the first entry point whose module cannot be
    imported, naming the entry point, its distribution and the error.
    """
    for entry in sorted(
        importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda found: found.name
    ):
        if _loaded.get(entry.name) == entry.value:
            continue
        dist = getattr(entry, "dist", None)
        try:
            entry.load()
        except Exception as error:
            owner = f"distribution {dist.name} {dist.version}, " if dist is not None else ""
            what = f"the {PLUGIN_GROUP} entry point {entry.name!r} ({owner}module {entry.value!r})"
            uninstall = f" (pip uninstall {dist.name})" if dist is not None else ""
            raise _failure(what, error, f"fix it or uninstall it{uninstall}") from error
        _loaded[entry.name] = entry.value
        if dist is not None:
            _distributions[dist.name] = dist.version
    return dict(_loaded)


def plugin_distributions() -> dict[str, str]:
    """`{distribution: version}` of the `dew.plugins` entry points `load_plugins` loaded in
    this process (a run records them beside dew's own packages)."""
    return dict(_distributions)
