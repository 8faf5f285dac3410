"""Where dew keeps what it computes once and reuses: data caches, a metric's trained
weights. Below the core: imports no dew module."""

import os
import pathlib

__all__ = ["default_cache_dir"]


def default_cache_dir(kind: str = "tokens") -> pathlib.Path:
    """Where dew keeps a cache of `kind` (`"tokens"`, `"images"`, `"metrics"`) unless told:
    `$DEW_CACHE_DIR` (every kind, told apart by the folders' names), else
    `$XDG_CACHE_HOME/dew/<kind>`, else `~/.cache/dew/<kind>` (shared by every script of the
    user, as Hugging Face's caches are; a run configuration puts it in the run folder)."""
    if os.environ.get("DEW_CACHE_DIR"):
        return pathlib.Path(os.environ["DEW_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "dew" / kind
