"""Where a fit's arrays live under `jax.distributed`: the state and the objective as global
arrays (replicated, or the params sharded as the user asks), each step's batch as one
global batch over the data mesh, and the sharding the compiled step keeps them in.

A `Placement` exists only for a multi-process fit or one given `param_sharding`; a plain
one-process fit never builds one and pays nothing for it.
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax

from dew._processes import (
    _allgather,
    data_mesh,
    global_batch,
    is_multiprocess,
    replicated,
    replicated_sharding,
)
from dew.steps import TrainState

__all__ = ["ParamSharding", "Placement"]

ParamSharding = Callable[[Any, jax.Array], jax.sharding.Sharding]


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _put(leaf: Any, sharding: jax.sharding.Sharding) -> Any:
    """`leaf` (the same value on every process) as a global array with `sharding`."""
    if not isinstance(leaf, jax.Array | np.ndarray | np.generic):
        return leaf
    if isinstance(leaf, jax.Array) and leaf.sharding == sharding:
        return leaf
    if _is_key(leaf):
        data = _put(jax.random.key_data(leaf), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    value = np.asarray(leaf)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


class Placement:
    """The placement of one fit: see the module docstring.

    **Arguments:**

    - `optimizer`: the fit's optimizer (its state's params-shaped parts are sharded like
      the params, found with `optax.tree_map_params`).
    - `param_sharding`: `None` (every array replicated) or a callable `(path, leaf) ->
      jax.sharding.Sharding` over the params' array leaves.
    """

    def __init__(
        self, optimizer: optax.GradientTransformation, param_sharding: ParamSharding | None
    ) -> None:
        self.optimizer = optimizer
        self.param_sharding = param_sharding
        self.copy = replicated_sharding()

    def _param_shardings(self, params: Any) -> Any:
        def choose(path: Any, leaf: Any) -> Any:
            assert self.param_sharding is not None
            sharding = self.param_sharding(path, leaf)
            where = f"param_sharding{jax.tree_util.keystr(path)}"
            if not isinstance(sharding, jax.sharding.Sharding):
                raise ValueError(
                    f"{where} returned {sharding!r}; it must return a jax.sharding.Sharding "
                    "(e.g. NamedSharding(dew.distributed.data_mesh(), PartitionSpec('data')))."
                )
            if set(sharding.device_set) != set(data_mesh().devices.flat):
                raise ValueError(
                    f"{where} returned a sharding over {len(sharding.device_set)} devices; "
                    f"a fit's arrays live on every device of every process "
                    f"({data_mesh().devices.size}): build it on dew.distributed.data_mesh()."
                )
            try:
                sharding.shard_shape(np.shape(leaf))
            except ValueError as error:
                raise ValueError(
                    f"{where} returned {sharding}, which cannot shard the param's shape "
                    f"{tuple(np.shape(leaf))}: {error}"
                ) from None
            return sharding

        return jax.tree_util.tree_map_with_path(choose, params)

    def state(self, state: TrainState) -> TrainState:
        """`state` (the same values on every process) as global arrays."""
        if self.param_sharding is None:
            return replicated(state)
        shardings = self._param_shardings(state.params)
        params = jax.tree.map(_put, state.params, shardings)
        ema = None if state.ema_params is None else jax.tree.map(_put, state.ema_params, shardings)
        opt_state = optax.tree_map_params(
            self.optimizer,
            _put,
            state.opt_state,
            shardings,
            transform_non_params=lambda leaf: _put(leaf, self.copy),
        )
        return TrainState(
            _put(state.step, self.copy),
            params,
            opt_state,
            _put(state.key, self.copy),
            ema,
            state.metric_history,
        )

    def objective(self, leaves: list[Any]) -> list[Any]:
        """The objective's array leaves, replicated."""
        return replicated(leaves)

    def batch(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """One step's batch of this process as one global batch."""
        return global_batch(batch)

    def stacked(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A fused block's stacked batches (`(steps, rows, ...)`) as global arrays: rows
        sharded along the data mesh, the step axis (and stacked scalars) replicated."""
        rows = jax.sharding.NamedSharding(data_mesh(), jax.sharding.PartitionSpec(None, "data"))

        def place(leaf: Any) -> jax.Array:
            array = np.asarray(leaf)
            sharding = self.copy if array.ndim < 2 else rows
            return jax.make_array_from_process_local_data(sharding, array)

        return jax.tree.map(place, dict(batch))

    def check_first_batch(self, batch: Mapping[str, Any]) -> None:
        """Raise the same `ValueError` on every process when the processes' first batches
        differ in row count (a global batch joins equal shares)."""
        if not is_multiprocess():
            return
        found = {int(np.shape(leaf)[0]) for leaf in jax.tree.leaves(batch) if np.ndim(leaf) > 0}
        rows = found.pop() if len(found) == 1 else -1
        counts = [int(value) for value in _allgather(np.array([rows], np.int64))[:, 0]]
        if len(set(counts)) == 1 and counts[0] >= 0:
            return
        shown = ", ".join(
            f"process {index}: {'ragged fields' if count < 0 else f'{count} rows'}"
            for index, count in enumerate(counts)
        )
        raise ValueError(
            f"the processes' first training batches differ in rows ({shown}); under "
            "jax.distributed every process reads batches of the same row count, which one "
            "global batch joins in process order."
        )
