"""What a save hands orbax and what a restore reads: a checkpoint holds the state it was given
even when the next step donates that state's buffers while the save is still being written
(the Trainer does this after every save); a restore lands in the template's placement and
dtypes, and checks the template against the shapes the checkpoint records (orbax's metadata of
each array for a checkpoint that records none)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.checkpoints import Checkpointer
from dew.steps import TrainState

OPTIMIZER = optax.adam(1e-3)


def _state(width=1024):
    rng = np.random.default_rng(5)
    params = {
        "weight": jnp.asarray(rng.standard_normal((width, width), dtype=np.float32)),
        "bias": jnp.asarray(rng.standard_normal((width,), dtype=np.float32)),
    }
    return TrainState(
        step=jnp.asarray(7, jnp.int32),
        params=params,
        opt_state=OPTIMIZER.init(params),
        key=jax.random.key(3),
        ema_params=jax.tree.map(lambda leaf: leaf * 2, params),
    )


def _advance(state):
    """A step that writes every array of the state anew (its key too)."""
    return TrainState(
        state.step + 1,
        jax.tree.map(lambda leaf: leaf + 1, state.params),
        jax.tree.map(lambda leaf: leaf + 1, state.opt_state),
        jax.random.split(state.key)[0],
        jax.tree.map(lambda leaf: leaf - 1, state.ema_params),
    )


_DONATING_STEP = jax.jit(_advance, donate_argnums=0)


def _host(state):
    leaves = [
        jax.random.key_data(leaf)
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        else leaf
        for leaf in jax.tree.leaves(state)
    ]
    return [np.array(leaf, copy=True) for leaf in leaves]


def test_a_save_followed_at_once_by_a_donating_step_writes_the_values_before_it(tmp_path):
    compiled = _state()
    _DONATING_STEP(compiled)  # compiled before the save, so the steps follow it at once
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(compiled))  # it does donate
    state = _state()
    before = _host(state)
    with Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(1, state)
        for _ in range(3):  # while orbax writes in its threads
            state = _DONATING_STEP(state)
        after = _host(state)
        checkpoints.wait()
        restored, _ = checkpoints.restore(_state())
    saved = _host(restored)
    assert all(np.array_equal(one, other) for one, other in zip(saved, before, strict=True))
    assert not np.array_equal(after[1], before[1])  # the steps did change the state


def test_a_restore_lands_in_the_template_placement_and_dtypes(tmp_path):
    state = _state(16)
    with Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(1, state)
        checkpoints.wait()
        restored, _ = checkpoints.restore(state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert isinstance(got, jax.Array)
        assert got.dtype == want.dtype
        assert got.sharding == want.sharding
    assert jax.random.key_impl(restored.key) == jax.random.key_impl(state.key)


def test_the_structure_check_reads_the_recorded_shapes_and_orbax_metadata_for_older_ones(
    tmp_path, monkeypatch
):
    state, other = _state(16), _state(8)  # `other`: another model
    with Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(1, state)
    read = []
    with Checkpointer(tmp_path) as checkpoints:
        metadata = checkpoints._manager.item_metadata
        monkeypatch.setattr(
            checkpoints._manager, "item_metadata", lambda step: read.append(step) or metadata(step)
        )
        with pytest.raises(ValueError, match="written for another model") as recorded:
            checkpoints.restore(other)
        restored = _host(checkpoints.restore(state)[0])
    assert read == []  # no array's metadata was read
    extra = tmp_path / "1" / "extra" / "metadata"
    saved = json.loads(extra.read_text())
    del saved["layout"]["arrays"]  # as a checkpoint written before layouts recorded them
    extra.write_text(json.dumps(saved))
    with Checkpointer(tmp_path) as checkpoints:
        with pytest.raises(ValueError, match="written for another model") as older:
            checkpoints.restore(other)
        restored_older = _host(checkpoints.restore(state)[0])
    assert str(older.value) == str(recorded.value)
    expected = _host(state)
    for leaves in (restored, restored_older):
        assert all(np.array_equal(one, other) for one, other in zip(leaves, expected, strict=True))


def test_a_restore_reads_the_json_item_once(tmp_path, monkeypatch):
    """The structure check reads the step's JSON item (its layout); the restore reuses it
    rather than asking orbax for it again, and still returns the extra and the history."""
    import orbax.checkpoint as ocp

    state = _state(16)
    with Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(1, state, {"data_start": 3})
    reads = []
    original = ocp.JsonCheckpointHandler.restore
    with Checkpointer(tmp_path) as checkpoints:  # opening reads orbax's own metrics item
        monkeypatch.setattr(
            ocp.JsonCheckpointHandler,
            "restore",
            lambda self, *args, **kwargs: reads.append(1) or original(self, *args, **kwargs),
        )
        restored, extra = checkpoints.restore(state)
    assert len(reads) == 1
    assert extra == {"data_start": 3}
    assert all(
        np.array_equal(one, other) for one, other in zip(_host(restored), _host(state), strict=True)
    )
