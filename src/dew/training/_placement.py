"""Where a fit's arrays live under `jax.distributed`: the state and the objective as global
arrays (replicated, or the params sharded as the user asks), each step's batch as one
global batch over the data mesh, and the sharding the compiled step keeps them in.

A `Placement` exists only for a multi-process fit or one given `param_sharding`, a `mesh` or a
sharding `strategy` (`dew.training._strategies`); a plain one-process fit never builds one and
pays nothing for it.
"""

import collections
import functools
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeGuard, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew._processes import (
    _allgather,
    agree_process_phase,
    broadcast_json,
    data_mesh,
    global_batch,
    is_multiprocess,
    is_process_zero,
    replicated,
)
from dew.objectives.base import Objective, check_on_host
from dew.steps import TrainState
from dew.training._batches import _draw, _stack
from dew.training._compiled_step import Telemetry, compiled_steps
from dew.training._strategies import Strategy, sharding_strategy

__all__ = ["ParamSharding", "Placement", "fit_setup", "placed_by", "rows_of"]

ParamSharding = Callable[[Any, jax.Array], jax.sharding.Sharding]

_READ_AHEAD = 8
"""Steps whose batches the processes of a `jax.distributed` fit draw ahead and agree on in
one exchange at a fit's start (decision 0088); later exchanges agree on as many steps as
`_AHEAD_BYTES` of batches, up to `_MAX_AHEAD` (decision 0090)."""
_MAX_AHEAD = 64
_AHEAD_BYTES = 64 * 2**20  # of drawn batches a later exchange agrees on at most (below 8)


def _is_key(leaf: Any) -> TypeGuard[jax.Array]:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


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


def placed_by(
    param_sharding: Any, mesh: Any, strategy: Any
) -> tuple[ParamSharding | None, Strategy | None]:
    """The `Trainer`'s checked `param_sharding` (`None` or a callable, else a `TypeError`)
    and sharding preset (`sharding_strategy`: `None` where it changes nothing)."""
    if param_sharding is not None and not callable(param_sharding):
        raise TypeError(
            "param_sharding must be None or a callable (path, leaf) -> "
            f"jax.sharding.Sharding, got {type(param_sharding).__name__}."
        )
    checked = cast("ParamSharding | None", param_sharding)  # callable(...) says no more
    return checked, sharding_strategy(mesh, strategy, param_sharding)


class Placement:
    """The placement of one fit: see the module docstring.

    **Arguments:**

    - `optimizer`: the fit's optimizer (its state's params-shaped parts are sharded like
      the params, found with `optax.tree_map_params`).
    - `param_sharding`: `None` (every array replicated) or a callable `(path, leaf) ->
      jax.sharding.Sharding` over the params' array leaves.
    - `strategy`: `None` (the data mesh, params as `param_sharding` says) or a sharding
      preset over its mesh (`dew.training._strategies.Strategy`), which places the params,
      the objective's arrays and the batches.
    """

    def __init__(
        self,
        optimizer: optax.GradientTransformation,
        param_sharding: ParamSharding | None,
        strategy: Strategy | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.param_sharding = param_sharding
        self.strategy = strategy
        self.mesh = data_mesh() if strategy is None else strategy.mesh
        self.copy = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self._ahead: collections.deque[Any] = collections.deque()  # drawn and agreed
        self._reading = _READ_AHEAD  # steps the next exchange agrees on

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
            mesh = getattr(sharding, "mesh", None)
            if (  # the Trainer's mesh, as the user made it: moved onto the Trainer's own
                isinstance(sharding, jax.sharding.NamedSharding)
                and isinstance(mesh, jax.sharding.Mesh)
                and mesh.shape == self.mesh.shape
                and list(mesh.devices.flat) == list(self.mesh.devices.flat)
            ):
                sharding = jax.sharding.NamedSharding(self.mesh, sharding.spec)
            if set(sharding.device_set) != set(self.mesh.devices.flat):
                raise ValueError(
                    f"{where} returned a sharding over {len(sharding.device_set)} devices; "
                    f"a fit's arrays live on every device of every process "
                    f"({self.mesh.devices.size}): build it on dew.distributed.data_mesh() or "
                    "the Trainer's mesh."
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
        if self.strategy is None and self.param_sharding is None:
            return replicated(state)
        if self.param_sharding is not None:  # beside a strategy only with "data" (checked)
            shardings = self._param_shardings(state.params)
        else:
            assert self.strategy is not None
            shardings = self.strategy.shardings(state.params)
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

    def replicated(self, tree: Any) -> Any:
        """Every array of `tree` (the same values on every process) replicated on the mesh."""
        if self.strategy is None:
            return replicated(tree)
        return jax.tree.map(lambda leaf: _put(leaf, self.copy), tree)

    def objective(self, leaves: list[Any], objective_def: Any = None) -> list[Any]:
        """The objective's array leaves (of the tree `objective_def`): replicated, or as the
        strategy places the params."""
        if self.strategy is None or objective_def is None:
            return replicated(leaves)
        tree = jax.tree.unflatten(objective_def, leaves)
        return jax.tree.leaves(jax.tree.map(_put, tree, self.strategy.shardings(tree)))

    def batch(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """One step's batch of this process as one global batch."""
        return global_batch(batch, self.mesh)

    def stacked(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A fused block's stacked batches (`(steps, rows, ...)`) as global arrays: rows
        sharded along the data mesh, the step axis (and stacked scalars) replicated."""
        rows = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(None, "data"))

        def place(leaf: Any) -> jax.Array:
            array = np.asarray(leaf)
            sharding = self.copy if array.ndim < 2 else rows
            return jax.make_array_from_process_local_data(sharding, array)

        return jax.tree.map(place, dict(batch))

    def compiled_steps(
        self,
        objective_def: Any,
        static: Any,
        leaves: list[Any],
        objective_leaves: list[Any],
        telemetry: Telemetry = None,
        accumulate: int = 1,
        precision: str = "float32",
    ) -> tuple[Callable[..., Any], Callable[..., Any], list[Any], Callable[[list[Any]], Any]]:
        """One compiled step (and fused step) for every process, over global arrays: the
        calls keeping the state `leaves`' shardings (and the training window replicated),
        the objective's leaves replicated, and the placing of a fused block's drawn
        batches."""
        shardings = tuple(leaf.sharding for leaf in leaves)
        step_call, fused_call = compiled_steps(
            objective_def, static, self.optimizer, shardings, telemetry, accumulate, precision
        )

        def place_block(drawn: list[Any]) -> Any:
            return self.stacked(_stack([dict(batch) for batch in drawn]))

        placed = self.objective(objective_leaves, objective_def)
        return step_call, fused_call, placed, place_block

    def draw(
        self,
        objective: Objective,
        batches: Iterator[Any],
        step: int,
        block: int,
        steps: int,
        rows: int | None,
    ) -> list[Any]:
        """The batches of the next `block` steps, drawn and checked on the host by every
        process of a `jax.distributed` fit: a process that fails to draw one, holds a bad
        one (`objective.check_batch`), or whose rows differ from another's, makes every
        process raise the same error instead of leaving the others blocked in the
        compiled step (which holds no traced batch checks there).

        The processes agree once per block of steps, not once per step (decisions 0088 and
        0090): each draws and checks the batches of the next steps (never past `steps`)
        ahead, and one exchange agrees on them all; the steps then take them in order. The
        first block is 8 steps long; later ones as long as 64 MiB of the largest batch any
        process drew (at least 8 steps, at most 64). A batch that fails raises on every
        process when its step comes, as checking step by step would: the steps before it
        run (and their checkpoints are written); a fit that stops before it never raises."""
        ahead = self._ahead
        if len(ahead) < block and not (ahead and isinstance(ahead[-1], _Failed)):
            drawn_to = step + len(ahead)  # the last step whose batch is drawn
            count = max(block - len(ahead), min(self._reading, steps - drawn_to))
            ahead.extend(self._agreed(objective, batches, drawn_to, count, steps, rows))
        taken = [ahead.popleft() for _ in range(min(block, len(ahead)))]
        for item in taken:
            if isinstance(item, _Failed):
                item.raise_on_every_process()
        if block > 1 and rows_of(taken) < 0:  # the same on every process: rows were agreed
            raise ValueError(
                f"the training batches of steps {step + 1}-{step + block} differ in rows; a "
                "fused block (steps_per_call) stacks its steps' batches, which must have one "
                "row count."
            )
        return taken

    def _agreed(
        self,
        objective: Objective,
        batches: Iterator[Any],
        step: int,
        count: int,
        steps: int,
        rows: int | None,
    ) -> list[Any]:
        """The batches of the `count` steps after `step`, drawn and checked here, agreed
        with every process in one exchange: each process's first failing step, the bytes
        of its largest batch (which size the next block alike on every process) and each
        step's row count (`-1`: a batch whose fields differ in rows). Where some process
        failed, or the processes' rows differ, the batches before that step are followed
        by a `_Failed` in its place, the same on every process."""
        outcome: bool | BaseException = True
        drawn: list[Any] = []
        try:
            for offset in range(1, count + 1):
                batch = _draw(batches, step + offset, steps, rows)
                check_on_host(objective, batch)
                drawn.append(batch)
        except Exception as error:
            outcome = error
        largest = max((_nbytes(batch) for batch in drawn), default=0)
        if not is_multiprocess():
            self._reading = _ahead_for(largest)
            if isinstance(outcome, BaseException):
                return [*drawn, _Failed(functools.partial(_reraise, outcome))]
            return drawn
        row = np.full(3 + count, -1, np.int64)
        row[0], row[1], row[2] = outcome is not True, len(drawn), largest
        row[3 : 3 + len(drawn)] = [rows_of([batch]) for batch in drawn]
        table = _allgather(row)
        self._reading = _ahead_for(int(table[:, 2].max()))
        failing = [int(got) for failed, got in table[:, :2] if failed]
        first = min(failing) if failing else len(drawn)  # steps every process holds
        for offset in range(first):
            counts = [int(value) for value in table[:, 3 + offset]]
            if len(set(counts)) > 1 or counts[0] < 0:
                differ = functools.partial(_rows_differ, counts, step + offset + 1)
                return [*drawn[:offset], _Failed(differ)]
        if failing:  # raised by the processes whose batch of that step failed
            mine = outcome if len(drawn) == first else True
            phase = f"reading the training batch of step {step + first + 1}"
            return [*drawn[:first], _Failed(functools.partial(agree_process_phase, phase, mine))]
        return drawn

    def agree_order(self, fingerprint: str | None) -> None:
        """Before the first draw of a step-indexed training source: every process reads the
        same order (`fingerprint`: its `StepBatches.fingerprint`, from the rows, the seed
        and the batch), else each process would slice another global batch. One exchange;
        every process raises the same `ValueError` when they differ. A source without a
        fingerprint is not checked."""
        if fingerprint is None or not is_multiprocess():
            return
        word = int.from_bytes(hashlib.blake2b(fingerprint.encode(), digest_size=7).digest())
        words = [int(value) for value in _allgather(np.array([word], np.int64))[:, 0]]
        if len(set(words)) > 1:
            shown = ", ".join(f"process {index}: {value:014x}" for index, value in enumerate(words))
            raise ValueError(
                "the processes' step-indexed training data differ (fingerprints of the rows, "
                f"seed and batch: {shown}); every process must read the same rows with the same "
                "seed and batch, so that its slice of each global batch is one order's."
            )


class _Failed:
    """In a fit's queue of agreed batches, in place of the first step whose batch failed on
    some process (or whose rows differ): `raise_on_every_process` raises its error, the
    same on every process, when the fit reaches that step."""

    def __init__(self, raising: Callable[[], object]) -> None:
        self.raise_on_every_process = raising


def _reraise(error: BaseException) -> None:
    raise error


def _rows_differ(counts: list[int], step: int) -> None:
    """Raise that the processes' training batches of `step` differ in rows (`counts`: each
    process's, `-1` for a batch whose fields differ)."""
    shown = ", ".join(
        f"process {index}: {'ragged fields' if count < 0 else f'{count} rows'}"
        for index, count in enumerate(counts)
    )
    raise ValueError(
        f"the processes' training batches of step {step} differ in rows ({shown}); under "
        "jax.distributed every process reads batches of the same row count, which one "
        "global batch joins in process order."
    )


def fit_setup(
    optimizer: optax.GradientTransformation,
    param_sharding: Any,
    strategy: Any,
    previewing: bool,
    tracker: Any,
    progress: bool,
) -> tuple[Placement | None, bool, Any, bool]:
    """A fit's placement (`None` for a plain one-process fit: see the module docstring)
    from the Trainer's optimizer, `param_sharding` and `strategy`, and this process's
    part: under `jax.distributed` process zero's tracker decides for every process whether
    the fit previews (a preview takes collectives), and only process zero keeps its
    tracker and prints. Returns the placement, `previewing`, `tracker` and `progress`."""
    placement = None
    if is_multiprocess() or param_sharding is not None or strategy is not None:
        placement = Placement(optimizer, param_sharding, strategy)
    if is_multiprocess():
        previewing = bool(broadcast_json(previewing))
        if not is_process_zero():  # only process zero writes tracking output and prints
            tracker, progress = None, False
    return placement, previewing, tracker, progress


def _nbytes(batch: Any) -> int:
    """The bytes of a drawn batch's arrays (a device array's read without fetching it)."""
    leaves = jax.tree.leaves(batch)
    return sum(
        int(leaf.nbytes if hasattr(leaf, "nbytes") else np.asarray(leaf).nbytes) for leaf in leaves
    )


def _ahead_for(largest: int) -> int:
    """Steps a block after the first draws ahead, its batches `largest` bytes at most:
    `_AHEAD_BYTES` of them, at least `_READ_AHEAD` and at most `_MAX_AHEAD`."""
    return int(min(_MAX_AHEAD, max(_READ_AHEAD, _AHEAD_BYTES // max(largest, 1))))


def rows_of(batches: list[Mapping[str, Any]]) -> int:
    """The row count every one of `batches` has, or `-1` when they differ."""
    found = {
        int(np.shape(leaf)[0])
        for batch in batches
        for leaf in jax.tree.leaves(batch)
        if np.ndim(leaf) > 0
    }
    return found.pop() if len(found) == 1 else -1
