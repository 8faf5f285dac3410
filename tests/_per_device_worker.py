"""Worker of tests/test_pass_per_device.py: one process with 4 CPU devices
(`--xla_force_host_platform_device_count=4`) runs passes through the global-array
reducer `jax.distributed` uses (`dew._pass._processes._GlobalReducer`), and writes their
scores, how many accumulators each kept and the collectives of its compiled call to
`python _per_device_worker.py OUT_JSON`."""

from __future__ import annotations

import json
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dew.objectives.base import Objective
from dew.objectives.lm import LMObjective


class ExtraRow(Objective):
    """The LM's scores with its first row scored twice: an artifact of 5 rows from a batch
    of 4, which 4 devices cannot split evenly."""

    inner: LMObjective
    name: str = eqx.field(static=True, default="extra_row")

    def init_params(self):
        return self.inner.init_params()

    def loss(self, params, batch, key):
        return self.inner.loss(params, batch, key)

    def evaluate(self, params, batch, key):
        scores = self.inner.evaluate(params, batch, key)
        return jax.tree.map(lambda leaf: jnp.concatenate([leaf, leaf[:1]]), scores)

    def batch_keys(self, split):
        return self.inner.batch_keys(split)

    def check_batch(self, batch):
        self.inner.check_batch(batch)

    def generate_preview(self, params, batch, key):
        return None

    def default_metrics(self):
        return ()


def batches() -> list[dict]:
    from _dist_eval_worker import SEQ, VOCAB

    rng = np.random.default_rng(5)
    return [{"text": rng.integers(0, VOCAB, (4, SEQ + 1), dtype=np.int32)} for _ in range(3)]


def _pass(objective, params, metric_list, key) -> dict:
    from _dist_eval_worker import collectives

    from dew._pass._processes import _GlobalReducer
    from dew._processes import global_batch
    from dew.metrics import MetricSet

    found = collectives(objective, params, metric_list, batches()[0], key)
    reducer = _GlobalReducer(objective, params, MetricSet(metric_list), key)
    for index, batch in enumerate(batches()):
        reducer.add(global_batch(batch), index, False)
    return {
        "scores": {name: float(value) for name, value in reducer.finalize().items()},
        "devices": found.pop("devices"),
        "collectives": sum(found.values()),
    }


def _main(out: pathlib.Path) -> None:
    from _dist_eval_worker import LargestLoss, lm_metrics, lm_objective

    assert jax.device_count() == 4, jax.devices()
    lm = lm_objective()
    params = lm.init_params()
    key = jax.random.key(3)
    results = {
        "even": _pass(lm, params, lm_metrics(), key),
        "extra_row": _pass(ExtraRow(lm), params, lm_metrics(), key),
        "mixed": _pass(lm, params, [*lm_metrics(), LargestLoss()], key),
    }
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    _main(pathlib.Path(sys.argv[1]))
