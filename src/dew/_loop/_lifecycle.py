"""A fit's lifecycle records: `FitStarted` before its first step and `FitEnded` (completed,
failed or interrupted) however it ends, without ever replacing the fit's own error."""

import contextlib
from collections.abc import Callable, Iterator, Mapping

from dew._loop._callback import Loop
from dew.telemetry.records import FitEnded, FitStarted
from dew.tracking._protocol import same_failure, set_notes

__all__ = ["reporting_fit"]


@contextlib.contextmanager
def reporting_fit(
    loop: Loop,
    *,
    start: int,
    steps: int,
    completed: Callable[[], int],
    close: Callable[[], None],
    directions: Mapping[str, str | None],
) -> Iterator[None]:
    """Report `FitStarted`, then `FitEnded`: `completed` when the body returns,
    `interrupted` on KeyboardInterrupt and `failed` (with the error) on any other
    exception, which is re-raised. `completed()` gives the last completed step; `close()`
    runs once the body has ended, however it ended (the progress bar closes). `directions`
    (bare metric name to direction) go into `FitStarted`.

    The fit's own error always surfaces: when reporting `FitEnded` fails too, that
    failure is attached to it as a note. When reporting `FitStarted` fails (one
    tracker of several, say), `FitEnded("failed")` is still reported, so every
    tracker that took the start also sees the end, and the reporting error is raised.
    """
    try:
        started = FitStarted(loop.stage, start, steps, directions, loop.precision)
        loop.record("fit_started", started, start)
    except Exception as error:
        close()
        ended = FitEnded(
            "failed", start, error=f"reporting FitStarted failed: {type(error).__name__}: {error}"
        )
        _record_ending(loop, ended, error)
        raise
    try:
        yield
    except KeyboardInterrupt as error:
        _record_ending(loop, FitEnded("interrupted", completed()), error)
        raise
    except Exception as error:
        ended = FitEnded("failed", completed(), error=f"{type(error).__name__}: {error}")
        _record_ending(loop, ended, error)
        raise
    finally:
        close()
    done = completed()
    loop.record("fit_ended", FitEnded("completed", done), done)


def _record_ending(loop: Loop, ended: FitEnded, error: BaseException) -> None:
    """Report `ended` while `error` is in flight; a reporting failure becomes a note on
    `error` and never replaces it."""
    try:
        loop.record("fit_ended", ended, ended.step)
    except Exception as report_error:
        if same_failure(report_error, error):  # the same failure again: nothing new to tell
            return
        note = (
            f"Reporting FitEnded({ended.status!r}) to the tracker also failed: "
            f"{type(report_error).__name__}: {report_error}"
        )
        set_notes(error, "FitEnded report", [note])
