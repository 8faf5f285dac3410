"""A Ctrl-C that reaches the loop even when Python swallows it.

Python raises `KeyboardInterrupt` wherever the main thread is when SIGINT arrives. If that
is a finalizer (a `__del__` or a weakref callback, which JAX, orbax and dew's caches all
have), Python prints "Exception ignored in ..." and carries on, and a training run that was
told to stop keeps going. `InterruptLatch` keeps the default behaviour (raise at once) and
also remembers the signal, so the loop raises it at its next step if it was lost.
"""

import signal
import threading
from types import FrameType, TracebackType

__all__ = ["InterruptLatch"]


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

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True
        raise KeyboardInterrupt

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
