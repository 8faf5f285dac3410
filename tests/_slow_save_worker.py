"""`dew train` with slow checkpoint saves, for the Ctrl-C-in-orbax's-wait test:
`python _slow_save_worker.py MARKER ARGUMENTS...`.

orbax's finalize thread sleeps SLOW seconds before finalizing each save, and MARKER is
created when the main thread starts waiting for a save still in flight: a Ctrl-C sent
after it lands inside orbax's `wait_until_finished`.
"""

import pathlib
import sys
import time

from orbax.checkpoint import checkpoint_manager

SLOW = 4.0

marker = pathlib.Path(sys.argv[1])
manager = checkpoint_manager.CheckpointManager
finalize, wait = manager._finalize, manager.wait_until_finished


def slow_finalize(self, *args):
    time.sleep(SLOW)
    return finalize(self, *args)


def marked_wait(self):
    if self.is_saving_in_progress():
        marker.touch()
    return wait(self)


manager._finalize = slow_finalize
manager.wait_until_finished = marked_wait

from dew.cli import main  # noqa: E402 (after orbax is slowed)

sys.exit(main(sys.argv[2:]))
