"""Worker of tests/test_distributed_cli.py: `dew train` joined by the cluster flags
(`--coordinator-address --num-processes --process-id`), then `dew eval` of its run, as one
process of a cluster would run them. Run as `python WORKER RANK COUNT PORT OUT ARGS...`;
each rank's exit statuses and the state its `Trainer.fit` returned go into OUT/rank<R>.json."""

import contextlib
import json
import pathlib
import sys

rank, count, port = (int(value) for value in sys.argv[1:4])
out = pathlib.Path(sys.argv[4])
args = sys.argv[5:]

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dew import training  # noqa: E402
from dew.cli import main  # noqa: E402

fitted: list = []
original_fit = training.Trainer.fit


def fit(self, *fit_args, **fit_kwargs):
    """`Trainer.fit`, noting the step it ended at and its params (as this process sees them)."""
    state = original_fit(self, *fit_args, **fit_kwargs)
    leaves = [np.asarray(jax.device_get(leaf)) for leaf in jax.tree.leaves(state.params)]
    fitted.append({"step": int(state.step), "params": [float(np.sum(leaf)) for leaf in leaves]})
    return state


training.Trainer.fit = fit
cluster = ["--coordinator-address", f"127.0.0.1:{port}", "--num-processes", str(count)]
results: dict = {}
results["train"] = main(["train", *cluster, "--process-id", str(rank), *args])
results["fitted"] = fitted
root = pathlib.Path(args[args.index("--checkpoint-dir") + 1])
results["eval"] = main(["eval", str(root / "quickstart")])  # already joined: no flags
# The same run name with another configuration: process zero's run.json check fails, and
# every process raises it (process 1 reads no run.json).
results["other_config"] = main(["train", *args, "--set", "optim.learning_rate=0.5"])
# The run folder held by another run (on process zero, a second lock of this process's):
# process zero's lock is refused, and every process raises it as the user's error.
from dew._lock import folder_lock  # noqa: E402

with folder_lock(root / "quickstart") if rank == 0 else contextlib.nullcontext():
    results["locked"] = main(["train", *args])
(out / f"rank{rank}.json").write_text(json.dumps(results))
