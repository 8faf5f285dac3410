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

`run_pass` here is the one loop; what differs between one process and several is its
strategy: `OneProcess` (`_reducer`), whose methods are the identity or the one-process work
itself, or `Processes` (`_processes`), which coordinates and places the batches, does the
host metrics' work on process zero with its outcome agreed, and gathers and shares values.
The package: `_result` (`PassResult`, `scoring_key`), `_reducer` (the compiled calls, their
plans, one process's reducer and strategy), `_placing` and `_processes` (the multi-process
placement and strategy), `_preview` (`preview_on_process_zero`).
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
from jaxtyping import PRNGKeyArray, PyTree

from dew._checks import explanation
from dew._domains import SCORING_DOMAIN
from dew._pass._conditioning import ConditioningDigest
from dew._pass._preview import preview_on_process_zero
from dew._pass._processes import Processes
from dew._pass._reducer import OneProcess, _split
from dew._pass._reducer import _Plan as _Plan  # tests count the plans built
from dew._pass._reducer import _Reducer as _Reducer
from dew._pass._reducer import _update_for as _update_for
from dew._pass._result import PassResult, _rows, scoring_key
from dew._precision import check_precision
from dew._processes import is_multiprocess
from dew.metrics import MetricSet
from dew.objectives.base import Objective

__all__ = [
    "SCORING_DOMAIN",
    "ConditioningDigest",
    "PassResult",
    "preview_on_process_zero",
    "run_pass",
    "scoring_key",
]


def run_pass(
    objective: Objective,
    params: PyTree,
    batches: Iterable[Mapping[str, Any]],
    metrics: MetricSet,
    key: PRNGKeyArray,
    *,
    keep_first_artifact: bool = False,
    conditioning: Callable[[Mapping[str, Any]], Any] | None = None,
    precision: str = "float32",
) -> PassResult:
    """Score and reduce one pass of `batches` with `metrics`.

    Batch `i` is scored with `scoring_key(key, i)`. Device metrics reduce in one
    compiled call per batch (scoring included, the accumulator donated) and are
    fetched once at the end; host metrics merge each batch's artifact on the host.
    With no metrics nothing is scored (batches and records are still counted).
    `keep_first_artifact` returns the first batch's scoring artifact (for a preview).
    `conditioning(batch)` gives the values that condition the samples generated for the
    batch's rows (or `None`); the result's `conditioning_sha256` identifies them all.
    Under `jax.distributed` every process calls it with its own shard (see the module's
    docstring) and gets the same result. `precision`: the policy the objective scores
    under (`dew._precision`: a bfloat16 one casts the params and the batch, and the
    metrics reduce the artifact in float32).
    When a compiled call fails (a check inside it fired), the objective's host-side
    checks run on that batch and their `ValueError` is raised instead (`explain_failure`).
    A failure that surfaces only at the final fetch re-checks the last batch, else raises
    the traced check's own message (`failed_check`).
    """
    # How the processes agree: in one process, they need not (`OneProcess`'s methods are
    # the identity, or the one-process work itself).
    precision = check_precision(precision)
    strategy = Processes() if is_multiprocess() else OneProcess()
    device, host = _split(metrics)
    names = metrics.names
    reducer = strategy.reducer(objective, params, device, key, precision) if names else None
    on_host = bool(host.metrics)
    host_state = None
    if on_host:
        host_state = strategy.on_zero("starting the host metrics on process 0", host.init)
    first_artifact = first_batch = last = None
    count = records = 0
    digest = ConditioningDigest()
    # `local` is this process's batch, `batch` the pass's (the same in one process).
    # `keep_first`: whether any process keeps the first artifact (a tracker may live on
    # process zero alone, and the compiled calls must be the same on every process).
    for index, (local, batch, keep_first) in enumerate(
        strategy.batches(objective, batches, keep_first_artifact)
    ):
        first_batch = batch if first_batch is None else first_batch
        last = local
        records += _rows(batch)
        if reducer is not None:
            keep = on_host or (index == 0 and keep_first)
            # a host metric fetches the artifact: a failed call may surface there
            with strategy.explained(objective, local):
                artifact = reducer.add(batch, index, keep)
                if on_host:  # gathered on every process, merged on process zero alone
                    host_state = strategy.on_zero(
                        f"host metrics on process 0, batch {index}",
                        host.update,
                        host_state,
                        strategy.gathered(artifact),
                    )
            if index == 0 and keep:
                first_artifact = artifact
        if conditioning is not None and (given := conditioning(batch)) is not None:
            # under jax.distributed the placed global batch's values, gathered on every
            # process: the same digest as one process reading the same global batches
            digest.update(strategy.gathered(given))
        count += 1
    conditioned, uneven = digest.hexdigest(), strategy.uneven
    if count == 0 or reducer is None:
        return PassResult({}, count, records, first_artifact, first_batch, uneven, conditioned)
    try:  # fetched here: a check that fired in a call may surface only at the fetch
        values = jax.device_get(reducer.finalize())
    except Exception as error:  # the last batch re-checked, else the check's own message
        explained = explanation(objective, last, error)
        if explained is None:
            raise
        raise explained from None
    if on_host:  # finalized on process zero, the values shared with every process
        phase = "finalizing the host metrics on process 0"
        values |= strategy.shared(strategy.on_zero(phase, _host_scores, host, host_state))
    scores = {name: float(values[name]) for name in names}
    return PassResult(scores, count, records, first_artifact, first_batch, uneven, conditioned)


def _host_scores(host: MetricSet, state: Any) -> dict[str, float]:
    """The host metrics' values (non-finite ones included), as floats."""
    finalized = jax.device_get(host.finalize(state))
    return {name: float(finalized[name]) for name in host.names}
