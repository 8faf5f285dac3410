"""The Ctrl-C latch: a held SIGINT is raised once the compiled call returns, and says at once
that it will be when the loop asks it to (a first call, which compiles)."""

import os
import signal

import pytest

from dew._interrupts import InterruptLatch
from dew._loop import COMPILING_NOTICE, LoopEngine
from dew.steps import EMPTY_HISTORY


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def _held(latch, notice, body):
    with latch.deferred(notice):
        body()


def test_a_held_ctrl_c_says_its_notice_at_once_and_is_raised_on_leaving(capfd):
    said = []

    def twice():
        for _ in range(2):  # a second Ctrl-C is held too, and says nothing more
            _ctrl_c()
            said.append(capfd.readouterr().err)  # before the block ends

    with InterruptLatch() as latch:
        with pytest.raises(KeyboardInterrupt):
            _held(latch, "stopping soon...", twice)
        assert said == ["stopping soon...\n", ""]
        with pytest.raises(KeyboardInterrupt):
            _held(latch, None, _ctrl_c)  # no notice: silent
        assert capfd.readouterr().err == ""


def test_the_engine_gives_the_notice_to_the_first_dispatch_of_each_call(capfd):
    engine = LoopEngine(stage="s", current=lambda: None, history=EMPTY_HISTORY)
    with engine._latch:
        for call, said in ((1, COMPILING_NOTICE + "\n"), (1, ""), (4, COMPILING_NOTICE + "\n")):
            with pytest.raises(KeyboardInterrupt), engine.deferred(call):
                _ctrl_c()
            assert capfd.readouterr().err == said
