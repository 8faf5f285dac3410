"""Time to the first training step from a fresh process: `dew train` against Keras 3's `fit`
on the JAX backend, the same MLP.

Target (issue 27, item 5): `dew train`'s time to its first step at most Keras's for the same
model. This script measures both side by side in one run; it asserts nothing and exits 0.

The model, at three sizes (`--sizes`, default `64x2,256x4,1024x8`: width x hidden layers): an
MLP over a flattened 16x16 RGB image (768 inputs, ReLU hidden layers, 3 logits), trained with
Adam (3e-3) on batches of 32 rows by a softmax cross entropy.

- `dew`: `dew train CONFIG --quiet` in a fresh process, the configuration a TOML file written
  here: model `first_step_mlp` (`benchmarks/_first_step_mlp.py`, `eqx.nn.MLP`, imported by the
  run's `trainer.imports`), data `shapes` (1024 rows), objective `classifier`, `log_every=1`.
  The clock stops when the run's `scalars.jsonl` holds the first step's line (polled every
  5 ms), which is when a user sees the step; the process is then killed.
- `keras`: `python -c ...` in a fresh process with `KERAS_BACKEND=jax`: `keras.Sequential`
  (`Flatten`, the hidden `Dense` layers, `Dense(3)`), `compile(Adam(3e-3),
  SparseCategoricalCrossentropy(from_logits=True))` and `fit` on 1024 NumPy rows of the same
  shape; the clock stops when its `on_train_batch_end` callback prints the first batch's loss.
- `dew (before)`, with `--before SRC`: the `dew` side with `PYTHONPATH=SRC` (e.g. main's
  checkout, `--before /work/main/src`), for a before/after in one run.

Every side starts its clock at `subprocess.Popen`. The sides alternate round by round (the
order rotates), and when the load average exceeds 2 every process is pinned to one core
(`taskset -c 1`). The table shows the median and the spread (min-max) of the seconds to the
first step, the ratio of dew's median to Keras's, the process's median CPU seconds (user and
system) and their ratio, the target (<= 1.00x, on wall time) and whether it is met.

Run: `python benchmarks/first_step.py` (3 sizes x 3 rounds), `--quick` (the smallest size, one
round), `--rounds N`, `--before SRC`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent

CONFIG = """\
[model]
name = "first_step_mlp"
kwargs = {{ width = {width}, depth = {depth} }}

[data]
name = "shapes"
kwargs = {{ rows = 1024, val_fraction = 0.125 }}

[optim]
optimizer = "adam"
learning_rate = 3e-3

[trainer]
name = "first-step"
checkpoint_dir = "{root}"
steps = 1000
batch_size = 32
log_every = 1
imports = ["_first_step_mlp"]

[objective]
name = "classifier"
kwargs = {{ classes = 3, inputs = "images" }}
"""

KERAS = """\
import os, sys
import numpy as np
import keras
width, depth = int(sys.argv[1]), int(sys.argv[2])
model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten()]
    + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    + [keras.layers.Dense(3)])
model.compile(optimizer=keras.optimizers.Adam(3e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
x = rng.random((1024, 16, 16, 3), dtype=np.float32)
y = rng.integers(0, 3, 1024).astype(np.int32)
class First(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print("first step", float(logs["loss"]), flush=True)
        os._exit(0)
model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[First()])
"""


def _pin(command: list[str], pinned: bool) -> list[str]:
    return ["taskset", "-c", "1", *command] if pinned and shutil.which("taskset") else command


def _environment(src: str | None) -> dict[str, str]:
    paths = [str(HERE)]
    if src:
        paths.append(src)
    elif os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _cpu(process: subprocess.Popen) -> float:
    """The CPU seconds (user and system) the ended `process` used."""
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    return usage.ru_utime + usage.ru_stime


def time_dew(width: int, depth: int, src: str | None, pinned: bool) -> tuple[float, float]:
    """Seconds from `Popen` to the first step's line in the run's scalars.jsonl, and the
    CPU seconds of the process until it is killed right after."""
    with tempfile.TemporaryDirectory() as folder:
        config = pathlib.Path(folder) / "run.toml"
        config.write_text(CONFIG.format(width=width, depth=depth, root=folder))
        scalars = pathlib.Path(folder) / "first-step" / "scalars.jsonl"
        dew = [sys.executable, "-m", "dew", "train", str(config), "--quiet"]
        start = time.perf_counter()
        process = subprocess.Popen(
            _pin(dew, pinned),
            env=_environment(src),
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        while not (scalars.exists() and b"\n" in scalars.read_bytes()):
            if process.poll() is not None:
                raise RuntimeError(f"dew train ended first: {process.stderr.read().decode()}")
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        os.killpg(process.pid, signal.SIGKILL)
        return elapsed, _cpu(process)


def time_keras(width: int, depth: int, pinned: bool) -> tuple[float, float]:
    """Seconds from `Popen` to the first batch's loss printed by a Keras callback, and the
    CPU seconds of the process (it exits there)."""
    keras = [sys.executable, "-c", KERAS, str(width), str(depth)]
    start = time.perf_counter()
    process = subprocess.Popen(
        _pin(keras, pinned),
        env={**os.environ, "KERAS_BACKEND": "jax"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    line = process.stdout.readline()
    elapsed = time.perf_counter() - start
    if not line.startswith(b"first step"):
        raise RuntimeError("the Keras side ended before its first step")
    return elapsed, _cpu(process)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smallest size, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="64x2,256x4,1024x8", help="WIDTHxDEPTH,...")
    parser.add_argument("--before", metavar="SRC", help="also time dew with PYTHONPATH=SRC")
    args = parser.parse_args()
    sizes = [tuple(int(part) for part in size.split("x")) for size in args.sizes.split(",")]
    rounds = 1 if args.quick else args.rounds
    sizes = sizes[:1] if args.quick else sizes
    versions = ", ".join(
        f"{name} {_version(name)}" for name in ("dew-ml", "jax", "equinox", "optax", "keras")
    )
    load = os.getloadavg()[0]
    pinned = load > 2
    print(f"python {platform.python_version()}, {versions}")
    print(
        f"{os.cpu_count()} CPU cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        f"{', every process pinned to core 1' if pinned else ''}; {rounds} round(s)"
    )
    if _version("keras") == "not installed":
        print("keras is not installed: skipped (pip install keras)")
        return
    sides = {"keras": lambda w, d: time_keras(w, d, pinned)}
    if args.before:
        sides["dew (before)"] = lambda w, d: time_dew(w, d, args.before, pinned)
    sides["dew"] = lambda w, d: time_dew(w, d, None, pinned)
    names = list(sides)
    times: dict[tuple[int, int], dict[str, list[float]]] = {}
    cpu: dict[tuple[int, int], dict[str, list[float]]] = {}
    for size in sizes:
        times[size] = {name: [] for name in names}
        cpu[size] = {name: [] for name in names}
        for round_ in range(rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                wall, used = sides[name](*size)
                times[size][name].append(wall)
                cpu[size][name].append(used)
    print()
    header = f"{'model':<12} {'side':<13} {'median s':>9} {'spread s':>11} {'vs keras':>9}"
    print(f"{header} {'cpu s':>6} {'vs keras':>9} target")
    for size, by_side in times.items():
        keras = statistics.median(by_side["keras"])
        keras_cpu = statistics.median(cpu[size]["keras"])
        for name in names:
            median = statistics.median(by_side[name])
            spread = f"{min(by_side[name]):.1f}-{max(by_side[name]):.1f}"
            ratio = median / keras
            target = "" if name == "keras" else f"<= 1.00x {'met' if ratio <= 1 else 'not met'}"
            model = f"mlp {size[0]}x{size[1]}"
            used = statistics.median(cpu[size][name])
            print(
                f"{model:<12} {name:<13} {median:>9.2f} {spread:>11} {ratio:>8.2f}x "
                f"{used:>6.2f} {used / keras_cpu:>8.2f}x {target}"
            )
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
