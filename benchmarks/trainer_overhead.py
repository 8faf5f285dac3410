"""Trainer overhead: `Trainer.fit` against a hand-written `jax.jit` + optax loop with donation.

Design target (DESIGN.md, "Performance targets"): with `log_every=10`, `Trainer.fit` costs
<= 1.02x the hand-written loop per step on the 64-512-512-1 MLP (batch 256) and the ~470k
parameter causal transformer (seq 64, batch 32), and <= 1.10x on the tiny 64-32-32-1 MLP
(batch 32), which is dispatch-bound. Reference figures for the hand loop on a 2-core CPU:
0.077 ms, 2.7 ms and 97 ms per step. This script measures the ratios side by side in one run;
it asserts nothing and always exits 0.

Models (all float32, Adam at 1e-3):

- `mlp 64-32-32-1`: `eqx.nn.MLP(64, 1, width_size=32, depth=2)`, batch 32, mean squared error
  regression through a minimal `Objective` defined here (`RegressionObjective`).
- `mlp 64-512-512-1`: the same with width 512, batch 256.
- `transformer`: `CausalTransformer(vocab_size=256, emb_features=128, num_layers=2,
  num_heads=4, mlp_features=512, max_seq_len=64)`, 470,784 parameters, trained by
  `LMObjective(seq_len=64)` on batches of 32 rows of 65 token IDs.

What each side runs per step, on the same device batch (one fixed batch, put on the device
before timing and repeated with `itertools.repeat` on both sides):

- `trainer`: `Trainer(objective, optimizer, key).fit(data, steps=..., log_every=10,
  progress=False, state=state)`; each round continues from the state the previous round
  returned (so `TrainState.create` is not timed), and the round ends with
  `jax.block_until_ready` on the returned params.
- `hand`: `jax.jit(step, donate_argnums=0)` where `step((params, opt_state), batch)` runs
  `jax.value_and_grad(objective.loss, has_aux=True)`, `optimizer.update` and
  `optax.apply_updates` on the same objective (closed over, as a hand-written loop does) and
  returns the next `(params, opt_state)` and `{"loss": loss, **aux}`. Every 10th step it pulls
  that dict to the host with `jax.device_get` and converts each value with `float`, as the
  trainer does at each log step. The round ends with `jax.block_until_ready`.

Timing: both sides are compiled and warmed up first (one warm-up fit of 2 x log_every steps
and the same number of hand steps; excluded). Then, round by round, each side runs N steps
under one `time.perf_counter` interval, with garbage collection paused (a collection runs
before each interval); the order of the two sides reverses every round. The table shows the
median and best round's ms per step per side, trainer / hand as the ratio of the medians (read
against the target), the median of the per-round paired ratios and the ratio of the best
rounds, with the target and the reference hand-loop figure.

Run: `python benchmarks/trainer_overhead.py` (full: 3 minutes on 2 cores at load 6, most of it
the transformer's compilation and steps), `--quick` (smoke run: few steps, 2 rounds, about a
minute at load 6, nearly all compilation), `--only NAME` (repeatable: `tiny`,
`wide`, `transformer`), `--profile` (also cProfile one trainer fit of the tiny MLP and print
where the Python time goes).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.metadata
import io
import itertools
import os
import platform
import pstats
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew.artifacts import Representations
from dew.data import Dataset
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import Objective, combine, trainable
from dew.objectives.lm import LMObjective
from dew.training import Trainer

LOG_EVERY = 10
LEARNING_RATE = 1e-3
DIST = "dew-ml"


class RegressionObjective(Objective):
    """Mean squared error of an `eqx.nn.MLP` on `batch["x"]` against `batch["y"]`."""

    model: eqx.nn.MLP
    name: str = eqx.field(static=True, default="regression")

    def init_params(self) -> Any:
        return trainable(self.model)

    def loss(self, params: Any, batch: Any, key: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        predictions = jax.vmap(combine(params, self.model))(batch["x"])
        return jnp.mean((predictions - batch["y"]) ** 2), {}

    def evaluate(self, params: Any, batch: Any, key: Any) -> Representations:
        return Representations(jax.vmap(combine(params, self.model))(batch["x"]))

    def batch_keys(self, split: Any) -> dict[str, str | None]:
        return {"x": None, "y": None}

    def check_batch(self, batch: Any) -> None:
        return None

    def generate_preview(self, params: Any, batch: Any, key: Any) -> None:
        return None

    def default_metrics(self) -> tuple[()]:
        return ()


@dataclass
class Case:
    name: str
    label: str
    objective: Objective
    batch: dict[str, jax.Array]
    steps: int
    rounds: int
    target: float
    reference_ms: float
    parameters: int = 0


def mlp_case(
    name: str, width: int, rows: int, steps: int, rounds: int, target: float, reference_ms: float
) -> Case:
    model = eqx.nn.MLP(64, 1, width_size=width, depth=2, key=jax.random.key(0))
    generator = np.random.default_rng(0)
    x = generator.standard_normal((rows, 64)).astype(np.float32)
    y = generator.standard_normal((rows, 1)).astype(np.float32)
    return Case(
        name,
        f"mlp 64-{width}-{width}-1 (batch {rows})",
        RegressionObjective(model),
        {"x": jnp.asarray(x), "y": jnp.asarray(y)},
        steps,
        rounds,
        target,
        reference_ms,
    )


def transformer_case(steps: int, rounds: int) -> Case:
    model = CausalTransformer(
        vocab_size=256,
        emb_features=128,
        num_layers=2,
        num_heads=4,
        mlp_features=512,
        max_seq_len=64,
        key=jax.random.key(0),
    )
    tokens = np.random.default_rng(0).integers(0, 256, (32, 65), dtype=np.int32)
    return Case(
        "transformer",
        "causal transformer (seq 64, batch 32)",
        LMObjective(model, seq_len=64),
        {"text": jnp.asarray(tokens)},
        steps,
        rounds,
        1.02,
        97.0,
    )


def cases(args: argparse.Namespace) -> list[Case]:
    if args.quick:
        plan = {"tiny": (200, 2), "wide": (40, 2), "transformer": (10, 2)}
    else:
        plan = {"tiny": (2000, 11), "wide": (200, 9), "transformer": (10, 7)}
    built = []
    for name in args.only or ["tiny", "wide", "transformer"]:
        steps, rounds = plan[name]
        if name == "tiny":
            built.append(mlp_case("tiny", 32, 32, steps, rounds, 1.10, 0.077))
        elif name == "wide":
            built.append(mlp_case("wide", 512, 256, steps, rounds, 1.02, 2.7))
        else:
            built.append(transformer_case(steps, rounds))
    for case in built:
        leaves = jax.tree.leaves(case.objective.init_params())
        case.parameters = sum(int(leaf.size) for leaf in leaves)
    return built


class TrainerSide:
    def __init__(self, case: Case, steps_per_call: int = 1) -> None:
        self.steps_per_call = steps_per_call
        optimizer = optax.adam(LEARNING_RATE)
        self.trainer = Trainer(case.objective, optimizer, jax.random.key(0))
        batch = case.batch
        self.data = Dataset(train=lambda partition: itertools.repeat(batch))
        self.state = None
        self.done = 0

    def run(self, steps: int) -> None:
        self.done += steps
        self.state = self.trainer.fit(
            self.data,
            steps=self.done,
            log_every=LOG_EVERY,
            progress=False,
            state=self.state,
            steps_per_call=self.steps_per_call,
        )
        jax.block_until_ready(self.state.params)


class HandSide:
    def __init__(self, case: Case) -> None:
        objective = case.objective
        optimizer = optax.adam(LEARNING_RATE)
        key = jax.random.key(0)

        def step(carry: Any, batch: Any) -> tuple[Any, dict[str, jax.Array]]:
            params, opt_state = carry
            (loss, aux), grads = jax.value_and_grad(objective.loss, has_aux=True)(
                params, batch, key
            )
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), {"loss": loss, **aux}

        self.step = jax.jit(step, donate_argnums=0)
        params = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), objective.init_params())
        self.carry = (params, optimizer.init(params))
        self.batches = itertools.repeat(case.batch)
        self.done = 0
        self.last: dict[str, float] = {}

    def run(self, steps: int) -> None:
        step, carry, batches = self.step, self.carry, self.batches
        for index in range(self.done + 1, self.done + steps + 1):
            carry, outputs = step(carry, next(batches))
            if index % LOG_EVERY == 0:
                self.last = {name: float(value) for name, value in jax.device_get(outputs).items()}
        self.done += steps
        self.carry = carry
        jax.block_until_ready(carry)


def timed(run: Callable[[int], None], steps: int) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run(steps)
        return (time.perf_counter() - start) * 1e3 / steps
    finally:
        gc.enable()


@dataclass
class Result:
    case: Case
    trainer: list[float]
    hand: list[float]
    warmup_s: dict[str, float]
    fused: list[float]


def measure(case: Case) -> Result:
    sides = {
        "trainer": TrainerSide(case),
        "fused": TrainerSide(case, steps_per_call=LOG_EVERY),
        "hand": HandSide(case),
    }
    warmup_s = {}
    for name, side in sides.items():
        start = time.perf_counter()
        side.run(2 * LOG_EVERY)
        warmup_s[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for _ in range(case.rounds):
        for name in order:
            times[name].append(timed(sides[name].run, case.steps))
        order = order[1:] + order[:1]  # every side takes every position in turn
    return Result(case, times["trainer"], times["hand"], warmup_s, times["fused"])


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def header(args: argparse.Namespace, plan: list[Case]) -> None:
    versions = ", ".join(
        f"{package} {_version(package)}" for package in (DIST, "jax", "jaxlib", "equinox", "optax")
    )
    print("Trainer overhead: Trainer.fit vs a hand-written jax.jit + optax loop with donation")
    print(f"python {platform.python_version()}, {versions}")
    print(
        f"cpu cores {os.cpu_count()}, jax devices {jax.devices()}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"log_every {LOG_EVERY}, optax.adam({LEARNING_RATE}), mode "
        f"{'quick' if args.quick else 'full'}"
    )
    for case in plan:
        print(
            f"  {case.label}: {case.parameters:,} parameters, {case.rounds} rounds x "
            f"{case.steps} steps per side"
        )
    print()


def report(results: list[Result]) -> None:
    columns = (
        "model",
        "trainer ms",
        "best",
        "hand ms",
        "best",
        "ratio",
        "paired",
        "best",
        "target",
        "met",
        "ref hand ms",
        "fused ms",
        "fused / hand",
    )
    rows = []
    for result in results:
        trainer, hand = statistics.median(result.trainer), statistics.median(result.hand)
        paired = statistics.median(t / h for t, h in zip(result.trainer, result.hand, strict=True))
        ratio = trainer / hand
        rows.append(
            (
                result.case.label,
                f"{trainer:.4f}",
                f"{min(result.trainer):.4f}",
                f"{hand:.4f}",
                f"{min(result.hand):.4f}",
                f"{ratio:.3f}x",
                f"{paired:.3f}x",
                f"{min(result.trainer) / min(result.hand):.3f}x",
                f"<= {result.case.target:.2f}x",
                "yes" if ratio <= result.case.target else "NO",
                f"{result.case.reference_ms:g}",
                f"{statistics.median(result.fused):.4f}",
                f"{statistics.median(result.fused) / hand:.3f}x",
            )
        )
    widths = [max(len(str(row[i])) for row in (columns, *rows)) for i in range(len(columns))]
    for row in (columns, *rows):
        print(
            "  ".join(
                str(cell).rjust(width) if i else str(cell).ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
        )
    print()
    print(
        "ms = median wall ms per step over the rounds; best = the fastest round; ratio = "
        "trainer median / hand median (read against the target); paired = median of the "
        "per-round ratios. fused = Trainer.fit(..., steps_per_call=log_every): the steps "
        "between two log points in one compiled call (the stretch goal: beat the per-step "
        "hand loop on the tiny MLP, fused / hand < 1)."
    )
    for result in results:
        warm = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in result.warmup_s.items())
        print(
            f"warm-up (compilation + {2 * LOG_EVERY} steps, excluded) {result.case.label}: {warm}"
        )
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.2f}")
    if load > (os.cpu_count() or 1):
        print("warning: the load exceeds the core count; ratios near 1 are within the noise.")


def profile(steps: int) -> None:
    case = mlp_case("tiny", 32, 32, steps, 1, 1.10, 0.077)
    side = TrainerSide(case)
    side.run(2 * LOG_EVERY)
    profiler = cProfile.Profile()
    profiler.enable()
    side.run(steps)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(20)
    print(f"cProfile of Trainer.fit, tiny MLP, {steps} steps (sorted by own time):")
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few steps, 2 rounds")
    parser.add_argument(
        "--only",
        action="append",
        choices=("tiny", "wide", "transformer"),
        help="time only this model (repeatable)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also cProfile one trainer fit of the tiny MLP"
    )
    args = parser.parse_args()
    plan = cases(args)
    header(args, plan)
    results = []
    for case in plan:
        results.append(measure(case))
        print(f"measured {case.label}", flush=True)
    print()
    report(results)
    if args.profile:
        print()
        profile(200 if args.quick else 2000)


if __name__ == "__main__":
    main()
