"""The pass reducer: score a batch and merge its metric statistics in one compiled call.

Every evaluation in dew (`evaluate`, the Trainer's validation events, `dew eval`, the
recipe's evaluations) runs a pass through `run_pass`. For each batch one compiled call
scores it with the objective and merges the device metrics' statistics into the
accumulator, whose buffers are donated, so a pass costs one dispatch per batch and one
host transfer at its end, as a hand-written jitted loop would. The call is compiled once
per structure of objective, parameters, metric set and batch, and reused across passes.
Host metrics (NumPy float64 state) merge each batch's artifact on the host.
"""

import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import ArrayLike, Int, PRNGKeyArray, PyTree

from dew._checks import batch_error, explain_failure, failed_check, ids_checked_on_host
from dew._domains import SCORING_DOMAIN
from dew.artifacts import Artifact
from dew.metrics import MetricSet
from dew.objectives.base import Objective

__all__ = ["SCORING_DOMAIN", "PassResult", "run_pass", "scoring_key"]


@dataclasses.dataclass(frozen=True)
class PassResult:
    """What one pass produced.

    - `scores`: bare metric name to value (empty for an empty pass or no metrics).
    - `batches`: how many batches the pass consumed; `records`: the rows they held.
    - `first_artifact`: the first batch's scoring artifact when it was asked for (a
      preview reuses it) or when there were host metrics, else `None`.
    - `first_batch`: the first batch itself (`None` for an empty pass).
    """

    scores: dict[str, float]
    batches: int
    records: int
    first_artifact: Artifact | None
    first_batch: Mapping[str, Any] | None


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
        return jax.tree.leaves(state), (artifact if spec.keep else None)

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
        self.variants: dict[tuple[bool, bool], Callable[..., Any]] = {}
        # Bound once: looking a method up on an Equinox module costs ~30 us, a quarter
        # of a small batch's whole call.
        self.check_batch = objective.check_batch

    def variant(self, keep: bool, checked_on_host: bool) -> Callable[..., Any]:
        variant = self.variants.get((keep, checked_on_host))
        if variant is None:
            spec = dataclasses.replace(self.spec, keep=keep, checked_on_host=checked_on_host)
            variant = self.variants[keep, checked_on_host] = self.updates(spec)
        return variant


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
    When a compiled call fails (a check inside it fired), the objective's host-side
    checks run on that batch and their `ValueError` is raised instead (`explain_failure`).
    A failure that surfaces only at the final fetch re-checks the last batch, else raises
    the traced check's own message (`failed_check`).
    """
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
