"""Where a fit starts (a fresh state, the caller's `state=`, or the latest checkpoint), and
how its checkpoints close after Ctrl-C."""

import sys
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import optax
from jaxtyping import PRNGKeyArray

from dew._early_stopping import EarlyStopper, EarlyStoppingState
from dew._interrupts import FitInterrupted
from dew.objectives.base import Objective
from dew.steps import TrainState, generation_params
from dew.tracking._protocol import same_failure, set_notes
from dew.training._placement import Placement

if TYPE_CHECKING:
    from dew.checkpoints import Checkpointer

__all__ = ["closed_after_interrupt", "initial_state", "last_completed", "starting_state"]


def initial_state(
    objective: Objective, optimizer: optax.GradientTransformation, key: PRNGKeyArray
) -> TrainState:
    """The state before the first step, with EMA params when the objective keeps them."""
    ema = objective.ema_decay is not None
    return TrainState.create(objective, optimizer, key=key, ema=ema)


def starting_state(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    key: PRNGKeyArray,
    checkpoints: "Checkpointer | None",
    checkpoint_dir: str | None,
    steps: int,
    state: TrainState | None,
    placement: Placement | None,
    early_stopper: EarlyStopper | None,
) -> tuple[TrainState, int | None, EarlyStoppingState | None]:
    """The state a fit of `steps` steps of `objective` (trained by `optimizer` from the run
    key `key`) starts from, the step its saved data iterator had started at (`None`: not
    restored) and the early stopper's saved state. `checkpoint_dir` is where `checkpoints`
    are, as the errors name it.

    A fit resumes from the newest intact checkpoint (`Checkpointer.restore`: a damaged
    newer step is passed over with a warning naming it). A checkpoint past `steps` is
    refused (a fit never goes back); one before it is continued to `steps`, however many
    steps the fit that saved it was asked for.
    """
    if checkpoints is None or not checkpoints.holds_checkpoints():
        started: TrainState
        if state is None:
            started = initial_state(objective, optimizer, key)
        else:  # the step donates its input: never let fit delete the caller's arrays
            generation_params(objective, state)  # raises when EMA params are missing
            started = jax.tree.map(lambda leaf: leaf.copy() if eqx.is_array(leaf) else leaf, state)
        return started if placement is None else placement.state(started), None, None
    if state is not None:
        raise ValueError(
            f"fit was given state= and checkpoint_dir {checkpoint_dir!r} already holds "
            f"checkpoints (steps {checkpoints.all_steps()}); resume from the checkpoints "
            "without state=, or use a new checkpoint_dir."
        )
    latest = checkpoints.latest_step()
    if latest is not None and latest > steps:
        raise ValueError(
            f"checkpoint_dir {checkpoint_dir!r} holds a checkpoint at step {latest}, "
            f"past steps={steps}: a fit continues a run, it never goes back; fit to steps >= "
            f"{latest} (it continues from step {latest}), or use a new checkpoint_dir."
        )
    template = initial_state(objective, optimizer, key)
    if placement is not None:  # restored straight into the global arrays
        template = placement.state(template)
    restored, extra = checkpoints.restore(template)  # the newest intact step
    saved = extra.get("early_stopping")
    stopping = None
    if early_stopper is not None and saved is not None:
        stopping = EarlyStoppingState(**saved)
    restored = restored if placement is None else placement.state(restored)
    return restored, int(extra.get("data_start", 0)), stopping


def closed_after_interrupt(checkpoints: "Checkpointer") -> None:
    """Close `checkpoints`, waiting for every submitted save. Called in a `finally`: a
    second Ctrl-C during the wait, while a `FitInterrupted` is on its way out, stops the
    wait and raises a `FitInterrupted` that names no saved step (the save it cut short
    never became a checkpoint; the latest complete one is where a new fit resumes). A
    failed save while another error is on its way out becomes a note on that error,
    which stays the one raised."""
    in_flight = sys.exc_info()[1]
    try:
        checkpoints.close()
    except KeyboardInterrupt:
        if isinstance(in_flight, FitInterrupted):
            raise FitInterrupted(in_flight.step, None) from None
        raise
    except Exception as error:
        if in_flight is None:
            raise
        if same_failure(error, in_flight):  # the disk that failed the save failed again
            return
        notes = " ".join(getattr(error, "__notes__", ()))
        note = f"Closing the checkpoints also failed: {error} {notes}".strip()
        set_notes(in_flight, "checkpoints' closing", [note])


def last_completed(state: TrainState, step: int) -> int:
    """The last completed step: the state's, or `step` when a failed call had already
    donated the state's buffers."""
    try:
        return int(state.step)
    except RuntimeError:
        return step
