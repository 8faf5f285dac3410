"""A run's identity: its configuration, not where its folder is (decision 0031).

A run folder's run.json and a sweep's ledger record the configuration they were started with;
a rerun resumes them only when its configuration is the same run. Two things in a
configuration say where rather than what:

- `trainer.checkpoint_dir` and `trainer.name`: where the run's folder is. A folder moved, or
  reached by a relative path once and an absolute one the next time, is the same run; they
  are left out of the comparison (`LOCATION`).
- `trainer.imports`: the modules that register the names the configuration uses. Where a
  name comes from is not what the run is (the names are), and a run trained from Python is
  extended from the command with `--import` (`REGISTRATIONS`).
- `trainer.log_throughput`: whether the log steps report the training speed, wall-clock
  measurements that change nothing the run trains; a rerun that turns them off or on is the
  same run (`REPORTING`, decision 0087).
- `data.kwargs.cache_dir`: where a source keeps a cache it builds from its files (`text`'s
  token cache, `image_folder`'s decoded images). The cache is keyed by what it holds, so a
  run pointed at another cache folder reads the same rows (`CACHE`).
- Local file paths among the sections' keyword arguments (a dataset's `path`): relative ones
  mean another file from another working directory. The recipe records them absolute
  (`absolute_paths`), with the path as given beside it for display, and a comparison reads
  every local path absolute.

A keyword argument is a local path when its builder's parameter is annotated with
`os.PathLike` or a `pathlib` path (`path: str | os.PathLike`, or a list of them:
`paths: Sequence[str | os.PathLike]`, each entry a path), or when it is named `path` or
`*_path`; a value with `://` (a URI) is not a local path.
"""

import dataclasses
import inspect
import os
import pathlib
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dew import _registry
from dew.config._data import datasets

if TYPE_CHECKING:
    from dew.config._config import RunConfig

__all__ = ["CACHE", "LOCATION", "REGISTRATIONS", "REPORTING", "absolute_paths", "comparable"]

LOCATION = ("checkpoint_dir", "name")
"""The trainer fields that say where a run's folder is, which no comparison reads."""
REGISTRATIONS = ("imports",)
"""The trainer field that says which modules register the names a run uses: no comparison
reads it either."""
REPORTING = ("log_throughput",)
"""The trainer field that says whether the log steps time the training: what is reported, not
what is trained, so no comparison reads it."""
CACHE = "cache_dir"
"""The data keyword argument that says where a source keeps its cache, which no comparison
reads."""

_BUILDERS: dict[str, Callable[[str], Any]] = {
    "model": lambda name: _registry.models[name],
    "data": datasets.builder,
    "objective": lambda name: _registry.objectives[name],
}


def _annotated_path(annotation: Any) -> bool:
    """Whether `annotation` (or a member of its union) is `os.PathLike` or a pathlib path."""
    if annotation is os.PathLike or typing.get_origin(annotation) is os.PathLike:
        return True
    # os.PathLike is runtime-checkable: its __subclasshook__ looks for `__fspath__`.
    if isinstance(annotation, type) and issubclass(annotation, pathlib.PurePath | os.PathLike):  # pyright: ignore[reportGeneralTypeIssues]
        return True
    return any(_annotated_path(member) for member in typing.get_args(annotation))


def _path_parameters(section: str, name: Any) -> frozenset[str]:
    """The parameters of the builder `section` names that its annotations declare paths
    (none when it is not registered here or its signature cannot be read)."""
    lookup = _BUILDERS.get(section)
    if lookup is None or not isinstance(name, str):
        return frozenset()
    try:
        signature = inspect.signature(lookup(name), eval_str=True)
    except (KeyError, TypeError, ValueError, NameError):
        return frozenset()
    return frozenset(
        parameter.name
        for parameter in signature.parameters.values()
        if _annotated_path(parameter.annotation)
    )


def _is_relative_path(value: Any) -> bool:
    return (
        isinstance(value, str) and bool(value) and "://" not in value and not os.path.isabs(value)
    )


def _absolute_kwargs(section: str, plain: Any) -> tuple[Any, dict[str, str]]:
    """A section's plain data with its local paths absolute (a list of them, such as
    `text`'s `paths`, each), and the relative ones as given, keyed by their dotted path
    (`data.kwargs.paths[0]` for a list's)."""
    if not isinstance(plain, Mapping) or not isinstance(plain.get("kwargs"), Mapping):
        return plain, {}
    declared = _path_parameters(section, plain.get("name"))
    kwargs, given = dict(plain["kwargs"]), {}
    for key, value in plain["kwargs"].items():
        if key not in declared and key != "path" and not key.endswith("_path"):
            continue
        where = f"{section}.kwargs.{key}"
        if _is_relative_path(value):
            kwargs[key] = os.path.abspath(value)
            given[where] = value
        elif isinstance(value, list | tuple) and any(map(_is_relative_path, value)):
            kwargs[key] = [
                os.path.abspath(item) if _is_relative_path(item) else item for item in value
            ]
            given.update(
                {
                    f"{where}[{index}]": item
                    for index, item in enumerate(value)
                    if _is_relative_path(item)
                }
            )
    return {**plain, "kwargs": kwargs}, given


def absolute_paths(config: "RunConfig") -> tuple["RunConfig", dict[str, str]]:
    """`config` with every relative local path among its sections' keyword arguments made
    absolute (against the working directory), and those paths as given, by dotted path
    (`{"data.kwargs.path": "licenses.npy"}`)."""
    plain, given = config.to_dict(), {}
    for section in _BUILDERS:
        plain[section], found = _absolute_kwargs(section, plain[section])
        given.update(found)
    if not given:
        return config, {}
    return type(config).from_dict(plain), given


def _trainer_defaults() -> dict[str, Any]:
    """Every `TrainerConfig` field's default, as `to_dict` writes it."""
    from dew.config._fields import _thaw
    from dew.config._sections import TrainerConfig

    return {
        field.name: _thaw(field.default)
        for field in dataclasses.fields(TrainerConfig)
        if field.init and field.default is not dataclasses.MISSING
    }


def comparable(
    plain: Mapping[str, Any],
    *,
    ignoring: tuple[str, ...] = (*LOCATION, *REGISTRATIONS, *REPORTING),
) -> dict[str, Any]:
    """The sections of a recorded configuration (`RunConfig.to_dict`'s shape) as compared:
    the trainer fields `ignoring` left out, every local path absolute."""
    result = {}
    for section, value in plain.items():
        if section == "trainer" and isinstance(value, Mapping):
            value = {**_trainer_defaults(), **value}  # a field added since reads as its default
            value = {key: item for key, item in value.items() if key not in ignoring}
        if section == "data" and isinstance(value, Mapping):
            kwargs = value.get("kwargs")
            if isinstance(kwargs, Mapping) and CACHE in kwargs:
                kept = {key: item for key, item in kwargs.items() if key != CACHE}
                value = {**value, "kwargs": kept}
        result[section], _ = _absolute_kwargs(section, value)
    return result
