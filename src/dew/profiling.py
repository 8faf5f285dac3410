"""Profile captures with `jax.profiler`: a Trainer window, or a standalone capture.

- `Profile(directory, start=2, steps=5)` asks `Trainer.fit(profile=...)` to trace
  optimizer steps `start` to `start + steps - 1` into `directory`. The trace stops
  once the last traced step has finished on the device; then the trainer reports a
  `ProfileWindow` record (the directory and the number of steps traced). The default
  start skips step 1, whose time is mostly compilation.
- `profile(directory)` is a standalone capture of whatever runs inside it. It writes
  its own directory and reports no record.

Both write the profiler's usual layout (`plugins/profile/<run>/*.xplane.pb`), which
TensorBoard's profile plugin and Perfetto read.

```python
>>> import tempfile, pathlib, jax.numpy as jnp
>>> folder = tempfile.mkdtemp()
>>> with profile(folder):
...     _ = (jnp.ones((64, 64)) @ jnp.ones((64, 64))).block_until_ready()
>>> any(pathlib.Path(folder).rglob("*.xplane.pb"))
True

```
"""

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import jax

from dew._integers import check_integer

__all__ = ["Profile", "profile"]


@dataclasses.dataclass(frozen=True)
class Profile:
    """A profile window for `Trainer.fit`: trace `steps` optimizer steps from step `start`."""

    directory: str | os.PathLike[str]
    start: int = 2
    steps: int = 5

    def __post_init__(self) -> None:
        for field in ("start", "steps"):
            value = getattr(self, field)
            check_integer(f"Profile.{field}", value, minimum=1)
        if not isinstance(self.directory, str | os.PathLike) or not os.fspath(self.directory):
            raise ValueError(f"Profile.directory must be a non-empty path, got {self.directory!r}.")

    @property
    def stop(self) -> int:
        """The last step the window traces."""
        return self.start + self.steps - 1


@contextlib.contextmanager
def profile(directory: str | os.PathLike[str]) -> Iterator[str]:
    """Trace everything inside the block into `directory` (no record is reported)."""
    path = os.fspath(directory)
    os.makedirs(path, exist_ok=True)
    jax.profiler.start_trace(path)
    try:
        yield path
    finally:
        jax.profiler.stop_trace()
