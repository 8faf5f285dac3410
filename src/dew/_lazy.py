"""A package's public names, each imported from its module when first used (PEP 562).

A package's `__init__` maps each public name to the module that defines it, and imports
those modules in an `if TYPE_CHECKING:` block alone, for type checkers, IDEs and the
reference site. `dew.Trainer`, `from dew.tracking import read_journal` or `dir(dew)` then
import only what they name, so a process that needs a few names (the `dew` command's
`dew runs`, a tracker's subprocess) does not import JAX for the others.
"""

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public names come from the modules
    `homes` maps them to (a name whose home is `<package>.<name>` is that submodule).

    **Arguments:**

    - `package`: the package's `__name__`, which must be imported (its `__init__` running).
    - `homes`: each public name and its module's full name.

    **Raises:** `__getattr__` raises `AttributeError` for a name `homes` does not hold, as a
    module without it would.
    """
    namespace = vars(sys.modules[package])

    def attribute(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value  # later look-ups find it without `__getattr__`
        return value

    def names() -> list[str]:
        return sorted({*namespace, *homes})

    return attribute, names
