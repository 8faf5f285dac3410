"""Checkpoint save and restore wall time: dew's `Checkpointer` against orbax used by hand.

Target (issue 27, item 7): dew's save (until the checkpoint is finished) and its restore each
take at most 1.1x orbax-checkpoint used by hand on the same state, at every size. This script
measures those ratios side by side in one run; it asserts nothing and always exits 0.

The state is what `Trainer.fit` saves: a `TrainState` of an MLP's params (four square layers
with biases, sized to 1M, 5M, 20M and 50M parameters), `optax.adam`'s state (its moments
filled with values, as after some steps), the step and the run key; the arrays are drawn once
with NumPy (seeded) before any timing, so compression has nothing easy to find. Both sides
write to folders under the same directory (`--folder`, default a fresh folder under /work,
a real disk here; /tmp may be a memory file system elsewhere).

Sides, per size:

- `dew`: one `Checkpointer(folder)` (as a fit holds one), then per round
  `save(step, state, {"data_start": 0}); wait()` (the arrays and the JSON item, until orbax
  has finished the step) and `restore(state)` of the newest step (what a resume calls: the
  newest intact step, its structure checked against the template, the state and its JSON
  item), `jax.block_until_ready` on the result.
- `orbax by hand`: one `ocp.CheckpointManager(folder, options=CheckpointManagerOptions(
  enable_async_checkpointing=True, create=True))` with the same two items, then per round
  `save(step, args=Composite(state=StandardSave(state), extra=JsonSave({"data_start": 0})));
  wait_until_finished()` and `restore(latest_step(), args=Composite(state=StandardRestore(
  abstract state), extra=JsonRestore()))`, the abstract state built from the state with
  `ocp.utils.to_shape_dtype_struct` (orbax keeps the typed key itself).

Timing: one untimed warm-up save and restore per side and size, then `--rounds` rounds; the
order of the two sides reverses every round, garbage collection runs before each interval.
The table shows per size and operation each side's median and spread (min-max) in seconds and
dew / orbax as the ratio of the medians and the median of the per-round paired ratios, against
the target. With the load average above 2 the process pins itself to one core first
(`os.sched_setaffinity`, before JAX starts), so both sides share that core alike (`--no-pin`
leaves it as it is).

Run: `python benchmarks/checkpoint_io.py` (full: 5 rounds at 1M, 5M, 20M, 50M, a few minutes
on 2 cores; the 50M state is 600 MB, so about 12 GB of checkpoints are written and deleted),
`--quick` (1M and 5M, 1 round, well under a minute), `--sizes 1e6 2e7`, `--rounds R`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import os
import pathlib
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TARGET = 1.1
SEED = 20261204
EXTRA = {"data_start": 0}


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def make_state(parameters: int) -> Any:
    """A `TrainState` of about `parameters` MLP parameters with adam's state, every array
    drawn from a seeded NumPy generator."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dew.steps import TrainState

    rng = np.random.default_rng(SEED)
    width = int((parameters / 4) ** 0.5)

    def drawn(shape: tuple[int, ...]) -> Any:
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

    params = {
        f"layer{index}": {"weight": drawn((width, width)), "bias": drawn((width,))}
        for index in range(4)
    }
    opt_state = jax.tree.map(
        lambda leaf: drawn(leaf.shape) if jnp.ndim(leaf) else leaf,
        optax.adam(1e-3).init(params),
    )
    state = TrainState(
        step=jnp.asarray(100, jnp.int32), params=params, opt_state=opt_state, key=jax.random.key(0)
    )
    return jax.block_until_ready(state)


@dataclass
class Side:
    label: str
    save: Callable[[int], None]  # step -> save it and wait until finished
    restore: Callable[[], Any]  # -> the restored state, ready
    close: Callable[[], None]
    times: dict[str, list[float]] = field(default_factory=lambda: {"save": [], "restore": []})

    def round(self, step: int, timed: bool = True) -> None:
        for operation, call in (("save", lambda: self.save(step)), ("restore", self.restore)):
            gc.collect()
            start = time.perf_counter()
            call()
            elapsed = time.perf_counter() - start
            if timed:
                self.times[operation].append(elapsed)


def dew_side(folder: pathlib.Path, state: Any) -> Side:
    import jax

    from dew.checkpoints import Checkpointer

    checkpoints = Checkpointer(folder)

    def save(step: int) -> None:
        checkpoints.save(step, state, EXTRA)
        checkpoints.wait()

    def restore() -> Any:
        return jax.block_until_ready(checkpoints.restore(state)[0])

    return Side("dew", save, restore, checkpoints.close)


def orbax_side(folder: pathlib.Path, state: Any) -> Side:
    import jax
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(
        folder,
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, create=True),
    )
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)

    def save(step: int) -> None:
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(EXTRA)
            ),
        )
        manager.wait_until_finished()

    def restore() -> Any:
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore()
            ),
        )
        return jax.block_until_ready(restored["state"])

    return Side("orbax by hand", save, restore, manager.close)


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def measure(parameters: int, rounds: int, root: pathlib.Path) -> list[tuple[str, ...]]:
    import jax

    from dew.checkpoints._layout import is_key

    state = make_state(parameters)
    count = sum(leaf.size for leaf in jax.tree.leaves(state.params))
    size = sum(leaf.nbytes for leaf in jax.tree.leaves(state) if not is_key(leaf))
    folder = root / f"{parameters}"
    sides = [dew_side(folder / "dew", state), orbax_side(folder / "orbax", state)]
    for side in sides:
        side.round(1, timed=False)  # warm-up: compilation, orbax's first directory set-up
    for index in range(rounds):
        for side in sides if index % 2 == 0 else reversed(sides):
            side.round(index + 2)
    for side in sides:
        side.close()
    shutil.rmtree(folder, ignore_errors=True)
    dew, peer = sides
    rows = []
    for operation in ("save", "restore"):
        ours, theirs = dew.times[operation], peer.times[operation]
        ratio = statistics.median(ours) / statistics.median(theirs)
        paired = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
        rows.append(
            (
                f"{parameters / 1e6:g}M ({count / 1e6:.2f}M params, {size / 2**20:.0f} MiB)",
                operation,
                f"{statistics.median(ours):.3f}",
                spread(ours),
                f"{statistics.median(theirs):.3f}",
                spread(theirs),
                f"{ratio:.2f}x",
                f"{paired:.2f}x",
                f"<= {TARGET}x",
                "met" if ratio <= TARGET else "not met",
            )
        )
    return rows


def table(rows: list[tuple[str, ...]]) -> str:
    head = (
        "size",
        "op",
        "dew s",
        "dew spread",
        "orbax s",
        "orbax spread",
        "ratio",
        "paired",
        "target",
        "",
    )
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [head, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M and 5M, one round")
    parser.add_argument("--sizes", nargs="+", type=float, help="parameter counts")
    parser.add_argument("--rounds", type=int, help="timed rounds per size (default 5)")
    parser.add_argument("--folder", help="where the checkpoints go (default: under /work)")
    parser.add_argument("--no-pin", action="store_true", help="never pin to one core")
    args = parser.parse_args()
    sizes = args.sizes or ([1e6, 5e6] if args.quick else [1e6, 5e6, 2e7, 5e7])
    rounds = args.rounds or (1 if args.quick else 5)
    load = load_average()
    pinned = False
    if load > 2 and not args.no_pin and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[-1]})
        pinned = True
    base = args.folder or ("/work" if os.path.isdir("/work") else None)
    root = pathlib.Path(tempfile.mkdtemp(prefix="dew-checkpoint-io-", dir=base))

    import jax

    import dew

    print(
        f"dew {version('dew-ml')} ({pathlib.Path(dew.__file__).parent}), jax {jax.__version__}, "
        f"orbax-checkpoint {version('orbax-checkpoint')}, tensorstore {version('tensorstore')}, "
        f"Python {platform.python_version()}"
    )
    print(
        f"{cpu_model()}, {os.cpu_count()} cores"
        f"{', pinned to one core (load above 2)' if pinned else ''}; devices {jax.devices()}"
    )
    print(f"load average at start {load:.2f}; checkpoints under {root}")
    print(f"sizes {[f'{size:g}' for size in sizes]}, {rounds} timed round(s) per side\n")
    rows = []
    try:
        for size in sizes:
            rows += measure(int(size), rounds, root)
            print(f"  {size:g} done (load {load_average():.2f})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(table(rows))
    print(
        "\nseconds per save (until finished) and per restore; ratio = dew median / orbax median;"
        "\npaired = median of the per-round dew / orbax ratios"
    )
    print(f"load average at end {load_average():.2f}")


if __name__ == "__main__":
    main()
