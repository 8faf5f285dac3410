"""`dew.data.map_dataset`: a user's Grain `MapDataset` read by index as a step-indexed
dataset (dew draws the epochs and the batches; Grain's own pipeline makes each row)."""

from typing import Any

import numpy as np
import pytest

from dew.data import Partition, map_dataset
from dew.data._grain import MapDatasetRows

# Grain, imported when this file's tests run (the fixture below), not when pytest collects it:
# each xdist worker collects the whole suite, and importing Grain (and the orbax it imports)
# took 2.6 s of each collection.
grain: Any = None


@pytest.fixture(scope="module", autouse=True)
def _grain_imported():
    global grain
    import grain


def elements(count=30):
    return [
        {"features": np.full(3, float(index)), "labels": index, "flag": index % 2 == 0}
        for index in range(count)
    ]


def test_each_batch_stacks_the_rows_grain_makes_at_dews_indices():
    source = grain.MapDataset.source(elements()).map(
        lambda row: {**row, "doubled": 2 * row["labels"]}
    )
    data = map_dataset(source, batch=4, val_fraction=0.2, seed=1)
    assert (data.records, data.batch) == (24, 4)
    rows = data.train.indices(5, Partition())
    batch = data.train.batch_at(5, Partition())
    chosen = data.train.rows.indices[rows]  # the training subset's rows of the MapDataset
    np.testing.assert_array_equal(batch["labels"], chosen)
    np.testing.assert_array_equal(batch["doubled"], 2 * chosen)
    np.testing.assert_array_equal(batch["features"], np.repeat(chosen[:, None], 3, axis=1))
    assert {key: value.dtype.name for key, value in batch.items()} == {
        "features": "float32",
        "labels": "int32",
        "flag": "bool",
        "doubled": "int32",
    }
    epoch = np.concatenate([data.train.batch_at(s, Partition())["labels"] for s in range(6)])
    held = np.concatenate([b["labels"] for b in data.val(Partition())])
    assert sorted(epoch.tolist() + held.tolist()) == list(range(30))


def test_the_derived_fingerprint_reads_the_length_and_eight_spread_rows():
    first = MapDatasetRows(grain.MapDataset.source(elements()))
    again = MapDatasetRows(grain.MapDataset.source(elements()))
    assert first.fingerprint == again.fingerprint
    changed = elements()
    changed[29]["labels"] = 99  # the last row is one of the eight read
    assert MapDatasetRows(grain.MapDataset.source(changed)).fingerprint != first.fingerprint
    assert MapDatasetRows(grain.MapDataset.source(elements(31))).fingerprint != first.fingerprint
    given = map_dataset(grain.MapDataset.source(elements()), batch=2, fingerprint="corpus v3")
    assert given.train.rows.fingerprint == "corpus v3"


def test_bad_map_datasets_raise_one_line_naming_the_value():
    source = grain.MapDataset.source(elements())
    with pytest.raises(ValueError, match=r"^map_dataset: the MapDataset is infinite \(len 9223"):
        map_dataset(source.repeat(), batch=2)
    with pytest.raises(TypeError, match=r"^map_dataset: needs a grain.MapDataset, got list"):
        map_dataset(elements(), batch=2)
    with pytest.raises(TypeError, match=r"^map_dataset: element 0 of the MapDataset is a tuple"):
        map_dataset(grain.MapDataset.source([(1, 2), (3, 4)]), batch=1)
    ragged = elements(4)
    del ragged[3]["flag"]
    data = map_dataset(grain.MapDataset.source(ragged), batch=4, fingerprint="ragged")
    with pytest.raises(KeyError, match=r"element 3 of the MapDataset has no 'flag'"):
        data.train.batch_at(0, Partition())
    with pytest.raises(ValueError, match=r"^map_dataset: fingerprint must be a non-empty string"):
        map_dataset(source, batch=2, fingerprint="")
    with pytest.raises(ValueError, match=r"^map_dataset: the rows are empty"):
        map_dataset(grain.MapDataset.source([]), batch=1)
