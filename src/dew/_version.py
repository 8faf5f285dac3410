"""dew's version, `dew.__version__`: the installed distribution's (`dew-ml`), read from its
metadata when first asked for (`dew --version`), not by every `import dew`."""

from importlib import metadata

__all__ = ["__version__"]

try:
    __version__ = metadata.version("dew-ml")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"
