"""A Ctrl-C that reaches the loop even when Python swallows it.

Python raises `KeyboardInterrupt` wherever the main thread is when SIGINT arrives. If that
is a finalizer (a `__del__` or a weakref callback, which JAX, orbax and dew's caches all
have), Python prints "Exception ignored in ..." and carries on, and a training run that was
told to stop keeps going. `InterruptLatch` keeps the default behaviour (raise at once) and
also remembers the signal, so the loop raises it at its next step if it was lost, and it can
hold the signal back while a compiled step is dispatched (`deferred`), so an interrupt never
leaves the loop with a step's donated input and no output; a held signal can say so at once
(a first call compiles for seconds before the loop can raise). `FitInterrupted` is the
`KeyboardInterrupt` a fit raises: it names the last completed step and whether a checkpoint of
it was saved.
"""

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

__all__ = ["FitInterrupted", "InterruptLatch"]


class FitInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a fit: a `KeyboardInterrupt` (every `except KeyboardInterrupt` still
    catches it) that says where.

    - `step`: the last step that completed.
    - `saved`: the step of the checkpoint a new fit with the same `checkpoint_dir` resumes
      from, when one was saved or found (`None`: no checkpoint directory, or a second
      Ctrl-C stopped the save of `step`, so the latest complete checkpoint is unknown).
    """

    def __init__(self, step: int, saved: int | None) -> None:
        super().__init__(step, saved)
        self.step = step
        self.saved = saved

    def __str__(self) -> str:
        where = "no checkpoint saved" if self.saved is None else f"resumes from step {self.saved}"
        return f"interrupted at step {self.step}; {where}"


class InterruptLatch:
    """While entered (in the main thread, with Python's default SIGINT handler in place),
    SIGINT raises `KeyboardInterrupt` as usual and is also latched: `check()` raises it
    again if it never propagated. Elsewhere it does nothing.

    ```python
    >>> import os, signal
    >>> with InterruptLatch() as latch:
    ...     try:
    ...         os.kill(os.getpid(), signal.SIGINT)  # raised here: swallow it, as a finalizer would
    ...     except KeyboardInterrupt:
    ...         pass
    ...     try:
    ...         latch.check()
    ...     except KeyboardInterrupt:
    ...         print("raised again at the next step")
    raised again at the next step

    ```
    """

    def __init__(self) -> None:
        self.pending = False
        self._previous: object = None
        self._installed = False
        self._holding = False
        self._notice: str | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True
        if not self._holding:
            raise KeyboardInterrupt
        if self._notice is not None:  # said once, at once
            _say_now(self._notice)
            self._notice = None

    @contextlib.contextmanager
    def deferred(self, notice: str | None = None) -> Iterator[None]:
        """Inside, SIGINT is only latched; it is raised on leaving (a swallowed or held
        signal alike). A Ctrl-C during a compiled step's dispatch thus lands after the
        step's outputs are bound, never between its input's donation and its return.
        With `notice`, a SIGINT held here prints it on standard error at once (the
        wait may be a compilation of several seconds)."""
        self._holding, self._notice = True, notice
        try:
            yield
        finally:
            self._holding, self._notice = False, None
        self.check()

    def check(self) -> None:
        """Raise `KeyboardInterrupt` if SIGINT arrived and was swallowed."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def __enter__(self) -> "InterruptLatch":
        if threading.current_thread() is threading.main_thread():
            current = signal.getsignal(signal.SIGINT)
            if current is signal.default_int_handler:
                self._previous = current
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._installed = False
        self.pending = False


def _say_now(line: str) -> None:
    """Write `line` to standard error from a signal handler: straight to its file
    descriptor (the handler may run while the main thread is inside a buffered write to
    it), else through `sys.stderr` where it has none (a captured stream)."""
    try:
        os.write(sys.stderr.fileno(), f"{line}\n".encode())
    except (AttributeError, OSError, ValueError):
        print(line, file=sys.stderr, flush=True)
