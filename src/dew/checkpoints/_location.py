"""Where checkpoints can live: a local folder, a `file://` URI naming one, or a Google Cloud
Storage bucket (`gs://`), the one remote store orbax-checkpoint writes arrays to.

orbax-checkpoint 0.12 passes a `gs://` path to TensorStore's GCS driver and any other path to
its local file driver, which needs an absolute path; its path library (etils' `epath`) raises
a bare `KeyError` on `file://` and on schemes it does not know, and reads `s3://` paths that
the array writer then refuses. So dew reads `file://` itself and refuses every other scheme
before anything is written.
"""

import re
import urllib.parse
import urllib.request

__all__ = ["REMOTE_SCHEMES", "checkpoint_location", "is_remote", "uri_scheme"]

REMOTE_SCHEMES = ("gs",)
"""The URI schemes of remote stores orbax-checkpoint writes checkpoints to."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def uri_scheme(path: str) -> str | None:
    """The scheme of a `scheme://...` URI (lower case), or `None` for a plain path.

    ```python
    >>> uri_scheme("gs://bucket/runs"), uri_scheme("File:///tmp/runs"), uri_scheme("runs/a")
    ('gs', 'file', None)

    ```
    """
    found = _SCHEME.match(path)
    return None if found is None else found.group(1).lower()


def is_remote(path: str) -> bool:
    """Whether `path` names a remote store (`gs://...`) rather than a local folder (a plain
    path or a `file://` URI)."""
    return uri_scheme(path) in REMOTE_SCHEMES


def checkpoint_location(path: str, what: str = "checkpoint_dir") -> str:
    """`path` as dew hands it to orbax-checkpoint: a plain path as it is, a `file://` URI as
    the local path it names, a `gs://bucket/...` URI as it is.

    **Arguments:**

    - `path`: a local path or a URI.
    - `what`: names the value in errors (`"trainer.checkpoint_dir"`).

    **Raises:**

    `ValueError`, naming `path` and what is allowed, for a URI of any other scheme, a
    `file://` URI naming another host or no path, or a `gs://` URI naming no bucket.

    ```python
    >>> checkpoint_location("file:///tmp/my%20runs"), checkpoint_location("gs://bucket/runs")
    ('/tmp/my runs', 'gs://bucket/runs')
    >>> checkpoint_location("s3://bucket/runs")
    Traceback (most recent call last):
    ...
    ValueError: checkpoint_dir 's3://bucket/runs' is a URI of scheme 's3', which ...

    ```
    """
    scheme = uri_scheme(path)
    if scheme is None:
        return path
    parts = urllib.parse.urlsplit(path)
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(
                f"{what} {path!r} names no local folder: a file:// URI names one by its "
                "absolute path, with three slashes (file:///absolute/path)."
            )
        return urllib.request.url2pathname(parts.path)
    if scheme in REMOTE_SCHEMES:
        if not parts.netloc:
            raise ValueError(
                f"{what} {path!r} names no bucket: write it as {scheme}://bucket/folder."
            )
        return scheme + path[len(scheme) :]  # orbax reads the scheme in lower case only
    raise ValueError(
        f"{what} {path!r} is a URI of scheme {scheme!r}, which orbax-checkpoint cannot write "
        "checkpoints to: use a local folder, a file:///absolute/path URI or a "
        "gs://bucket/folder URI."
    )
