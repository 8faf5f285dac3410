"""Optional packages a data source needs, imported when it is used."""

import importlib
from typing import Any

__all__ = ["optional"]


def optional(module: str, extra: str, needed_by: str) -> Any:
    """Import `module` (a dotted name returns the submodule), or raise an `ImportError`
    naming the extra that installs it (its `name` the missing package, so the `dew` command
    reports it in one line as the user's to fix)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise ImportError(
            f"{needed_by} needs the package {package!r}: install dew-ml[{extra}] "
            f"(pip install 'dew-ml[{extra}]').",
            name=package,
        ) from None
