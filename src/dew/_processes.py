"""The processes of a `jax.distributed` run: who is process zero, how they agree, how a
process's batch becomes one global batch. Below the core: imports no dew module.

In one process every function here is the identity or a local no-op, so single-process
code pays nothing for it. Under `jax.distributed` (more than one process):

- `agree_process_phase(name, ok)` gathers every process's outcome of a phase and raises
  the same error on all of them when any failed, so no process is left blocked in the
  next collective while another has raised.
- `agreed_phase(name)` is a block whose outcome every process agrees on the same way.
- `broadcast_json(value)` gives every process process zero's value (a decision only
  process zero can take: a sweep's next trial, whether a tracker previews).
- `data_mesh()`, `global_batch(batch)` and `replicated(tree)` place data on the
  data-parallel mesh over every device of every process: a batch's rows are sharded
  along the mesh (process `i`'s rows after process `i - 1`'s), everything else is
  replicated.
- `coordinated(batches)` yields a process's batches while *every* process still has one
  (the shortest coordinated prefix of the shards).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "PhaseFailedError",
    "agree_process_phase",
    "agreed_phase",
    "broadcast_json",
    "coordinated",
    "data_mesh",
    "global_batch",
    "is_multiprocess",
    "is_process_zero",
    "replicated",
]

# A phase outcome travels as a fixed-size byte row: the status, the error kind, the
# phase name's and the message's lengths, then the name and the message (truncated).
_NAME_BYTES = 128
_MESSAGE_BYTES = 896
_OK, _VALUE_ERROR, _OTHER_ERROR = 0, 1, 2


class PhaseFailedError(RuntimeError):
    """A phase failed on some process of a `jax.distributed` run (not a `ValueError`)."""


def is_multiprocess() -> bool:
    """Whether this is one of several processes of a `jax.distributed` run."""
    return jax.process_count() > 1


def is_process_zero() -> bool:
    """Whether this process writes (tracking output, run records, ledgers): process zero."""
    return jax.process_index() == 0


_EXCHANGES = itertools.count()
"""This process's count of `_allgather` calls: every process makes the same calls in the same
order (as they must make the same collectives), so the count names one exchange on all."""
_STORE_BYTES = 1 << 18  # larger rows (a pass's rows of data) go through the devices
_FOREVER_MS = 2**31 - 1  # a peer that died ends the run through JAX's heartbeats, not here


def _coordination_client() -> Any:
    """The `jax.distributed` coordination service's client, or `None` where JAX has none
    (the device gather is used then)."""
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - a JAX that moved it
        return None
    client = getattr(getattr(distributed, "global_state", None), "client", None)
    needed = ("key_value_set_bytes", "blocking_key_value_get_bytes", "key_value_delete")
    return client if all(hasattr(client, name) for name in needed) else None


def _exchange_key(index: int, process: int) -> str:
    """The store's key of `process`'s row of exchange `index`."""
    return f"dew.exchange.{index}.{process}"


def _allgather(row: np.ndarray) -> np.ndarray:
    """`row` (a small host array of the same shape and dtype on every process) of every
    process, stacked in process order: `(processes, *row.shape)`.

    The rows travel through the `jax.distributed` coordination service's key-value store,
    host to host: a gather on the devices (`process_allgather`) would queue behind the
    compiled steps already dispatched and make the host wait for them, so that a check
    agreed on every step would serialise the host's work with the devices' (decision 0076).
    Each process writes its row under the exchange's number and reads the others'; its row
    of the exchange before is deleted, which every process has read by then (it wrote
    this exchange's row after reading that one's). Without the store, or for a row over
    256 KiB (the store is for small messages), the device gather.
    """
    client = _coordination_client() if is_multiprocess() else None
    if client is None or np.asarray(row).nbytes > _STORE_BYTES:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(row))
    row = np.ascontiguousarray(row)
    index, rank = next(_EXCHANGES), jax.process_index()
    client.key_value_set_bytes(_exchange_key(index, rank), row.tobytes())
    rows = []
    for peer in range(jax.process_count()):
        data = client.blocking_key_value_get_bytes(_exchange_key(index, peer), _FOREVER_MS)
        if len(data) != row.nbytes:
            raise PhaseFailedError(
                f"exchange {index}: process {peer} sent {len(data)} bytes where process "
                f"{rank} sent {row.nbytes}; the processes are not at the same point of the "
                "program (they took different paths)."
            )
        rows.append(np.frombuffer(data, row.dtype).reshape(row.shape))
    if index:
        client.key_value_delete(_exchange_key(index - 1, rank))
    return np.stack(rows)


def _encode(text: str, size: int) -> bytes:
    data = text.encode("utf-8")
    if len(data) > size:  # cut at a character boundary, marked
        data = data[: size - 3].decode("utf-8", "ignore").encode("utf-8") + b"..."
    return data


def _names_a_path(error: BaseException | None) -> bool:
    return isinstance(error, OSError) and error.filename is not None and bool(error.strerror)


def _bad_input(error: BaseException | None) -> bool:
    """A `ValueError`, or an `OSError` naming the path it is about: the user's to fix."""
    return isinstance(error, ValueError) or _names_a_path(error)


def _error_text(error: BaseException) -> str:
    if isinstance(error, OSError) and _names_a_path(error):  # the path first, as dew's CLI
        return f"{os.fsdecode(error.filename)}: {error.strerror}"
    return str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"


def agree_process_phase(name: str, ok: bool | BaseException = True) -> None:
    """Agree with every other process that phase `name` went well here; raise on every
    process when it failed on any.

    Call it at the same point on every process, after local work that may fail and
    before the next collective (a gather, a compiled call over global arrays): `ok` is
    `True`, `False`, or the exception this process caught. When any process reports a
    failure, every process raises the same error, naming the phase, the failing process
    and its message: a `ValueError` when the first failing process's error was bad input
    (a `ValueError`, or an `OSError` naming its path: a file in the way, a link, a folder
    another run holds), else `PhaseFailedError`. On the failing process the original error is the
    cause. In one process it raises `ok` itself when `ok` is an exception (a
    `PhaseFailedError` when it is `False`) and otherwise returns at once.

    ```python
    >>> from dew.artifacts import agree_process_phase
    >>> agree_process_phase("preview setup", True)  # one process: nothing to agree on

    ```

    **Raises:** `ValueError` or `PhaseFailedError` as above; `PhaseFailedError` too when
    the processes are not at the same phase (a program whose processes took different
    paths), naming the phases each one reached.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"agree_process_phase needs a non-empty phase name, got {name!r}.")
    if not isinstance(ok, bool | BaseException):
        raise TypeError(
            f"agree_process_phase's ok must be True, False or an exception, got {ok!r}."
        )
    _agree(name, ok)


def _agree(name: str, ok: bool | BaseException, value: int = 0) -> list[int]:
    """`agree_process_phase`, also sharing one small integer per process (`0 <= value <
    256`): every process's, in process order, once all agreed."""
    local_error = ok if isinstance(ok, BaseException) else None
    if not is_multiprocess():
        if local_error is not None:
            raise local_error
        if ok is False:
            raise PhaseFailedError(f"{name} failed.")
        return [value]
    failed = local_error is not None or ok is False
    kind = _OK
    message = b""
    if failed:
        kind = _VALUE_ERROR if _bad_input(local_error) else _OTHER_ERROR
        text = "failed" if local_error is None else _error_text(local_error)
        message = _encode(text, _MESSAGE_BYTES)
    name_bytes = _encode(name, _NAME_BYTES)
    row = np.zeros(4 + _NAME_BYTES + _MESSAGE_BYTES, np.uint8)
    row[:4] = [int(failed), kind, len(name_bytes), value]
    row[4 : 4 + len(name_bytes)] = np.frombuffer(name_bytes, np.uint8)
    row[4 + _NAME_BYTES : 4 + _NAME_BYTES + len(message)] = np.frombuffer(message, np.uint8)
    rows = _allgather(row)
    names = [bytes(r[4 : 4 + int(r[2])]).decode("utf-8", "replace") for r in rows]
    if len(set(names)) != 1:
        reached = ", ".join(f"process {i} at {phase!r}" for i, phase in enumerate(names))
        raise PhaseFailedError(
            f"the processes of this run are not at the same phase ({reached}): every process "
            "must call agree_process_phase at the same points, in the same order."
        )
    failing = [index for index, r in enumerate(rows) if r[0]]
    if not failing:
        return [int(r[3]) for r in rows]
    first = rows[failing[0]]
    text = bytes(first[4 + _NAME_BYTES :]).rstrip(b"\0").decode("utf-8", "replace")
    others = failing[1:]
    also = f" (and on process {', '.join(map(str, others))})" if others else ""
    summary = f"{name} failed on process {failing[0]} of {len(rows)}{also}: {text}"
    error: BaseException = (
        ValueError(summary) if first[1] == _VALUE_ERROR else PhaseFailedError(summary)
    )
    error._dew_agreed = True  # type: ignore[attr-defined]  # every process raises it now
    if local_error is not None:
        raise error from local_error
    raise error


@contextlib.contextmanager
def agreed_phase(name: str) -> Iterator[None]:
    """The block as phase `name` of every process: once it is over (or raised), every
    process agrees on its outcome (`agree_process_phase`), so an error on one process
    raises on all of them. An error every process already agreed on (a phase inside the
    block failed) is raised as it is, on every process alike, not wrapped a second time.
    In one process it is the block alone."""
    if not is_multiprocess():
        yield
        return
    try:
        yield
    except Exception as error:
        if getattr(error, "_dew_agreed", False):
            raise
        agree_process_phase(name, error)
        raise
    agree_process_phase(name, True)


def broadcast_json(value: Any) -> Any:
    """Process zero's `value` (JSON data) on every process; `value` itself in one process.

    The other processes' `value` is ignored (pass `None`).
    """
    if not is_multiprocess():
        return value
    from jax.experimental import multihost_utils

    data = json.dumps(value).encode("utf-8") if is_process_zero() else b""
    length = int(_allgather(np.array([len(data)], np.int64))[0, 0])
    buffer = np.zeros(length, np.uint8)
    if is_process_zero():
        buffer[:] = np.frombuffer(data, np.uint8)
    shared = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return json.loads(bytes(shared).decode("utf-8"))


@functools.cache
def _mesh(devices: tuple[Any, ...]) -> jax.sharding.Mesh:
    return jax.sharding.Mesh(np.array(devices), ("data",))


def data_mesh() -> jax.sharding.Mesh:
    """The data-parallel mesh: every device of every process along one axis, `"data"`."""
    return _mesh(tuple(jax.devices()))


@functools.cache
def _named(mesh: jax.sharding.Mesh, *spec: str) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def batch_sharding() -> jax.sharding.NamedSharding:
    """Rows sharded along the data mesh."""
    return _named(data_mesh(), "data")


def replicated_sharding() -> jax.sharding.NamedSharding:
    """A copy on every device of the data mesh."""
    return _named(data_mesh())


def _host_leaf(leaf: Any) -> np.ndarray:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        raise ValueError(
            "a process's batch must hold process-local data (NumPy arrays, or arrays on "
            f"this process's devices), got a global array of shape {leaf.shape}."
        )
    return np.asarray(leaf)


@functools.cache
def _batch_layout(
    mesh: jax.sharding.Mesh,
) -> tuple[jax.sharding.NamedSharding, jax.sharding.NamedSharding, int]:
    """A batch's row and scalar shardings over `mesh`, and how many of this process's
    devices share its rows (its share of the `"data"` axis)."""
    devices = jax.local_device_count() * int(mesh.shape["data"]) // mesh.devices.size
    return _named(mesh, "data"), _named(mesh), max(1, devices)


def global_batch(batch: Mapping[str, Any], mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
    """This process's `batch` as one global batch over the data mesh: every array with a
    row axis sharded by rows (the processes' rows joined in process order), scalars
    replicated (the same on every process). Every process calls it with batches of one
    structure and one row count, which the local device count divides. Given a `mesh` with
    a `"data"` axis (a `Trainer`'s), the rows are sharded along that axis of it (and copied
    along its others), and the row count must divide by this process's share of that axis."""
    mesh = data_mesh() if mesh is None else mesh
    sharded, copied, devices = _batch_layout(mesh)

    def place(path: Any, leaf: Any) -> jax.Array:
        array = _host_leaf(leaf)
        if array.ndim == 0:
            return jax.make_array_from_process_local_data(copied, array)
        if array.shape[0] % devices:
            raise ValueError(
                f"batch field {jax.tree_util.keystr(path)} has {array.shape[0]} rows in this "
                f"process, which its {devices} devices cannot share evenly: read batches whose "
                "rows are a multiple of the local device count."
            )
        return jax.make_array_from_process_local_data(sharded, array)

    return jax.tree_util.tree_map_with_path(place, dict(batch))


def replicated(tree: Any) -> Any:
    """Every array of `tree` as a global array replicated over the data mesh (each process
    passes the same values: the same params, the same key)."""
    sharding = replicated_sharding()

    def place(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic):
            return leaf
        if isinstance(leaf, jax.Array) and leaf.sharding == sharding:
            return leaf
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = replicated(jax.random.key_data(leaf))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        return jax.make_array_from_process_local_data(sharding, np.asarray(leaf))

    return jax.tree.map(place, tree)


class Coordinated:
    """`coordinated(batches)`: this process's batches while every process has one.

    After the iteration, `uneven` says whether some process still had a batch when
    another had run out (the rest of its shard never entered the pass).
    """

    def __init__(self, batches: Iterable[Mapping[str, Any]]) -> None:
        self._batches = iter(batches)
        self.uneven = False

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        if not is_multiprocess():
            yield from self._batches
            return
        while True:
            error: BaseException | None = None
            batch = None
            try:
                batch = next(self._batches)
            except StopIteration:
                pass
            except Exception as caught:  # a failing loader: every process raises it
                error = caught
            have = _agree(
                "reading a validation batch",
                error if error is not None else True,
                int(batch is not None),
            )
            if not all(have) or batch is None:  # all(have): this process has its batch
                self.uneven = any(have)
                return
            yield batch


def coordinated(batches: Iterable[Mapping[str, Any]]) -> Coordinated:
    """This process's `batches`, stopping (on every process) at the first batch index
    some process has no batch for; see `Coordinated`."""
    return Coordinated(batches)
