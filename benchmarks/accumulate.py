"""Gradient accumulation: `Trainer.fit(..., accumulate=4)` against a hand-written loop.

Target (issue 29, item 2): dew's accumulated step costs <= 1.05x the hand-written floor per
optimizer step. This script measures the ratio side by side; it asserts nothing and exits 0.

Each optimizer step trains on one global batch of 4 micro-batches. The sides, on the same
data (the global batch put on the device before timing, and its four micro-batches too):

- `dew`: `Trainer(objective, optax.adam(1e-3), key).fit(data, steps, log_every=10,
  accumulate=4, progress=False, state=state)` over `itertools.repeat(global batch)`: one
  compiled call per optimizer step whose `lax.scan` runs the four micro-batches' gradients
  and then the one update (`dew.steps.train_step(accumulate=4)`). Each round continues from
  the state the previous one returned; it ends with `jax.block_until_ready`.
- `hand` (the target's floor, what a user writes by hand): `micro = jax.jit(f,
  donate_argnums=1)` where `f(params, grad_sum, micro_batch)` runs
  `jax.value_and_grad(objective.loss, has_aux=True)` on one micro-batch and adds its
  gradients and loss into the donated sums; four calls of it on the four device
  micro-batches, then `update = jax.jit(g, donate_argnums=(0, 1))` where `g` divides the sums
  by 4 and runs `optimizer.update` and `optax.apply_updates`. Five dispatches per optimizer
  step; every 10th step the loss is fetched and converted with `float`, as the trainer does at
  a log step. (Equal micro-batches and losses that are means over rows or over equally many
  tokens: the plain mean of the four is the big batch's mean here, as dew's weighted one is.)
- `scan` (for reading, not the target): the same as one `jax.jit` function, a `lax.scan`
  over the four stacked micro-batches and the update, donated: the floor dew's compiled step
  is built like.

Models (float32, Adam at 1e-3), each at 4 micro-batches a step:

- `tiny`: `eqx.nn.MLP(64, 1, width_size=32, depth=2)`, global batch 128 (micro 32), mean
  squared error (`SupervisedObjective`): dispatch-bound.
- `wide`: the same at width 512, global batch 1024 (micro 256).
- `lm-small`: `CausalTransformer(vocab 256, width 128, 2 layers, 4 heads, mlp 512, seq 64)`,
  470,784 parameters, `LMObjective(seq_len=64)`, global batch 32 rows (micro 8).
- `lm-wide`: width 256, 4 layers, 8 heads, mlp 1024, seq 64, global batch 16 (micro 4).

Timing: each side is compiled and warmed up first (20 optimizer steps, excluded). Then, round
by round, each side runs N optimizer steps under one `time.perf_counter` interval with garbage
collection paused; the sides' order rotates every round. The table gives, by the wall clock
and by the process's CPU time (`time.process_time`, which other processes' load disturbs
less), the median ms per optimizer step per side, dew / hand as the ratio of medians (read
against the target), the median of the per-round paired ratios with their spread (lowest to
highest round), and dew / scan. When the load average is above 2 the process pins itself to
core 1 before JAX starts (`taskset -c 1` does the same).

Run: `python benchmarks/accumulate.py` (full), `--quick` (2 rounds, few steps), `--only NAME`
(repeatable: tiny, wide, lm-small, lm-wide), `--rounds N`.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOG_EVERY = 10
ACCUMULATE = 4
LEARNING_RATE = 1e-3
NAMES = ("tiny", "wide", "lm-small", "lm-wide")


@dataclass
class Case:
    name: str
    label: str
    objective: Any
    batch: dict[str, Any]  # the global batch, on the device
    steps: int
    parameters: int = 0
    micro: list[dict[str, Any]] = field(default_factory=list)  # its micro-batches


def build_cases(names: list[str], quick: bool) -> list[Case]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dew.nn.backbones.causal_transformer import CausalTransformer
    from dew.objectives.lm import LMObjective
    from dew.objectives.supervised import SupervisedObjective

    def mse(model, inputs, targets, sample_weight, key, training):
        return jnp.mean(jnp.square(jax.vmap(model)(inputs) - targets))

    rng = np.random.default_rng(0)

    def mlp(name: str, width: int, rows: int, steps: int) -> Case:
        model = eqx.nn.MLP(64, 1, width_size=width, depth=2, key=jax.random.key(0))
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        y = rng.standard_normal((rows, 1)).astype(np.float32)
        label = f"mlp 64-{width}-{width}-1 (batch {rows} = 4 x {rows // 4})"
        batch = {"inputs": jnp.asarray(x), "targets": jnp.asarray(y)}
        return Case(name, label, SupervisedObjective(model, mse), batch, steps)

    def lm(name: str, width: int, layers: int, heads: int, rows: int, steps: int) -> Case:
        model = CausalTransformer(
            vocab_size=256,
            emb_features=width,
            num_layers=layers,
            num_heads=heads,
            mlp_features=4 * width,
            max_seq_len=64,
            key=jax.random.key(0),
        )
        tokens = rng.integers(0, 256, (rows, 65), dtype=np.int32)
        label = f"transformer w{width} x{layers} (batch {rows} = 4 x {rows // 4}, seq 64)"
        return Case(
            name, label, LMObjective(model, seq_len=64), {"text": jnp.asarray(tokens)}, steps
        )

    scale = 0.2 if quick else 1.0
    plan = {
        "tiny": lambda: mlp("tiny", 32, 128, int(500 * scale)),
        "wide": lambda: mlp("wide", 512, 1024, int(50 * scale)),
        "lm-small": lambda: lm("lm-small", 128, 2, 4, 32, max(2, int(10 * scale))),
        "lm-wide": lambda: lm("lm-wide", 256, 4, 8, 16, max(2, int(5 * scale))),
    }
    built = []
    for name in names:
        case = plan[name]()
        leaves = jax.tree.leaves(case.objective.init_params())
        case.parameters = sum(int(leaf.size) for leaf in leaves)
        rows = jax.tree.leaves(case.batch)[0].shape[0] // ACCUMULATE
        case.micro = [  # contiguous slices: what a hand loop feeds one at a time
            jax.tree.map(
                lambda leaf, start=i * rows, end=(i + 1) * rows: leaf[start:end], case.batch
            )
            for i in range(ACCUMULATE)
        ]
        built.append(case)
    return built


class DewSide:
    def __init__(self, case: Case) -> None:
        import jax
        import optax

        from dew.data import Dataset
        from dew.training import Trainer

        self.trainer = Trainer(case.objective, optax.adam(LEARNING_RATE), jax.random.key(0))
        batch = case.batch
        self.data = Dataset(train=lambda partition: itertools.repeat(batch))
        self.state, self.done = None, 0

    def run(self, steps: int) -> None:
        import jax

        self.done += steps
        self.state = self.trainer.fit(
            self.data,
            steps=self.done,
            log_every=LOG_EVERY,
            accumulate=ACCUMULATE,
            progress=False,
            state=self.state,
        )
        jax.block_until_ready(self.state.params)


class HandSide:
    """Four jitted micro-steps summing gradients into donated buffers, then a jitted update."""

    def __init__(self, case: Case) -> None:
        import jax
        import jax.numpy as jnp
        import optax

        objective, optimizer, key = case.objective, optax.adam(LEARNING_RATE), jax.random.key(0)

        def micro(params: Any, sums: Any, batch: Any) -> Any:
            (loss, _), grads = jax.value_and_grad(objective.loss, has_aux=True)(params, batch, key)
            loss_sum, grad_sum = sums
            return loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)

        def update(params: Any, opt_state: Any, sums: Any) -> Any:
            loss_sum, grad_sum = sums
            grads = jax.tree.map(lambda g: g / ACCUMULATE, grad_sum)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss_sum / ACCUMULATE

        def zeros(params: Any) -> Any:
            return jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params)

        self.micro = jax.jit(micro, donate_argnums=1)
        self.update = jax.jit(update, donate_argnums=(0, 1))
        self.zeros = jax.jit(zeros)
        params = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), objective.init_params())
        self.params, self.opt_state = params, optimizer.init(params)
        self.batches, self.done, self.last = case.micro, 0, 0.0

    def run(self, steps: int) -> None:
        import jax

        micro, update, zeros, batches = self.micro, self.update, self.zeros, self.batches
        params, opt_state = self.params, self.opt_state
        for index in range(self.done + 1, self.done + steps + 1):
            sums = zeros(params)
            for batch in batches:
                sums = micro(params, sums, batch)
            params, opt_state, loss = update(params, opt_state, sums)
            if index % LOG_EVERY == 0:
                self.last = float(jax.device_get(loss))
        self.done += steps
        self.params, self.opt_state = params, opt_state
        jax.block_until_ready(params)


class ScanSide:
    """The same in one jitted function: a `lax.scan` over the stacked micro-batches."""

    def __init__(self, case: Case) -> None:
        import jax
        import jax.numpy as jnp
        import optax

        objective, optimizer, key = case.objective, optax.adam(LEARNING_RATE), jax.random.key(0)

        def step(carry: Any, stacked: Any) -> Any:
            params, opt_state = carry

            def body(sums: Any, batch: Any) -> Any:
                (loss, _), grads = jax.value_and_grad(objective.loss, has_aux=True)(
                    params, batch, key
                )
                return (sums[0] + loss, jax.tree.map(jnp.add, sums[1], grads)), None

            start = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
            (loss, grads), _ = jax.lax.scan(body, start, stacked)
            grads = jax.tree.map(lambda g: g / ACCUMULATE, grads)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss / ACCUMULATE

        self.step = jax.jit(step, donate_argnums=0)
        params = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), objective.init_params())
        self.carry = (params, optimizer.init(params))
        self.stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *case.micro)
        self.done, self.last = 0, 0.0

    def run(self, steps: int) -> None:
        import jax

        step, carry, stacked = self.step, self.carry, self.stacked
        for index in range(self.done + 1, self.done + steps + 1):
            carry, loss = step(carry, stacked)
            if index % LOG_EVERY == 0:
                self.last = float(jax.device_get(loss))
        self.done += steps
        self.carry = carry
        jax.block_until_ready(carry)


def timed(run: Callable[[int], None], steps: int) -> tuple[float, float]:
    """Wall and process CPU ms per optimizer step of `run(steps)`."""
    gc.collect()
    gc.disable()
    try:
        start, cpu = time.perf_counter(), time.process_time()
        run(steps)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return wall * 1e3 / steps, cpu * 1e3 / steps
    finally:
        gc.enable()


def measure(case: Case, rounds: int) -> dict[str, list[tuple[float, float]]]:
    sides = {"dew": DewSide(case), "hand": HandSide(case), "scan": ScanSide(case)}
    for side in sides.values():
        side.run(2 * LOG_EVERY)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    order = list(sides)
    for _ in range(rounds):
        for name in order:
            times[name].append(timed(sides[name].run, case.steps))
        order = order[1:] + order[:1]  # every side takes every position in turn
    return times


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def report(results: list[tuple[Case, dict[str, list[tuple[float, float]]]]]) -> None:
    columns = (
        "model",
        "clock",
        "dew ms",
        "hand ms",
        "dew / hand",
        "paired (spread)",
        "met",
        "scan ms",
        "dew / scan",
    )
    rows = []
    for case, times in results:
        for clock, index in (("wall", 0), ("cpu", 1)):
            series = {name: [round[index] for round in times[name]] for name in times}
            dew, hand, scan = (statistics.median(series[name]) for name in ("dew", "hand", "scan"))
            paired = [d / h for d, h in zip(series["dew"], series["hand"], strict=True)]
            rows.append(
                (
                    case.label if index == 0 else "",
                    clock,
                    f"{dew:.3f}",
                    f"{hand:.3f}",
                    f"{dew / hand:.3f}x",
                    f"{statistics.median(paired):.3f}x ({min(paired):.3f}-{max(paired):.3f})",
                    "yes" if dew / hand <= 1.05 else "NO",
                    f"{scan:.3f}",
                    f"{dew / scan:.3f}x",
                )
            )
    widths = [max(len(str(row[i])) for row in (columns, *rows)) for i in range(len(columns))]
    for row in (columns, *rows):
        cells = zip(row, widths, strict=True)
        print(
            "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(cells))
        )
    print()
    print(
        "ms = median ms per optimizer step (4 micro-batches), by the wall clock and by the "
        "process's CPU time (which other processes' load disturbs less); dew / hand = ratio of "
        "the medians (target <= 1.05x); paired = median of the per-round ratios (lowest-highest); "
        "scan = one jitted lax.scan + update, for reading."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, few steps")
    parser.add_argument("--only", action="append", choices=NAMES, help="this model (repeatable)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per side")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    pinned = load > 2 and hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1
    if pinned:  # before JAX starts its threads
        os.sched_setaffinity(0, {1})
    import jax

    rounds = args.rounds or (2 if args.quick else 7)
    cases = build_cases(args.only or list(NAMES), args.quick)
    versions = ", ".join(
        f"{package} {_version(package)}" for package in ("dew-ml", "jax", "equinox", "optax")
    )
    print("Gradient accumulation: Trainer.fit(accumulate=4) vs a hand-written loop")
    print(f"python {platform.python_version()}, {versions}, jax devices {jax.devices()}")
    print(
        f"load average at the start {load:.2f}"
        + (", pinned to core 1" if pinned else f", {os.cpu_count()} cores")
        + f"; {rounds} rounds per side, log_every {LOG_EVERY}, optax.adam({LEARNING_RATE})"
    )
    for case in cases:
        print(f"  {case.label}: {case.parameters:,} parameters, {case.steps} steps per round")
    print(flush=True)
    results = []
    for case in cases:
        results.append((case, measure(case, rounds)))
        print(f"measured {case.label}", flush=True)
    print()
    report(results)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
