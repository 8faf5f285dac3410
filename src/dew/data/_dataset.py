"""`Dataset`: training and validation batches as functions of a process's partition."""

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax

from dew._integers import check_integer
from dew.data.tokenizers._protocol import Tokenizer

__all__ = ["Batches", "Dataset", "Partition"]


@dataclasses.dataclass(frozen=True)
class Partition:
    """Which share of the data one process reads: its index among `count` processes."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        check_integer("Partition.count", self.count, minimum=1)
        check_integer("Partition.index", self.index, minimum=0)
        if not self.index < self.count:
            raise ValueError(
                f"Partition needs 0 <= index < count, got index {self.index} and count "
                f"{self.count}."
            )

    @classmethod
    def current(cls) -> "Partition":
        """This process's partition under `jax.distributed` (one partition otherwise)."""
        return cls(jax.process_index(), jax.process_count())


Batches = Callable[[Partition], Iterator[Mapping[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Training and (optional) validation data, each a callable of a `Partition`
    that returns an iterator of batches (mappings of arrays with a leading row axis).

    - `train`: the training batches; the trainer draws one per step. When it also has
      `batch_at(step, partition)` (a `StepBatches`: `dew.data.arrays`, `tokens`,
      `map_dataset`, `indexed_dataset`), the trainer reads each step's batch by its step,
      so a resumed fit replays nothing; otherwise a resumed fit calls it again and draws
      and discards the batches the saved run had consumed.
    - `val`: the validation batches, read in full at each evaluation event.
    - `records`: how many records one pass over the training data holds, over all
      processes (optional; at least `batch`).
    - `batch`: the rows of every batch `train` yields in this process (optional); when set,
      the trainer checks each training batch against it, so a ragged batch (which would
      also recompile the step) fails with the step that yielded it.
    - `tokenizer`: the `dew.data.tokenizers.Tokenizer` that made the batches' token IDs
      (optional: a text source sets it), so a model's vocabulary can be checked against it
      before training and a batch, or a preview's generated rows, decoded back to text.
    - `classes`: the class names, label `i` naming `classes[i]` (optional: an image folder
      sets it from its class folders, `shapes` and `moving_shapes` to their kinds), so
      predictions, previews and reports can name the classes.

    ```python
    >>> import itertools
    >>> import numpy as np
    >>> rows = np.zeros((8, 9), np.int32)
    >>> data = Dataset(train=lambda partition: itertools.repeat({"text": rows}),
    ...                val=lambda partition: iter([{"text": rows}]), records=8, batch=8)
    >>> next(data.train(Partition()))["text"].shape
    (8, 9)

    ```
    """

    train: Batches
    val: Batches | None = None
    records: int | None = None
    batch: int | None = None
    tokenizer: "Tokenizer | None" = None
    classes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for field in ("train", "val"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise TypeError(
                    f"Dataset.{field} must be a callable of a Partition returning an iterator of "
                    f"batches (e.g. lambda partition: iter(batches)), got {type(value).__name__}."
                )
        for field in ("records", "batch"):
            value = getattr(self, field)
            check_integer(f"Dataset.{field}", value, minimum=1, optional=True)
        if self.tokenizer is not None and not isinstance(self.tokenizer, Tokenizer):
            raise TypeError(
                "Dataset.tokenizer must be a dew.data.tokenizers.Tokenizer (encode, decode, "
                f"vocab_size, eos_id, fingerprint) or None, got {type(self.tokenizer).__name__}."
            )
        if self.classes is not None:
            _check_classes(self.classes)
        if self.records is not None and self.batch is not None and self.batch > self.records:
            raise ValueError(
                f"Dataset.batch={self.batch} is more than Dataset.records={self.records}: "
                "one pass over the training data must hold at least one batch."
            )


def _check_classes(classes: object) -> None:
    if (
        not isinstance(classes, tuple)
        or not classes
        or not all(isinstance(name, str) and name for name in classes)
    ):
        raise TypeError(
            f"Dataset.classes must be a non-empty tuple of class names (strings), got {classes!r}."
        )
    if len(set(classes)) != len(classes):
        repeated = next(name for name in classes if classes.count(name) > 1)
        raise ValueError(f"Dataset.classes names {repeated!r} twice; class names are unique.")


def _lazily(
    batches: Callable[[Partition], Iterable[Mapping[str, Any]]], partition: Partition
) -> Iterator[Mapping[str, Any]]:
    """`batches(partition)`'s batches, the call itself deferred to the first draw: under
    `jax.distributed` the first draw is agreed by every process, so a shard that fails to
    open raises on every process instead of on its own, leaving the others blocked."""
    yield from batches(partition)
