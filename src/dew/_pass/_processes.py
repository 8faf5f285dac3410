"""`run_pass` under `jax.distributed`: every process runs the pass over its own shard.

The processes read the shortest coordinated prefix of their shards, check each local batch
on the host and agree on the outcome before anything collective runs, place it as one global
batch, and run the same compiled call over global arrays, so the device metrics reduce over
every process's rows. Only process zero updates and finalizes the host metrics (on the
artifacts gathered by `collective_host`) and shares their values.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
from jaxtyping import PRNGKeyArray, PyTree

from dew._checks import batch_error, failed_check
from dew._pass._conditioning import ConditioningDigest
from dew._pass._placing import _everywhere, _local, _place
from dew._pass._reducer import _plan_for, _split
from dew._pass._result import PassResult, _rows
from dew._processes import (
    _agree,
    agree_process_phase,
    broadcast_json,
    coordinated,
    is_process_zero,
    replicated,
)
from dew.artifacts import collective_host
from dew.metrics import MetricSet
from dew.objectives.base import Objective


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
    conditioning: Callable[[Mapping[str, Any]], Any] | None = None,
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
    objective_leaves = metric_leaves = global_params = global_key = None
    accumulator: Any = None
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
    digest = ConditioningDigest()
    shards = coordinated(batches)
    local: Any = None  # the last shard, re-checked when the final fetch fails
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
                if zero and host_state is not None:  # process zero started them (or raised)
                    try:
                        host_state = host.update(host_state, gathered)
                    except Exception as error:
                        outcome = error
                agree_process_phase(f"host metrics on process 0, batch {index}", outcome)
            if index == 0 and keep:
                first_artifact = artifact
        if conditioning is not None and (given := conditioning(batch)) is not None:
            # the placed global batch's values, gathered on every process: the same digest
            # as one process reading the same global batches
            digest.update(collective_host(given))
        count += 1
    uneven = shards.uneven
    conditioned = digest.hexdigest()
    if count == 0 or plan is None:
        return PassResult({}, count, records, first_artifact, first_batch, uneven, conditioned)
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
    return PassResult(scores, count, records, first_artifact, first_batch, uneven, conditioned)
