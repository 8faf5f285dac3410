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

The package: `_result` (`PassResult`, `scoring_key`), `_reducer` (the compiled calls, their
plans and one process's reducer), `_placing` and `_processes` (the multi-process pass),
`_preview` (`preview_on_process_zero`); `run_pass` here dispatches between the two passes.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
from jaxtyping import PRNGKeyArray, PyTree

from dew._checks import batch_error, explain_failure, failed_check
from dew._domains import SCORING_DOMAIN
from dew._pass._conditioning import ConditioningDigest
from dew._pass._preview import preview_on_process_zero
from dew._pass._processes import _run_pass_processes
from dew._pass._reducer import _Plan as _Plan  # tests count the plans built
from dew._pass._reducer import _Reducer, _split
from dew._pass._reducer import _update_for as _update_for
from dew._pass._result import PassResult, _rows, scoring_key
from dew._processes import is_multiprocess
from dew.metrics import MetricSet
from dew.naming import Split
from dew.objectives.base import Objective, check_batch_keys

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
    docstring) and gets the same result.
    When a compiled call fails (a check inside it fired), the objective's host-side
    checks run on that batch and their `ValueError` is raised instead (`explain_failure`).
    A failure that surfaces only at the final fetch re-checks the last batch, else raises
    the traced check's own message (`failed_check`).
    """
    if is_multiprocess():
        return _run_pass_processes(
            objective, params, batches, metrics, key, keep_first_artifact, conditioning
        )
    device, host = _split(metrics)
    names = metrics.names
    reducer = _Reducer(objective, params, device, key) if names else None
    on_host = bool(host.metrics)
    host_state = host.init() if on_host else None
    first_artifact = first_batch = None
    count = records = 0
    digest = ConditioningDigest()
    batch: Any = None  # the last batch, re-checked when the final fetch fails
    for index, batch in enumerate(batches):
        if first_batch is None:  # its keys checked before anything is compiled for it
            check_batch_keys(objective, batch, Split.VALIDATION)
            first_batch = batch
        records += _rows(batch)
        if reducer is not None:
            keep = on_host or (index == 0 and keep_first_artifact)
            try:  # a host metric fetches the artifact: a failed call surfaces there
                artifact = reducer.add(batch, index, keep)
                if host_state is not None and artifact is not None:  # on_host: keep is True
                    host_state = host.update(host_state, artifact)
            except Exception:  # a check fired in the call: raise the objective's own error
                with explain_failure(objective, batch):
                    raise
            if index == 0 and keep:
                first_artifact = artifact
        if conditioning is not None and (given := conditioning(batch)) is not None:
            digest.update(given)
        count += 1
    conditioned = digest.hexdigest()
    if count == 0 or reducer is None:
        return PassResult(
            {}, count, records, first_artifact, first_batch, conditioning_sha256=conditioned
        )
    host_values = host.finalize(host_state) if host_state is not None else {}
    try:  # fetched here: a check that fired in a call may surface only at the fetch
        values = jax.device_get(reducer.finalize() | host_values)
    except Exception as error:  # the last batch re-checked, else the check's own message
        explained = batch_error(objective, batch) or failed_check(error)
        if explained is None:
            raise
        raise explained from None
    scores = {name: float(values[name]) for name in names}
    return PassResult(
        scores, count, records, first_artifact, first_batch, conditioning_sha256=conditioned
    )
