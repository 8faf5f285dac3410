"""Reading the user's input: the config and its overrides, errors naming the file they came
from, and printing on process zero alone."""

import argparse
import contextlib
import os
import sys
import tomllib
from collections.abc import Iterator, Mapping
from typing import Any

from dew.cli._errors import _message


def _say(*values: Any, **options: Any) -> None:
    """`print` on process zero only: the other processes of a run stay quiet. A process
    that has not imported JAX has joined no multi-process run (joining imports it), so it
    is process zero, and a command that computes nothing (`dew plot`) prints without JAX."""
    if "jax" not in sys.modules:
        print(*values, **options)
        return
    from dew._processes import is_process_zero

    if is_process_zero():
        print(*values, **options)


class _BadInputError(ValueError):
    """A TypeError or KeyError dew's validation raised while reading the user's files and
    options: user-caused, unlike the same types raised while training (bugs)."""


@contextlib.contextmanager
def _reading(path: str | None = None) -> Iterator[None]:
    """Turn dew's TypeError and KeyError about the user's input into `_BadInputError`, naming
    the file `path` it came from."""
    try:
        yield
    except (TypeError, KeyError, ValueError) as error:
        if path is not None and path not in _message(error):
            error.add_note(f"(in {path})")
        if isinstance(error, ValueError):
            raise
        raise _BadInputError(_message(error)) from error


def _toml_value(text: str, where: str) -> Any:
    from dew.config._toml import loads_toml

    try:
        return loads_toml(f"value = {text}", f"--set {where}")["value"]
    except ValueError as error:
        if isinstance(error.__cause__, tomllib.TOMLDecodeError):
            return text  # a bare word is a string: --set optim.optimizer=sgd
        raise


def _config_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Settle `args.config` (and a sweep's `args.space`) from the positional arguments and
    `--config`, which names the config instead of the first positional one."""
    option = getattr(args, "config_option", None)
    if args.command == "sweep":
        given = [value for value in (option, args.config, args.space) if value is not None]
        if len(given) != 2:
            parser.error(
                "dew sweep takes a CONFIG (a TOML file or a built-in name, as the first "
                f"argument or --config) and a SPACE file, got {given}"
            )
        args.config, args.space = given
    elif option is not None:
        if args.config is not None:
            parser.error(f"give the config once, not both {args.config!r} and --config {option!r}")
        args.config = option


def _run_config(value: str) -> Any:
    """The run configuration `value` names: a built-in configuration's name, else a TOML
    file, a run folder or its run.json (`RunConfig.load`); a missing file says that `value`
    is no built-in name either, and lists them."""
    from dew.config import BUILTIN_CONFIGS, RunConfig, builtin

    if value in BUILTIN_CONFIGS:
        return builtin(value)
    try:
        return RunConfig.load(value)
    except FileNotFoundError as error:
        if os.path.isdir(value):  # a folder is read as a run folder: the error says so
            raise
        error.add_note(
            f"(the config {value!r} is neither a file nor a built-in configuration's name; "
            f"the built-in ones are {', '.join(BUILTIN_CONFIGS)})"
        )
        raise


def _register(args: argparse.Namespace) -> None:
    """Before the command reads a configuration: the installed `dew.plugins` entry points,
    then the modules `--import` names (each registers its pieces in `dew.registry`)."""
    from dew._plugins import import_modules, load_plugins

    load_plugins()
    import_modules(args.imports, named_by="--import")


def _configure(args: argparse.Namespace) -> Any:
    """The configuration the command's arguments name, after its overrides; the modules its
    `trainer.imports` names are imported before the overrides apply (their builders declare
    the `kwargs` paths), and `--import` adds to `trainer.imports`."""
    from dew._plugins import import_modules
    from dew.config import override

    with _reading():
        config = _run_config("tiny_lm" if args.config is None else args.config)
        import_modules(config.trainer.imports, named_by="trainer.imports")
        point: dict[str, Any] = {}
        for item in args.set:
            path, separator, text = item.partition("=")
            if not separator or not path:
                raise ValueError(f"--set takes PATH=VALUE, got {item!r}.")
            point[path.strip()] = _toml_value(text.strip(), path)
        if args.name is not None:
            point["trainer.name"] = args.name
        if args.steps is not None:
            point["trainer.steps"] = args.steps
        if args.checkpoint_dir is not None:
            point["trainer.checkpoint_dir"] = args.checkpoint_dir
        if getattr(args, "cache_dir", None) is not None:
            _check_caches(config.data.name, args.cache_dir)
            point["data.kwargs.cache_dir"] = args.cache_dir
        if args.on_nonfinite is not None:
            point["trainer.on_nonfinite"] = args.on_nonfinite
        point.update(_scaling_options(args, config, point))
        if args.imports:
            given = point.get("trainer.imports", config.trainer.imports)
            if isinstance(given, list | tuple):  # else the override's check names the value
                point["trainer.imports"] = [*given, *args.imports]
        return override(config, point) if point else config


def _scaling_options(
    args: argparse.Namespace, config: Any, point: Mapping[str, Any]
) -> dict[str, Any]:
    """The overrides `--precision`, `--accumulate`, `--strategy` and `--remat` ask for, each
    refused in one line naming the option, its value and what it may be."""
    from dew._precisions import check_precision
    from dew.config._sections import CONFIG_STRATEGIES

    chosen: dict[str, Any] = {}
    precision = getattr(args, "precision", None)
    if precision is not None:
        chosen["trainer.precision"] = check_precision(precision, "--precision")
    strategy = getattr(args, "strategy", None)
    if strategy is not None:
        if strategy not in CONFIG_STRATEGIES:
            tensor = " (fsdp+tensor needs a mesh: build the Trainer in Python)"
            raise ValueError(
                f"--strategy must be 'data' or 'fsdp', got {strategy!r}"
                f"{tensor if strategy == 'fsdp+tensor' else ''}."
            )
        chosen["trainer.strategy"] = strategy
    accumulate = getattr(args, "accumulate", None)
    if accumulate is not None:
        batch = point.get("trainer.batch_size", config.trainer.batch_size)
        if isinstance(batch, int) and (accumulate < 1 or batch % accumulate):
            divisors = ", ".join(str(k) for k in range(1, batch + 1) if batch % k == 0)
            raise ValueError(
                f"--accumulate {accumulate} must divide trainer.batch_size ({batch}) into equal "
                f"micro-batches: one of {divisors}."
            )
        chosen["trainer.accumulate"] = accumulate
    remat = getattr(args, "remat", None)
    if remat is not None:
        chosen["model.kwargs.remat"] = _remat(remat, point.get("model.name", config.model.name))
    return chosen


def _remat(value: str, model: str) -> bool | str:
    """`--remat`'s value for `model.kwargs.remat`: `true`, `false` or a policy name, for a
    model whose builder takes `remat` (looking the builder up imports its module)."""
    from dew import _registry
    from dew.nn.backbones._remat import REMAT_POLICIES

    allowed = ("true", "false", *REMAT_POLICIES)
    if value not in allowed:
        listed = ", ".join(allowed)
        raise ValueError(f"--remat must be one of {listed}, got {value!r}.")
    try:
        names, _ = _registry.keyword_parameters(_registry.models[model])
    except KeyError:
        names = ("remat",)  # an unknown model: the override's own check names it
    if "remat" not in names:
        takers = [name for name in _registry.models if _takes_remat(name)]
        raise ValueError(
            f"--remat {value}: the model {model!r} takes no remat keyword; "
            f"{', '.join(takers) or 'no registered model'} do."
        )
    return {"true": True, "false": False}.get(value, value)


def _takes_remat(name: str) -> bool:
    from dew import _registry

    try:
        names, _ = _registry.keyword_parameters(_registry.models[name])
    except Exception:  # a registration that cannot be looked up takes nothing here
        return False
    return "remat" in names


def _check_caches(name: str, cache_dir: str) -> None:
    """Refuse `--cache-dir` for a dataset whose builder keeps no cache (takes no `cache_dir`)."""
    import inspect

    from dew.config._data import datasets

    try:
        parameters = inspect.signature(datasets.builder(name)).parameters
    except (KeyError, TypeError, ValueError):
        return  # an unknown name: the build's own check names it
    if "cache_dir" not in parameters:
        raise ValueError(
            f"--cache-dir {cache_dir!r}: the dataset {name!r} keeps no cache (its builder takes "
            "no cache_dir); the text, image_folder and huggingface sources do."
        )
