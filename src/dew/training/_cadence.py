"""A fit's cadence arguments, checked before any work."""

from dew._integers import check_integer

__all__ = ["check_cadence"]


def check_cadence(
    steps: int,
    log_every: int,
    eval_every: int | None,
    checkpoint_every: int | None,
    steps_per_call: int,
    checkpoint_dir: str | None,
) -> None:
    """Raise a `ValueError` (or `TypeError`) naming the first bad cadence argument of
    `Trainer.fit`: each an integer >= 1 (`eval_every` and `checkpoint_every` may be `None`),
    every cadence a multiple of `steps_per_call` (a fused call runs whole blocks of steps),
    and `checkpoint_every` only with a `checkpoint_dir` to save to."""
    check_integer("steps", steps, minimum=1)
    check_integer("log_every", log_every, minimum=1)
    check_integer("eval_every", eval_every, minimum=1, optional=True)
    check_integer("checkpoint_every", checkpoint_every, minimum=1, optional=True)
    check_integer("steps_per_call", steps_per_call, minimum=1)
    for name, every in (
        ("log_every", log_every),
        ("eval_every", eval_every),
        ("checkpoint_every", checkpoint_every),
    ):
        if every is not None and every % steps_per_call:
            raise ValueError(
                f"{name}={every} is not a multiple of steps_per_call={steps_per_call}: a "
                "fused call runs whole blocks of steps, so the loop can only look at their ends."
            )
    if checkpoint_every is not None and checkpoint_dir is None:
        raise ValueError(
            f"checkpoint_every={checkpoint_every} needs somewhere to save: construct the "
            "Trainer with checkpoint_dir=..."
        )
