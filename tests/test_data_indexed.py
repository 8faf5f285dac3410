"""The step-indexed contract (`dew.data._indexed`): a training batch is a pure function of
(the rows' fingerprint, the seed, the step, the global batch), each epoch visits every row
once, each process reads its slice of the global batch, and the validation split depends on
(fingerprint, seed, val_fraction) alone."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.data import Dataset, InOrder, Partition, StepBatches, Subset, indexed_dataset
from dew.data._indexed import epoch_positions, hold_out


class Numbered:
    """Rows that name themselves (`read` returns the indices under `"row"`), counting reads."""

    def __init__(self, count, fingerprint="numbered"):
        self.count, self.fingerprint, self.reads = count, fingerprint, 0

    def __len__(self):
        return self.count

    def read(self, indices):
        self.reads += 1
        return {"row": np.asarray(indices, np.int64).copy()}


rows_counts = st.integers(1, 300)
seeds = st.integers(0, 2**40)


@given(
    count=rows_counts,
    seed=seeds,
    batch=st.integers(1, 8),
    steps=st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
)
def test_a_batch_is_the_same_whenever_and_in_whatever_order_it_is_read(count, seed, batch, steps):
    batch = min(batch, count)
    forward = StepBatches(Numbered(count), batch, seed)
    again = StepBatches(Numbered(count), batch, seed)  # a new object: nothing cached matters
    first = [forward.batch_at(step, Partition())["row"] for step in steps]
    backward = [again.batch_at(step, Partition())["row"] for step in reversed(steps)]
    for a, b in zip(first, reversed(backward), strict=True):
        np.testing.assert_array_equal(a, b)


@given(
    count=rows_counts,
    seed=seeds,
    batch=st.integers(1, 6),
    processes=st.integers(1, 4),
    step=st.integers(0, 10**5),
)
def test_the_processes_slices_concatenated_are_one_processs_global_batch(
    count, seed, batch, processes, step
):
    batch = max(1, min(batch, count // processes))
    if processes * batch > count:
        return
    whole = StepBatches(Numbered(count), processes * batch, seed).batch_at(step, Partition())
    slices = [
        StepBatches(Numbered(count), batch, seed).batch_at(step, Partition(index, processes))
        for index in range(processes)
    ]
    np.testing.assert_array_equal(np.concatenate([s["row"] for s in slices]), whole["row"])


@settings(max_examples=40)
@given(count=rows_counts, seed=seeds, batch=st.integers(1, 7), epochs=st.integers(1, 3))
def test_every_epoch_visits_every_training_row_exactly_once(count, seed, batch, epochs):
    batch = min(batch, count)
    source = StepBatches(Numbered(count), batch, seed)
    steps = -(-epochs * count // batch)
    order = np.concatenate([source.batch_at(step, Partition())["row"] for step in range(steps)])
    for epoch in range(epochs):
        np.testing.assert_array_equal(
            np.sort(order[epoch * count : (epoch + 1) * count]), np.arange(count)
        )


def test_epochs_are_different_permutations_and_the_seed_and_fingerprint_change_the_order():
    order = epoch_positions("a", 0, 50, np.arange(150))
    epochs = order.reshape(3, 50)
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    assert not np.array_equal(epochs[0], np.arange(50))
    assert not np.array_equal(order, epoch_positions("a", 1, 50, np.arange(150)))
    assert not np.array_equal(order, epoch_positions("b", 0, 50, np.arange(150)))


@given(count=rows_counts, seed=seeds, fraction=st.floats(0, 0.99), batch=st.integers(1, 4))
def test_validation_and_training_rows_are_disjoint_and_together_all_rows(
    count, seed, fraction, batch
):
    train, val = hold_out(count, fingerprint="numbered", seed=seed, val_fraction=fraction)
    assert np.intersect1d(train, val).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.arange(count))
    assert val.size == (int(np.ceil(fraction * count)) if fraction > 0 else 0)
    if train.size == 0 or batch > train.size:
        return
    data = indexed_dataset(Numbered(count), batch=batch, seed=seed, val_fraction=fraction)
    assert data.records == train.size
    epoch = np.concatenate(
        [data.train.batch_at(step, Partition())["row"] for step in range(-(-train.size // batch))]
    )
    assert set(epoch[: train.size].tolist()) == set(train.tolist())
    read = [] if data.val is None else [b["row"] for b in data.val(Partition())]
    np.testing.assert_array_equal(np.concatenate(read) if read else [], val)


@given(count=rows_counts, seed=seeds, fraction=st.floats(0.01, 0.9))
def test_the_split_depends_only_on_the_fingerprint_seed_and_fraction(count, seed, fraction):
    if count - int(np.ceil(fraction * count)) < 4:
        return
    one = indexed_dataset(Numbered(count, "same"), batch=1, seed=seed, val_fraction=fraction)
    other = indexed_dataset(Numbered(count, "same"), batch=4, seed=seed, val_fraction=fraction)
    np.testing.assert_array_equal(one.train.rows.indices, other.train.rows.indices)
    np.testing.assert_array_equal(one.val.rows.indices, other.val.rows.indices)
    # a larger fraction holds out a superset: the same draw, cut later
    more = indexed_dataset(
        Numbered(count, "same"), batch=1, seed=seed, val_fraction=min(0.95, fraction + 0.05)
    )
    assert set(one.val.rows.indices.tolist()) <= set(more.val.rows.indices.tolist())


def test_another_fingerprint_or_seed_holds_out_other_rows():
    base = hold_out(1000, fingerprint="a", seed=0, val_fraction=0.1)[1]
    assert not np.array_equal(base, hold_out(1000, fingerprint="b", seed=0, val_fraction=0.1)[1])
    assert not np.array_equal(base, hold_out(1000, fingerprint="a", seed=1, val_fraction=0.1)[1])


def test_called_with_a_partition_a_step_batches_iterates_batch_0_1_and_on():
    source = StepBatches(Numbered(10), 3, seed=4)
    drawn = list(itertools.islice(source(Partition(1, 2)), 5))
    for step, batch in enumerate(drawn):
        np.testing.assert_array_equal(batch["row"], source.batch_at(step, Partition(1, 2))["row"])
    assert isinstance(indexed_dataset(Numbered(10), batch=2), Dataset)


def test_in_order_gives_each_process_its_strided_share():
    rows = Subset(Numbered(20), np.arange(10, 20), "validation")
    shares = [
        np.concatenate([b["row"] for b in InOrder(rows, 2)(Partition(index, 3))])
        for index in range(3)
    ]
    np.testing.assert_array_equal(shares[0], [10, 13, 16, 19])
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.arange(10, 20))
    assert [len(b["row"]) for b in InOrder(rows, 4)(Partition())] == [4, 4, 2]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: StepBatches(Numbered(0), 1, 0), ValueError, "at least one training row"),
        (lambda: StepBatches(Numbered(4), 0, 0), ValueError, "StepBatches.batch must be"),
        (lambda: StepBatches(Numbered(4), 1, -1), ValueError, "StepBatches.seed must be"),
        (
            lambda: StepBatches(Numbered(4), 3, 0)(Partition(0, 2)),
            ValueError,
            r"^StepBatches: a global batch of 6 rows \(2 process\(es\) x 3\) is more than the 4",
        ),
        (
            lambda: StepBatches(Numbered(4), 1, 0).batch_at(-1, Partition()),
            ValueError,
            "step must be an integer >= 0, got -1",
        ),
        (
            lambda: indexed_dataset(Numbered(0), batch=1, source="mine"),
            ValueError,
            "^mine: the rows are empty",
        ),
        (
            lambda: indexed_dataset(Numbered(3), batch=1, val_fraction=0.9, source="mine"),
            ValueError,
            r"^mine: 3 row\(s\) leave no training row after holding out val_fraction=0.9",
        ),
        (
            lambda: indexed_dataset(Numbered(3), batch=4, source="mine"),
            ValueError,
            r"^mine: batch=4 is more than the 3 training row\(s\)",
        ),
        (
            lambda: indexed_dataset(Numbered(3), batch=1, val_fraction=1.0, source="mine"),
            ValueError,
            r"^mine: val_fraction must be a number in \[0, 1\), got 1.0",
        ),
        (
            lambda: indexed_dataset(
                Numbered(3), batch=1, val_fraction=0.5, val=Numbered(2), source="mine"
            ),
            ValueError,
            "^mine: give val_fraction or val rows of their own, not both",
        ),
    ],
)
def test_bad_arguments_raise_one_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()
