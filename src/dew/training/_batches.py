"""Drawing the training batches: one per step, stacked for a fused block; read by step from
a step-indexed dataset, or skipped to the resumed step of an iterator."""

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew._checks import held_on_host
from dew.data import Partition
from dew.naming import Split
from dew.objectives.base import check_batch_keys, check_on_host


def _draw(batches: Iterator[Any], step: int, steps: int, rows: int | None = None) -> Any:
    """The batch of `step`; with `rows` (the dataset's declared `batch`), it must have that many."""
    try:
        batch = next(batches)
    except StopIteration:
        raise ValueError(
            f"Dataset.train ran out of batches at step {step} of {steps}; "
            "make it yield at least one batch per step (e.g. itertools.cycle)."
        ) from None
    if rows is not None:
        found = {int(np.shape(leaf)[0]) for leaf in jax.tree.leaves(batch) if np.ndim(leaf) > 0}
        if found != {rows}:
            shown = ", ".join(str(count) for count in sorted(found)) or "no"
            raise ValueError(
                f"Dataset.train yielded a batch of {shown} rows at step {step}, but the "
                f"Dataset declares batch={rows}; yield batches of {rows} rows (a short last "
                "batch would also recompile the step), or leave Dataset.batch unset."
            )
    return batch


def _stack(batches: list[Any]) -> Any:
    """Batches stacked on a new leading axis (device arrays stay on the device)."""
    return jax.tree.map(
        lambda *leaves: jnp.stack(leaves) if isinstance(leaves[0], jax.Array) else np.stack(leaves),
        *batches,
    )


def _draw_block(
    batches: Iterator[Any], step: int, block: int, steps: int, rows: int | None = None
) -> list[Any]:
    """The batches of the `block` steps after `step`."""
    return [_draw(batches, step + offset, steps, rows) for offset in range(1, block + 1)]


def checked_block(
    objective: Any,
    batches: Iterator[Any],
    step: int,
    block: int,
    steps: int,
    rows: int | None = None,
) -> list[Any]:
    """`_draw_block`, with each batch held on the host checked there by the objective's own
    checks (`check_on_host`, after its keys): the compiled step takes it in its variant
    without traced checks (`_compiled_step._ByWhereBatchesLie`), and a bad batch raises
    before any step runs on it."""
    drawn = _draw_block(batches, step, block, steps, rows)
    for batch in drawn:
        if held_on_host(batch):
            try:
                check_batch_keys(objective, batch, Split.TRAIN)
                check_on_host(objective, batch)
            except ValueError as error:  # raised bare, as a failed step's explained error is
                raise error from None
    return drawn


def _skip(batches: Iterator[Any], count: int) -> Iterator[Any]:
    """Draw and discard the `count` batches a resumed run's checkpoint had consumed."""
    for index in range(count):
        try:
            next(batches)
        except StopIteration:
            raise ValueError(
                f"resuming needs the {count} training batches the checkpointed run consumed "
                f"replayed first, but Dataset.train ended after {index}."
            ) from None
    return batches


class _ByStep:
    """The batches `batch_at(step, partition)` of a step-indexed `Dataset.train`, from
    `step` on: each draw reads its step's batch directly (nothing before it is replayed)."""

    def __init__(self, batch_at: Callable[[int, Partition], Any], partition: Partition, step: int):
        self._batch_at, self._partition, self._step = batch_at, partition, step

    def __iter__(self) -> "_ByStep":
        return self

    def __next__(self) -> Any:
        batch = self._batch_at(self._step, self._partition)
        self._step += 1
        return batch


def step_indexed(train: Any) -> Callable[[int, Partition], Any] | None:
    """`train.batch_at` when `train` reads its batches by step (a `dew.data.StepBatches`, or
    anything with a callable `batch_at(step, partition)`), else `None`."""
    batch_at = getattr(train, "batch_at", None)
    return batch_at if callable(batch_at) else None


def data_origin(train: Any, start: int, data_start: int | None) -> int:
    """The step a fit's training batches count from: 0 for a step-indexed `train` (batch
    `s` is `batch_at(s)`), the restored `data_start` for an iterator a checkpoint saved,
    else `start` (a fresh fit, or one given `state=`, starts the iterator)."""
    if step_indexed(train) is not None:
        return 0
    return start if data_start is None else data_start


def _opened(
    train: Any, partition: Partition, start: int, data_start: int, agreed: Any
) -> Iterator[Any]:
    """The training batches from step `start` on. A step-indexed `train` reads batch
    `start` first; an iterator of batches is opened (`train(partition)`) and the `start -
    data_start` batches the saved run had consumed are drawn and discarded. With `agreed`
    (the `Placement` of a multi-process fit, whose every draw is agreed), the processes
    first agree on a step-indexed order (`Placement.agree_order`), and a failure to open an
    iterator is raised by the first draw instead, so every process raises it together."""
    batch_at = step_indexed(train)
    if batch_at is not None:
        if agreed is not None:
            agreed.agree_order(getattr(train, "fingerprint", None))
        return _ByStep(batch_at, partition, start)
    try:
        return _skip(iter(train(partition)), start - data_start)
    except Exception as error:
        if agreed is None:
            raise
        return _raising(error)


def _raising(error: Exception) -> Iterator[Any]:
    raise error
    yield  # pragma: no cover - a generator that raises at its first draw
