"""One process's pass machinery: the compiled score-and-merge calls, their plans, the
reducer, and `OneProcess`, `run_pass`'s strategy in one process.

For each batch one compiled call scores it with the objective and merges the device
metrics' statistics into the accumulator, whose buffers are donated. The calls are compiled
once per structure of objective, parameters, metric set and batch (`dew._compiled_calls`);
a `_Plan` holds what every pass of one objective, metric set and params structure reuses,
found by identity.
"""

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray, PyTree

from dew._checks import explain_failure, held_on_host, ids_checked_on_host
from dew._compiled_calls import ByIdentity, CompiledCalls, partitioned
from dew._pass._placing import _everywhere
from dew._pass._result import scoring_key
from dew._precision import with_precision
from dew._processes import batch_sharding, data_mesh, replicated_sharding
from dew.artifacts import Artifact
from dew.metrics import MetricSet
from dew.naming import Split
from dew.objectives.base import Objective, check_batch_keys, check_on_host

_T = TypeVar("_T")


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
        # Under a bfloat16 policy (decision 0078) the params and the batch are cast to the
        # compute dtype and the artifact comes back float32, for the metrics to reduce.
        evaluate = with_precision(objective.evaluate, spec.precision)
        with ids_checked_on_host(spec.checked_on_host):
            artifact = evaluate(
                jax.tree.unflatten(spec.params_def, params), batch, scoring_key(key, index)
            )
        accumulated = jax.tree.unflatten(spec.accumulator_def, accumulator)
        if spec.devices:  # each device merges its own rows (decision 0089)
            state = _update_per_device(metrics, accumulated, artifact, spec.devices)
            leaves = jax.lax.with_sharding_constraint(jax.tree.leaves(state), batch_sharding())
        else:
            leaves = jax.tree.leaves(metrics.update(accumulated, artifact))
        if spec.replicate and not spec.devices:  # every process holds the whole accumulator
            leaves = jax.lax.with_sharding_constraint(leaves, replicated_sharding())
        return leaves, (artifact if spec.keep else None)

    @functools.lru_cache(maxsize=64)
    def specialised(spec: "_Spec") -> Callable[..., Any]:
        return jax.jit(functools.partial(update, spec=spec), donate_argnums=0)

    return specialised


def _update_per_device(
    metrics: MetricSet, accumulated: Any, artifact: Artifact, devices: int
) -> Any:
    """`accumulated` (each leaf with a leading axis of `devices`, sharded along the data
    mesh) with each device's rows of `artifact` merged into its own accumulator: the
    statistics of the rows a device holds, computed where they are, with no collective.
    An artifact whose leaves do not split evenly into `devices` row blocks (or have no
    row axis) merges the whole batch's statistics into the first device's accumulator."""
    leaves = jax.tree.leaves(artifact)
    if leaves and all(jnp.ndim(leaf) >= 1 and jnp.shape(leaf)[0] % devices == 0 for leaf in leaves):
        parts = jax.tree.map(
            lambda leaf: leaf.reshape(devices, leaf.shape[0] // devices, *leaf.shape[1:]),
            artifact,
        )
        parts = jax.lax.with_sharding_constraint(parts, batch_sharding())
        contributions = jax.vmap(metrics.statistics)(parts)
    else:
        whole, empty = metrics.statistics(artifact), metrics.init()
        contributions = jax.tree.map(
            lambda first, unit: jnp.concatenate(
                [first[None], jnp.broadcast_to(unit, (devices - 1, *jnp.shape(unit)))]
            ),
            whole,
            empty,
        )
    return jax.vmap(metrics.merge)(accumulated, contributions)


# Objectives of one structure share their compiled calls. An evaluation's passes find them
# through their plan (`_plans`), by the objective's identity; a plan is built once per
# objective, metric set and params structure, so the calls need no identity layer of their
# own (decision 0082).
_updates = CompiledCalls(_update_function)


def _update_for(objective: Objective) -> tuple[Callable[..., Any], list]:
    """The objective's compiled updates (a function of a `_Spec`) and its array leaves."""
    leaves, objective_def, static = partitioned(objective)
    return _updates(objective_def, static), leaves


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
    precision: str = "float32"
    devices: int = 0  # > 0: an accumulator on each of the data mesh's devices (decision 0089)

    def metrics(self, leaves: list) -> MetricSet:
        return eqx.combine(jax.tree.unflatten(self.metrics_def, leaves), self.metrics_static)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _init(metric_leaves: list, metrics_def: Any, metrics_static: Any) -> Any:
    return eqx.combine(jax.tree.unflatten(metrics_def, metric_leaves), metrics_static).init()


def _spread(accumulator: list, devices: int) -> list:
    """`devices` copies of `accumulator` (the empty one), one on each device of the mesh."""
    return [jnp.broadcast_to(leaf, (devices, *jnp.shape(leaf))) for leaf in accumulator]


def _gather(accumulator: list, metric_leaves: list, spec: _Spec) -> list:
    """The devices' accumulators merged in device order, as one replicated accumulator."""
    metrics = spec.metrics(metric_leaves)
    state = jax.tree.unflatten(spec.accumulator_def, accumulator)
    total = jax.tree.map(lambda leaf: leaf[0], state)
    for device in range(1, spec.devices):
        total = metrics.merge(total, jax.tree.map(lambda leaf, d=device: leaf[d], state))
    return jax.tree.leaves(total)


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
        # (not the set itself: a plan is remembered only while its metric set lives)
        flat = metrics.flat_metrics
        self.split_invariant = bool(flat) and all(metric.split_invariant for metric in flat)
        metric_arrays, metrics_static = eqx.partition(metrics, eqx.is_array)
        self.metric_leaves, metrics_def = jax.tree.flatten(metric_arrays)
        initial = _init(self.metric_leaves, metrics_def, metrics_static)
        self.initial, accumulator_def = jax.tree.flatten(initial)
        self.spec = _Spec(accumulator_def, params_def, metrics_def, metrics_static, keep=False)
        self.finalize = _finalizer(self.spec)
        self.variants: dict[tuple[bool, bool | str, str], Callable[..., Any]] = {}
        self.global_leaves: tuple[list, list] | None = None  # under jax.distributed

    def variant(
        self, keep: bool, checked_on_host: bool, precision: str = "float32"
    ) -> Callable[..., Any]:
        variant = self.variants.get((keep, checked_on_host, precision))
        if variant is None:
            spec = dataclasses.replace(
                self.spec, keep=keep, checked_on_host=checked_on_host, precision=precision
            )
            variant = self.variants[keep, checked_on_host, precision] = self.updates(spec)
        return variant

    def global_variant(self, keep: bool, precision: str = "float32") -> Callable[..., Any]:
        """The call over global arrays (batches checked on the host, the accumulator
        replicated, or one on each device: `devices`), under `jax.distributed`."""
        variant = self.variants.get((keep, "global", precision))
        if variant is None:
            spec = dataclasses.replace(
                self.spec,
                keep=keep,
                checked_on_host=True,
                replicate=True,
                precision=precision,
                devices=self.devices,
            )
            variant = self.variants[keep, "global", precision] = self.updates(spec)
        return variant

    @functools.cached_property
    def devices(self) -> int:
        """Under `jax.distributed`, how many accumulators a pass keeps: one on each device
        of the data mesh when every device metric declares `split_invariant` (decision
        0089), else 0 (one accumulator, replicated)."""
        return int(data_mesh().devices.size) if self.split_invariant else 0

    @functools.cached_property
    def spread(self) -> Callable[[list], list]:
        """The empty (replicated) accumulator as one on each device (`devices > 0`)."""
        call = functools.partial(_spread, devices=self.devices)
        return jax.jit(call, out_shardings=batch_sharding())

    @functools.cached_property
    def gather(self) -> Callable[[list, list], list]:
        """The devices' accumulators merged into one, replicated (`devices > 0`)."""
        spec = dataclasses.replace(self.spec, devices=self.devices)
        return jax.jit(functools.partial(_gather, spec=spec), out_shardings=replicated_sharding())

    def replicated_leaves(self) -> tuple[list, list]:
        """The objective's and the metrics' array leaves replicated over the data mesh."""
        if self.global_leaves is None:
            self.global_leaves = (
                _everywhere(self.objective_leaves),
                _everywhere(self.metric_leaves),
            )
        return self.global_leaves


# Plans found by the identities of their (immutable) objective and device metrics, not of
# the metric set: a caller that builds a new `MetricSet` of the same metrics for each pass
# (`dew.evaluate`, each `Trainer.fit`) finds the same plan. Building one costs a small pass's
# time (decision 0082 measures it), more than the pass's dispatches. A plan holds neither
# its objective nor its metrics, so it is forgotten with them.
_plans: ByIdentity[dict[Any, _Plan]] = ByIdentity()


def _plan_for(objective: Objective, metrics: MetricSet, params_def: Any) -> _Plan:
    """The plan of `objective`, the flat set `metrics` and a params structure, built on
    first use."""
    plans = _plans.get((objective, *metrics.metrics), dict)
    plan = plans.get(params_def)
    if plan is None:
        plan = plans[params_def] = _Plan(objective, metrics, params_def)
    return plan


def _split(metrics: MetricSet) -> tuple[MetricSet, MetricSet]:
    """`metrics.split_by_host()`: its device metrics and its host metrics, as flat sets."""
    return metrics.split_by_host()


class _Reducer:
    """One pass's accumulator over the compiled calls of its plan."""

    def __init__(
        self,
        objective: Objective,
        params: PyTree,
        metrics: MetricSet,
        key: PRNGKeyArray,
        precision: str = "float32",
    ) -> None:
        self.metrics = metrics
        self.key = key
        self.precision = precision
        self.params, params_def = jax.tree.flatten(params)
        plan = _plan_for(objective, metrics, params_def)
        self.plan = plan
        self.objective_leaves, self.metric_leaves = plan.objective_leaves, plan.metric_leaves
        self.spec = plan.spec
        # The host checks of each batch, at a cost that does not grow with the model.
        self.check_batch = functools.partial(check_on_host, objective)
        self.accumulator = _fresh(plan.initial)

    def _variant(self, keep: bool, checked_on_host: bool) -> Callable[..., Any]:
        return self.plan.variant(keep, checked_on_host, self.precision)

    def add(self, batch: Mapping[str, Any], index: int, keep: bool) -> Artifact | None:
        """Score `batch` and merge its statistics; the artifact when `keep`."""
        # Host batches are checked on the host by the objective's own checks, and scored
        # by a variant compiled without the traced ID checks.
        checked = held_on_host(batch)
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


class OneProcess:
    """`run_pass`'s strategy in one process: nothing to agree on (`_processes.Processes` is
    the strategy under `jax.distributed`). Each batch is scored as it comes, its keys checked
    on the first; a failed call is explained by the objective's own host checks."""

    uneven = False  # one process's shard is the whole pass

    reducer = _Reducer
    """The pass's accumulator, built from `(objective, params, metrics, key, precision)`."""

    def batches(
        self, objective: Objective, batches: Iterable[Mapping[str, Any]], keep_first: bool
    ) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any], bool]]:
        """Each batch twice (the process's batch is the pass's), its keys checked on the
        first before anything is compiled for it; with `keep_first` as given."""
        for index, batch in enumerate(batches):
            if index == 0:
                check_batch_keys(objective, batch, Split.VALIDATION)
            yield batch, batch, keep_first

    def explained(self, objective: Objective, batch: Mapping[str, Any]) -> Any:
        """A check fired in the call: raise the objective's own error (`explain_failure`)."""
        return explain_failure(objective, batch)

    def on_zero(self, phase: str, work: Callable[..., _T], *args: Any) -> _T:
        return work(*args)

    def gathered(self, tree: _T) -> _T:
        return tree

    def shared(self, value: _T) -> _T:
        return value
