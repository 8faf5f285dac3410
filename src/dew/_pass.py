"""The pass reducer: score a batch and merge its metric statistics in one compiled call.

Every evaluation in dew (`evaluate`, the Trainer's validation events, `dew eval`, the
recipe's evaluations) runs a pass through `run_pass`. For each batch one compiled call
scores it with the objective and merges the device metrics' statistics into the
accumulator, whose buffers are donated, so a pass costs one dispatch per batch and one
host transfer at its end, as a hand-written jitted loop would. The call is compiled once
per structure of objective, parameters, metric set and batch, and reused across passes.
Host metrics (NumPy float64 state) merge each batch's artifact on the host.

Under `jax.distributed` (more than one process) every process runs the pass over its own
shard: the processes read the shortest coordinated prefix of their shards
(`dew._processes.coordinated`), check each local batch on the host and agree on the
outcome before anything collective runs, place it as one global batch, and run the same
compiled call over global arrays, so the device metrics reduce over every process's rows.
Only process zero updates and finalizes the host metrics (on the artifacts gathered by
`collective_host`) and shares their values; every process returns the same result.
"""

import dataclasses
import functools
import hashlib
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import ArrayLike, Int, PRNGKeyArray, PyTree

from dew._checks import batch_error, explain_failure, failed_check, ids_checked_on_host
from dew._domains import SCORING_DOMAIN
from dew._processes import (
    _agree,
    _allgather,
    agree_process_phase,
    broadcast_json,
    coordinated,
    global_batch,
    is_multiprocess,
    is_process_zero,
    replicated,
    replicated_sharding,
)
from dew.artifacts import Artifact, collective_host
from dew.metrics import MetricSet
from dew.objectives.base import Objective

__all__ = ["SCORING_DOMAIN", "PassResult", "preview_on_process_zero", "run_pass", "scoring_key"]


@dataclasses.dataclass(frozen=True)
class PassResult:
    """What one pass produced.

    - `scores`: bare metric name to value (empty for an empty pass or no metrics).
    - `batches`: how many batches the pass consumed (the coordinated batches); `records`:
      the rows they held, counted on the placed global batch (every process's rows).
    - `first_artifact`: the first batch's scoring artifact when it was asked for (a
      preview reuses it) or when there were host metrics, else `None`.
    - `first_batch`: the first batch itself (`None` for an empty pass); under
      `jax.distributed`, the placed global batch.
    - `uneven_shards`: whether some process still had a batch when another's shard had
      ended (its remaining rows never entered the metrics); always `False` in one process.
    """

    scores: dict[str, float]
    batches: int
    records: int
    first_artifact: Artifact | None
    first_batch: Mapping[str, Any] | None
    uneven_shards: bool = False


def scoring_key(key: PRNGKeyArray, batch_index: int | Int[ArrayLike, ""]) -> PRNGKeyArray:
    """The key batch `batch_index` of a pass is scored with, in the scoring domain."""
    return jax.random.fold_in(jax.random.fold_in(key, SCORING_DOMAIN), batch_index)


def _rows(batch: Mapping[str, Any]) -> int:
    """The rows of a batch: the leading axis of its arrays (scalar metadata adds none)."""
    for leaf in jax.tree.leaves(batch):
        shape = np.shape(leaf)
        if shape:
            return int(shape[0])
    raise ValueError("an evaluation batch holds no arrays with a row axis.")


def _on_host(batch: Mapping[str, Any]) -> bool:
    """Whether every array of `batch` is a NumPy array (checked on the host for free)."""
    return all(not isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(batch))


def _update_function(objective_def: Any, objective_static: Any):
    """The compiled score-and-merge calls of one objective structure, one per `_Spec`.

    The spec is bound when a pass starts, not passed as a static argument of each call:
    hashing and comparing it (a metric set's static fields) on every batch would cost
    more than the batch's dispatch.
    """

    def update(
        accumulator: list,
        batch: Any,
        index: Any,
        key: Any,
        params: list,
        objective_leaves: list,
        metric_leaves: list,
        spec: "_Spec",
    ):
        objective = eqx.combine(
            jax.tree.unflatten(objective_def, objective_leaves), objective_static
        )
        metrics = spec.metrics(metric_leaves)
        with ids_checked_on_host(spec.checked_on_host):
            artifact = objective.evaluate(
                jax.tree.unflatten(spec.params_def, params), batch, scoring_key(key, index)
            )
        state = metrics.update(jax.tree.unflatten(spec.accumulator_def, accumulator), artifact)
        leaves = jax.tree.leaves(state)
        if spec.replicate:  # every process holds the whole accumulator, to finalize locally
            leaves = jax.lax.with_sharding_constraint(leaves, replicated_sharding())
        return leaves, (artifact if spec.keep else None)

    @functools.lru_cache(maxsize=64)
    def specialised(spec: "_Spec") -> Callable[..., Any]:
        return jax.jit(functools.partial(update, spec=spec), donate_argnums=0)

    return specialised


_shared_update = functools.lru_cache(maxsize=32)(_update_function)
# Each objective object's compiled calls and array leaves, found by identity: an
# objective is immutable, and partitioning a model and hashing its static structure on
# every pass would cost more than the pass's dispatches.
_updates: dict[int, tuple[weakref.ref, Callable[..., Any], list]] = {}


def _update_for(objective: Objective) -> tuple[Callable[..., Any], list]:
    """The objective's compiled updates (a function of a `_Spec`) and its array leaves."""
    entry = _updates.get(id(objective))
    if entry is not None and entry[0]() is objective:
        return entry[1], entry[2]
    arrays, static = eqx.partition(objective, eqx.is_array)
    leaves, objective_def = jax.tree.flatten(arrays)
    try:  # objectives of one structure share their compiled calls
        update = _shared_update(objective_def, static)
    except TypeError:  # an unhashable static field: compile for this objective alone
        update = _update_function(objective_def, static)
    identity = id(objective)
    try:
        reference = weakref.ref(objective, lambda _: _updates.pop(identity, None))
    except TypeError:  # not weakly referenceable: look it up by structure each time
        return update, leaves
    _updates[identity] = (reference, update, leaves)
    return update, leaves


@dataclasses.dataclass(frozen=True)
class _Spec:
    """The static half of a pass: structures of the accumulator, params and metrics."""

    accumulator_def: Any
    params_def: Any
    metrics_def: Any
    metrics_static: Any
    keep: bool
    checked_on_host: bool = False
    replicate: bool = False

    def metrics(self, leaves: list) -> MetricSet:
        return eqx.combine(jax.tree.unflatten(self.metrics_def, leaves), self.metrics_static)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _init(metric_leaves: list, metrics_def: Any, metrics_static: Any) -> Any:
    return eqx.combine(jax.tree.unflatten(metrics_def, metric_leaves), metrics_static).init()


def _finalize(accumulator: list, metric_leaves: list, spec: _Spec) -> dict[str, Any]:
    metrics = spec.metrics(metric_leaves)
    return metrics.finalize(jax.tree.unflatten(spec.accumulator_def, accumulator))


@functools.lru_cache(maxsize=64)
def _finalizer(spec: _Spec) -> Callable[..., Any]:
    """The compiled finalize of one spec, bound (not a static argument hashed per call)."""
    return jax.jit(functools.partial(_finalize, spec=spec))


@jax.jit
def _fresh(leaves: list) -> list:
    """New buffers holding `leaves` (a pass's accumulator is donated call by call)."""
    return [leaf.copy() for leaf in leaves]


class _Plan:
    """What every pass of one (objective, device metric set, params structure) reuses:
    the compiled calls, the objective's and metrics' leaves, the empty accumulator."""

    def __init__(self, objective: Objective, metrics: MetricSet, params_def: Any) -> None:
        self.updates, self.objective_leaves = _update_for(objective)
        metric_arrays, metrics_static = eqx.partition(metrics, eqx.is_array)
        self.metric_leaves, metrics_def = jax.tree.flatten(metric_arrays)
        initial = _init(self.metric_leaves, metrics_def, metrics_static)
        self.initial, accumulator_def = jax.tree.flatten(initial)
        self.spec = _Spec(accumulator_def, params_def, metrics_def, metrics_static, keep=False)
        self.finalize = _finalizer(self.spec)
        self.variants: dict[tuple[bool, bool | str], Callable[..., Any]] = {}
        # Bound once: looking a method up on an Equinox module costs ~30 us, a quarter
        # of a small batch's whole call.
        self.check_batch = objective.check_batch
        self.global_leaves: tuple[list, list] | None = None  # under jax.distributed

    def variant(self, keep: bool, checked_on_host: bool) -> Callable[..., Any]:
        variant = self.variants.get((keep, checked_on_host))
        if variant is None:
            spec = dataclasses.replace(self.spec, keep=keep, checked_on_host=checked_on_host)
            variant = self.variants[keep, checked_on_host] = self.updates(spec)
        return variant

    def global_variant(self, keep: bool) -> Callable[..., Any]:
        """The call over global arrays (batches checked on the host, the accumulator
        replicated), under `jax.distributed`."""
        variant = self.variants.get((keep, "global"))
        if variant is None:
            spec = dataclasses.replace(self.spec, keep=keep, checked_on_host=True, replicate=True)
            variant = self.variants[keep, "global"] = self.updates(spec)
        return variant

    def replicated_leaves(self) -> tuple[list, list]:
        """The objective's and the metrics' array leaves replicated over the data mesh."""
        if self.global_leaves is None:
            self.global_leaves = (
                _everywhere(self.objective_leaves),
                _everywhere(self.metric_leaves),
            )
        return self.global_leaves


# Plans and host/device splits found by the identity of their (immutable) objective and
# metric set, as `_updates` finds compiled calls: building them costs a small pass's time.
_plans: dict[tuple[int, int], tuple[weakref.ref, weakref.ref, dict[Any, _Plan]]] = {}
_splits: dict[int, tuple[weakref.ref, tuple[MetricSet, MetricSet]]] = {}


def _plan_for(objective: Objective, metrics: MetricSet, params_def: Any) -> _Plan:
    identity = (id(objective), id(metrics))
    entry = _plans.get(identity)
    if entry is None or entry[0]() is not objective or entry[1]() is not metrics:
        try:
            forget = lambda _: _plans.pop(identity, None)  # noqa: E731
            entry = (weakref.ref(objective, forget), weakref.ref(metrics, forget), {})
        except TypeError:  # not weakly referenceable: plan this pass alone
            return _Plan(objective, metrics, params_def)
        _plans[identity] = entry
    plan = entry[2].get(params_def)
    if plan is None:
        plan = entry[2][params_def] = _Plan(objective, metrics, params_def)
    return plan


def _split(metrics: MetricSet) -> tuple[MetricSet, MetricSet]:
    """`metrics.split_by_host()`, remembered for the metric set's lifetime."""
    entry = _splits.get(id(metrics))
    if entry is not None and entry[0]() is metrics:
        return entry[1]
    split = metrics.split_by_host()
    identity = id(metrics)
    try:
        reference = weakref.ref(metrics, lambda _: _splits.pop(identity, None))
    except TypeError:
        return split
    _splits[identity] = (reference, split)
    return split


class _Reducer:
    """One pass's accumulator over the compiled calls of its plan."""

    def __init__(
        self, objective: Objective, params: PyTree, metrics: MetricSet, key: PRNGKeyArray
    ) -> None:
        self.metrics = metrics
        self.key = key
        self.params, params_def = jax.tree.flatten(params)
        plan = _plan_for(objective, metrics, params_def)
        self.plan = plan
        self.objective_leaves, self.metric_leaves = plan.objective_leaves, plan.metric_leaves
        self.spec, self.check_batch = plan.spec, plan.check_batch
        self.accumulator = _fresh(plan.initial)

    def _variant(self, keep: bool, checked_on_host: bool) -> Callable[..., Any]:
        return self.plan.variant(keep, checked_on_host)

    def add(self, batch: Mapping[str, Any], index: int, keep: bool) -> Artifact | None:
        """Score `batch` and merge its statistics; the artifact when `keep`."""
        # Host batches are checked on the host by the objective's own checks, and scored
        # by a variant compiled without the traced ID checks.
        checked = _on_host(batch)
        if checked:
            self.check_batch(batch)  # raises the objective's own ValueError
        self.accumulator, artifact = self._variant(keep, checked)(
            self.accumulator,
            batch,
            index,
            self.key,
            self.params,
            self.objective_leaves,
            self.metric_leaves,
        )
        return artifact

    def finalize(self) -> dict[str, Any]:
        if not self.metrics.metrics:
            return {}
        return self.plan.finalize(self.accumulator, self.metric_leaves)


def run_pass(
    objective: Objective,
    params: PyTree,
    batches: Iterable[Mapping[str, Any]],
    metrics: MetricSet,
    key: PRNGKeyArray,
    *,
    keep_first_artifact: bool = False,
) -> PassResult:
    """Score and reduce one pass of `batches` with `metrics`.

    Batch `i` is scored with `scoring_key(key, i)`. Device metrics reduce in one
    compiled call per batch (scoring included, the accumulator donated) and are
    fetched once at the end; host metrics merge each batch's artifact on the host.
    With no metrics nothing is scored (batches and records are still counted).
    `keep_first_artifact` returns the first batch's scoring artifact (for a preview).
    Under `jax.distributed` every process calls it with its own shard (see the module's
    docstring) and gets the same result.
    When a compiled call fails (a check inside it fired), the objective's host-side
    checks run on that batch and their `ValueError` is raised instead (`explain_failure`).
    A failure that surfaces only at the final fetch re-checks the last batch, else raises
    the traced check's own message (`failed_check`).
    """
    if is_multiprocess():
        return _run_pass_processes(objective, params, batches, metrics, key, keep_first_artifact)
    device, host = _split(metrics)
    names = metrics.names
    reducer = _Reducer(objective, params, device, key) if names else None
    on_host = bool(host.metrics)
    host_state = host.init() if on_host else None
    first_artifact = first_batch = None
    count = records = 0
    for index, batch in enumerate(batches):
        records += _rows(batch)
        if first_batch is None:
            first_batch = batch
        if reducer is not None:
            keep = on_host or (index == 0 and keep_first_artifact)
            try:  # a host metric fetches the artifact: a failed call surfaces there
                artifact = reducer.add(batch, index, keep)
                if on_host:
                    host_state = host.update(host_state, artifact)
            except Exception:  # a check fired in the call: raise the objective's own error
                with explain_failure(objective, batch):
                    raise
            if index == 0 and keep:
                first_artifact = artifact
        count += 1
    if count == 0 or reducer is None:
        return PassResult({}, count, records, first_artifact, first_batch)
    host_values = host.finalize(host_state) if on_host else {}
    try:  # fetched here: a check that fired in a call may surface only at the fetch
        values = jax.device_get(reducer.finalize() | host_values)
    except Exception as error:  # the last batch re-checked, else the check's own message
        explained = batch_error(objective, batch) or failed_check(error)
        if explained is None:
            raise
        raise explained from None
    scores = {name: float(values[name]) for name in names}
    return PassResult(scores, count, records, first_artifact, first_batch)


# --- several processes (jax.distributed) --------------------------------------------------


def _everywhere(tree: PyTree) -> PyTree:
    """`tree` as global arrays: arrays already spread over the processes stay as they are
    (a user-given sharding), every other array is replicated over the data mesh."""

    def place(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return leaf
        return replicated(leaf)

    return jax.tree.map(place, tree)


def _local(leaf: Any) -> Any:
    """This process's copy of a replicated global array (what finalizing reads)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return leaf.addressable_data(0)
    return leaf


def _layout(batch: Mapping[str, Any]) -> str:
    """A batch's fields, shapes and dtypes: what every process's batch must share."""
    paths_leaves = jax.tree_util.tree_flatten_with_path(dict(batch))[0]
    return ", ".join(
        f"{jax.tree_util.keystr(path)} {tuple(np.shape(leaf))} {np.result_type(leaf)}"
        for path, leaf in paths_leaves
    )


def _gather_texts(text: str) -> list[str]:
    """Every process's `text`, in process order."""
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    lengths = _allgather(np.array([len(data)], np.int64)).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: len(data)] = data
    rows = _allgather(padded)
    return [bytes(row[:n]).decode("utf-8", "replace") for row, n in zip(rows, lengths, strict=True)]


def _place(objective: Objective, batch: Mapping[str, Any], index: int) -> dict[str, Any]:
    """This process's batch `index`, checked on the host by the objective's own checks,
    the outcome and the batch's layout agreed by every process, placed as one global
    batch. A bad batch on any process raises the same `ValueError` on every process."""
    outcome: bool | BaseException = True
    placed: dict[str, Any] = {}
    layout = ""
    try:
        objective.check_batch(batch)
        layout = _layout(batch)
        placed = global_batch(batch)
    except Exception as error:
        outcome = error
    # One exchange in the common case: each process's outcome beside its layout's digest;
    # only when some process failed do they agree on (and raise) its error.
    row = np.zeros(17, np.uint8)
    row[0] = outcome is not True
    row[1:] = np.frombuffer(hashlib.sha256(layout.encode("utf-8")).digest()[:16], np.uint8)
    rows = _allgather(row)
    if rows[:, 0].any():
        agree_process_phase(f"checking validation batch {index}", outcome)
    if any(bytes(digest) != bytes(rows[0, 1:]) for digest in rows[:, 1:]):
        layouts = _gather_texts(layout)
        shown = "; ".join(f"process {i}: {text}" for i, text in enumerate(layouts))
        raise ValueError(
            f"validation batch {index} differs between the processes ({shown}): every "
            "process must read batches of the same fields, dtypes and row count (batch "
            "each shard with one batch size, and drop or pad a shorter last batch)."
        )
    return placed


def _host_scores(host: MetricSet, state: Any, zero: bool) -> dict[str, float]:
    """The host metrics' values: finalized on process zero, the outcome agreed, the
    values (non-finite ones included) shared with every process."""
    values: dict[str, float] | None = None
    outcome: bool | BaseException = True
    if zero:
        try:
            finalized = jax.device_get(host.finalize(state))
            values = {name: float(finalized[name]) for name in host.names}
        except Exception as error:
            outcome = error
    agree_process_phase("finalizing the host metrics on process 0", outcome)
    return broadcast_json(values)


def _run_pass_processes(
    objective: Objective,
    params: PyTree,
    batches: Iterable[Mapping[str, Any]],
    metrics: MetricSet,
    key: PRNGKeyArray,
    keep_first_artifact: bool,
) -> PassResult:
    """`run_pass` under `jax.distributed`: every process calls it with its own shard."""
    # Every process must keep the first artifact if any does (a tracker may live on
    # process zero alone): the compiled calls must be the same on every process.
    keep_first_artifact = any(_agree("starting a validation pass", True, int(keep_first_artifact)))
    device, host = _split(metrics)
    names = metrics.names
    on_host = bool(host.metrics)
    zero = is_process_zero()
    plan = _plan_for(objective, device, jax.tree.structure(params)) if names else None
    if plan is not None:
        objective_leaves, metric_leaves = plan.replicated_leaves()
        global_params = jax.tree.leaves(_everywhere(params))
        global_key = _everywhere(key)
        accumulator = replicated(plan.initial)
    host_state = None
    if on_host:
        outcome: bool | BaseException = True
        if zero:
            try:
                host_state = host.init()
            except Exception as error:
                outcome = error
        agree_process_phase("starting the host metrics on process 0", outcome)
    first_artifact = first_batch = None
    count = records = 0
    shards = coordinated(batches)
    for index, local in enumerate(shards):
        batch = _place(objective, local, index)
        records += _rows(batch)
        if first_batch is None:
            first_batch = batch
        if plan is not None:
            keep = on_host or (index == 0 and keep_first_artifact)
            accumulator, artifact = plan.global_variant(keep)(
                accumulator,
                batch,
                index,
                global_key,
                global_params,
                objective_leaves,
                metric_leaves,
            )
            if on_host:  # gathered on every process, merged on process zero alone
                gathered = collective_host(artifact)
                outcome = True
                if zero:
                    try:
                        host_state = host.update(host_state, gathered)
                    except Exception as error:
                        outcome = error
                agree_process_phase(f"host metrics on process 0, batch {index}", outcome)
            if index == 0 and keep:
                first_artifact = artifact
        count += 1
    uneven = shards.uneven
    if count == 0 or plan is None:
        return PassResult({}, count, records, first_artifact, first_batch, uneven)
    # Finalized by every process on its own copy of the replicated accumulator: the same
    # values everywhere, so a pass with no counted target raises the same error on each.
    try:
        values = jax.device_get(
            plan.finalize([_local(leaf) for leaf in accumulator], plan.metric_leaves)
            if device.metrics
            else {}
        )
    except Exception as error:
        explained = batch_error(objective, local) or failed_check(error)
        if explained is None:
            raise
        raise explained from None
    if on_host:
        values |= _host_scores(host, host_state, zero)
    scores = {name: float(values[name]) for name in names}
    return PassResult(scores, count, records, first_artifact, first_batch, uneven)


def _preview(
    objective: Objective, params: PyTree, batch: Any, key: PRNGKeyArray, scored: Any
) -> Artifact:
    # Traced under ids_checked_on_host: run_pass checked the batch on every process's
    # host before placing it, so no traced check (a host callback) enters the call.
    return objective.preview(params, batch, key, scored=scored)


_compiled_preview = eqx.filter_jit(_preview)


def preview_on_process_zero(
    objective: Objective,
    params: PyTree,
    batch: Mapping[str, Any],
    key: PRNGKeyArray,
    scored: Artifact | None = None,
) -> Artifact | None:
    """The preview artifact of an evaluation event, for process zero to log.

    In one process it is `objective.preview(params, batch, key, scored=scored)`, as it
    always was. Under `jax.distributed` every process calls it at the same point, with
    the placed global first batch and first artifact of `run_pass` (`PassResult`'s
    `first_batch` and `first_artifact`) and the same params and key: every process
    takes part in the preview's generation (one compiled call over global arrays), the
    processes agree on the outcome of the local setup (placing the objective, params
    and key) and of the generation before the artifact is gathered with
    `collective_host`, so a failure on one process raises the same error on every
    process instead of leaving the others blocked in the gather. Process zero gets the
    artifact on the host (NumPy arrays, every gather finished, ready to decode), the
    other processes `None`. The preview is traced into that call, so an objective's
    `generate_preview` must be traceable (JAX operations on its arguments, no NumPy
    reads of the batch): the built-in ones are.
    """
    if not is_multiprocess():
        return objective.preview(params, batch, key, scored=scored)
    outcome: bool | BaseException = True
    placed: tuple[Any, ...] = ()
    try:
        arrays, static = eqx.partition(objective, eqx.is_array)
        placed = (
            eqx.combine(_everywhere(arrays), static),
            _everywhere(params),
            _everywhere(dict(batch)),
            _everywhere(key),
            None if scored is None else _everywhere(scored),
        )
    except Exception as error:
        outcome = error
    agree_process_phase("preview setup", outcome)
    artifact: Any = None
    outcome = True
    try:
        with ids_checked_on_host():
            artifact = _compiled_preview(*placed)
        if not isinstance(artifact, Artifact):
            raise TypeError(
                f"{type(objective).__name__}'s preview must be a dew artifact, got "
                f"{type(artifact).__name__}."
            )
        jax.block_until_ready(artifact)
    except Exception as error:
        outcome = error
    agree_process_phase("preview generation", outcome)
    gathered = collective_host(artifact)
    return gathered if is_process_zero() else None
