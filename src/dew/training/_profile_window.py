"""The profile window: tracing a `Profile` window of training steps with `jax.profiler`. It
brackets the compiled calls themselves (the loop calls `before` and `after` around each), so
it is no step policy."""

import contextlib
import os

import jax

from dew._loop import Loop
from dew.profiling import Profile
from dew.telemetry.records import ProfileWindow

__all__ = ["ProfileWindowTracer"]


class ProfileWindowTracer:
    """Traces a `Profile` window of the loop with `jax.profiler`: starts the trace before the
    window's first step, stops it after its last, and reports the `ProfileWindow` record."""

    def __init__(self, profile: Profile | None, loop: Loop) -> None:
        self.profile = profile
        self.loop = loop
        self.tracing = False
        self.finished = profile is None
        self.traced = 0
        self.first = 0

    def before(self, step: int) -> None:
        profile = self.profile
        if profile is None or self.finished or self.tracing or step < profile.start:
            return
        if step > profile.stop:
            self.finished = True
            return
        directory = os.fspath(profile.directory)
        os.makedirs(directory, exist_ok=True)
        jax.profiler.start_trace(directory)
        self.tracing, self.first = True, step

    def after(self, step: int, leaves: list, count: int = 1) -> None:
        if not self.tracing or self.profile is None:
            return
        self.traced += count
        if step >= self.profile.stop:
            self.close(leaves)

    def close(self, leaves: list) -> None:
        profile = self.profile
        if not self.tracing or profile is None:
            return
        self.tracing, self.finished = False, True
        # The traced steps have run when the trace stops (a failed step's buffers may be
        # donated already: stop the trace anyway).
        with contextlib.suppress(RuntimeError):
            jax.block_until_ready(leaves)
        jax.profiler.stop_trace()
        self.loop.record(
            "profile_window",
            ProfileWindow(
                directory=os.fspath(profile.directory),
                traced_steps=self.traced,
                start_step=self.first,
            ),
            self.first + self.traced - 1,
        )
