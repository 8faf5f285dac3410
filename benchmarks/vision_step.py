"""Vision training steps and the diffusion sampler: `Trainer.fit` against a hand-written loop.

Design target (issue 13): a DiT and a JEPA training step through `Trainer.fit` cost <= 1.02x
a hand-written `jax.jit` + optax loop (with donation) on the same model and batch; and the
sampler's throughput, in samples per second, through `dew.evaluate` (the public entry point)
against a hand-jitted `objective.sample` over the same rows. This script measures them side
by side in one run; it asserts nothing and always exits 0.

Cases (float32, Adam at 1e-3, one fixed device batch of the synthetic `shapes` /
`moving_shapes` data, repeated with `itertools.repeat` on both sides):

- `dit`: class-conditional `DiT(16, 4, 3, width=64, depth=2, heads=4, num_classes=3)` under
  `DiffusionObjective(ema_decay=0.999)`, batch 32 images with labels.
- `video`: the same DiT with `frames=4` (64 tokens) on 16 clips.
- `jepa`: `JEPAObjective(ViT(width=64, depth=2, heads=4), ViT(width=32, depth=1, heads=4),
  ema_decay=0.996)`, batch 32 images.

What each side runs per step:

- `trainer`: `Trainer(objective, optimizer, key).fit(data, steps=..., log_every=10,
  progress=False, state=state)`, continuing from the previous round's state; the round ends
  with `jax.block_until_ready` on the params.
- `hand`: `jax.jit(step, donate_argnums=0)` where `step((params, ema, opt_state), batch, i)`
  draws the step key as `fold_in(key, i)`, runs `jax.value_and_grad` of the objective's loss
  (`objective.ema_loss(params, ema, ...)` for JEPA, whose target encoder is the EMA;
  `objective.loss` for the DiT), `optimizer.update`, `optax.apply_updates` and
  `dew.steps.ema_update`; every 10th step it pulls the loss dict to the host and converts
  each value with `float`, as the trainer does at a log step.

Sampler: 64 rows (labels for the image DiT), `Sampling(steps=20)` Euler and Heun.
`dew.evaluate(objective, params, [batch], metrics=[mse()], key=...)` against
`jax.jit(objective.sample)(params, labels, key)` plus the transfer of the samples to the
host; both compiled first.

Timing: both sides warm up first (compilation + 2 x log_every steps, excluded); then round by
round each side runs N steps in one `time.perf_counter` interval with garbage collection
paused, the order alternating. Reported: median and best ms per step, trainer / hand as the
ratio of medians (against the target), the median paired ratio.

Run: `python benchmarks/vision_step.py` (full: about 3 minutes on 2 idle cores),
`--quick` (smoke run), `--only NAME` (repeatable: dit, video, jepa, sampler).
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
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

# The benchmarks' shared interval: ms per step with garbage collection paused (run as a
# script, the folder of this file is on sys.path).
from trainer_overhead import timed

import dew
from dew import metrics
from dew.data import Dataset, Partition
from dew.nn.backbones.dit import DiT
from dew.nn.backbones.vit import ViT
from dew.objectives.base import Objective, ReadsEMAParams
from dew.objectives.diffusion import DiffusionObjective, Sampling
from dew.objectives.jepa import JEPAObjective
from dew.registry import moving_shapes, shapes
from dew.steps import ema_update
from dew.training import Trainer

LOG_EVERY = 10
LEARNING_RATE = 1e-3
TARGET = 1.02


@dataclass
class Case:
    name: str
    label: str
    objective: Objective
    batch: dict[str, jax.Array]
    steps: int
    rounds: int


def first_batch(dataset: Dataset, keep: tuple[str, ...]) -> dict[str, jax.Array]:
    batch = next(iter(dataset.train(Partition.current())))
    return {name: jnp.asarray(batch[name]) for name in keep}


def dit_case(steps: int, rounds: int) -> Case:
    model = DiT(16, 4, 3, width=64, depth=2, heads=4, num_classes=3, key=jax.random.key(0))
    objective = DiffusionObjective(model, ema_decay=0.999)
    batch = first_batch(shapes(rows=256, batch_size=32, seed=0), ("images", "labels"))
    return Case("dit", "DiT image (width 64, depth 2, batch 32)", objective, batch, steps, rounds)


def video_case(steps: int, rounds: int) -> Case:
    model = DiT(16, 4, 3, width=64, depth=2, heads=4, frames=4, key=jax.random.key(0))
    objective = DiffusionObjective(model, ema_decay=0.999)
    batch = first_batch(moving_shapes(rows=128, batch_size=16, seed=0), ("clips",))
    label = "DiT clips (4 frames, width 64, depth 2, batch 16)"
    return Case("video", label, objective, batch, steps, rounds)


def jepa_case(steps: int, rounds: int) -> Case:
    encoder = ViT(16, 4, 3, width=64, depth=2, heads=4, key=jax.random.key(0))
    predictor = ViT(16, 4, 3, width=32, depth=1, heads=4, key=jax.random.key(1))
    objective = JEPAObjective(encoder, predictor, ema_decay=0.996, key=jax.random.key(2))
    batch = first_batch(shapes(rows=256, batch_size=32, seed=0), ("images",))
    label = "JEPA ViT (width 64, depth 2; predictor 32, batch 32)"
    return Case("jepa", label, objective, batch, steps, rounds)


class TrainerSide:
    def __init__(self, case: Case) -> None:
        self.trainer = Trainer(case.objective, optax.adam(LEARNING_RATE), jax.random.key(0))
        batch = case.batch
        self.data = Dataset(train=lambda partition: itertools.repeat(batch))
        self.state = None
        self.done = 0

    def run(self, steps: int) -> None:
        self.done += steps
        self.state = self.trainer.fit(
            self.data, steps=self.done, log_every=LOG_EVERY, progress=False, state=self.state
        )
        jax.block_until_ready(self.state.params)


class HandSide:
    def __init__(self, case: Case) -> None:
        objective = case.objective
        optimizer = optax.adam(LEARNING_RATE)
        decay = objective.ema_decay
        key = jax.random.key(0)
        reads_ema = isinstance(objective, ReadsEMAParams)

        def step(carry: Any, batch: Any, index: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
            params, ema, opt_state = carry
            step_key = jax.random.fold_in(key, index)
            if reads_ema:
                loss_of = lambda p: objective.ema_loss(p, ema, batch, step_key)  # noqa: E731
            else:
                loss_of = lambda p: objective.loss(p, batch, step_key)  # noqa: E731
            (loss, aux), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params, ema_update(ema, params, decay), opt_state), {"loss": loss, **aux}

        self.step = jax.jit(step, donate_argnums=0)
        params = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), objective.init_params())
        ema = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), params)
        self.carry = (params, ema, optimizer.init(params))
        self.batches = itertools.repeat(case.batch)
        self.done = 0

    def run(self, steps: int) -> None:
        step, carry, batches = self.step, self.carry, self.batches
        for index in range(self.done + 1, self.done + steps + 1):
            carry, outputs = step(carry, next(batches), index)
            if index % LOG_EVERY == 0:
                self.last = {name: float(v) for name, v in jax.device_get(outputs).items()}
        self.done += steps
        self.carry = carry
        jax.block_until_ready(carry)


def measure(case: Case) -> dict[str, Any]:
    sides = {"trainer": TrainerSide(case), "hand": HandSide(case)}
    warmup = {}
    for name, side in sides.items():
        start = time.perf_counter()
        side.run(2 * LOG_EVERY)
        warmup[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for _ in range(case.rounds):
        for name in order:
            times[name].append(timed(sides[name].run, case.steps))
        order.reverse()
    return {"case": case, "warmup": warmup, **times}


def report_steps(results: list[dict[str, Any]]) -> None:
    print(
        f"{'model':<52} {'trainer ms':>10} {'best':>8} {'hand ms':>8} {'best':>8} "
        f"{'ratio':>7} {'paired':>7} {'target':>7} met"
    )
    for result in results:
        trainer, hand = statistics.median(result["trainer"]), statistics.median(result["hand"])
        paired = statistics.median(
            t / h for t, h in zip(result["trainer"], result["hand"], strict=True)
        )
        ratio = trainer / hand
        print(
            f"{result['case'].label:<52} {trainer:>10.3f} {min(result['trainer']):>8.3f} "
            f"{hand:>8.3f} {min(result['hand']):>8.3f} {ratio:>6.3f}x {paired:>6.3f}x "
            f"{'<= ' + format(TARGET, '.2f') + 'x':>7} {'yes' if ratio <= TARGET else 'NO'}"
        )
    for result in results:
        warm = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in result["warmup"].items())
        name = result["case"].name
        print(f"  warm-up (compilation + {2 * LOG_EVERY} steps, excluded) {name}: {warm}")


def sample_rates(
    objective: DiffusionObjective, batch: dict[str, jax.Array], rounds: int
) -> tuple[float, float]:
    """Samples per second through `dew.evaluate` and through a hand-jitted `sample`."""
    params, key, scored = objective.init_params(), jax.random.key(1), [metrics.mse()]
    rows = batch["images"].shape[0]
    sample = jax.jit(lambda p, labels, k: objective.sample(p, labels, k))

    def public() -> None:
        dew.evaluate(objective, params, [batch], metrics=scored, key=key)

    def hand() -> None:
        np.asarray(sample(params, batch["labels"], key))

    public()
    hand()
    runs: dict[str, list[float]] = {"public": [], "hand": []}
    for index in range(rounds):
        for name, run in (("public", public), ("hand", hand))[:: 1 if index % 2 else -1]:
            gc.collect()
            start = time.perf_counter()
            run()
            runs[name].append(time.perf_counter() - start)
    return rows / statistics.median(runs["public"]), rows / statistics.median(runs["hand"])


def sampler(rounds: int, rows: int = 64, steps: int = 20) -> None:
    model = DiT(16, 4, 3, width=64, depth=2, heads=4, num_classes=3, key=jax.random.key(0))
    batch = first_batch(shapes(rows=256, batch_size=rows, seed=0), ("images", "labels"))
    print(f"Sampler: {rows} rows, Sampling(steps={steps}), DiT image width 64 depth 2")
    print(f"{'solver':<8} {'dew.evaluate samples/s':>24} {'hand samples/s':>15} {'ratio':>7}")
    for solver in ("euler", "heun"):
        objective = DiffusionObjective(model, sampling=Sampling(solver=solver, steps=steps))
        public, hand = sample_rates(objective, batch, rounds)
        print(f"{solver:<8} {public:>24.1f} {hand:>15.1f} {hand / public:>6.3f}x")
    print(
        "  ratio = dew.evaluate time / hand time (the scoring pass adds the batch checks, the "
        "artifact and one mse reduction)"
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few steps, 2 rounds")
    parser.add_argument(
        "--only", action="append", choices=("dit", "video", "jepa", "sampler"), help="repeatable"
    )
    args = parser.parse_args()
    chosen = args.only or ["dit", "video", "jepa", "sampler"]
    steps, rounds = (20, 2) if args.quick else (100, 7)
    versions = ", ".join(
        f"{package} {_version(package)}" for package in ("dew-ml", "jax", "equinox", "optax")
    )
    print("Vision steps: Trainer.fit vs a hand-written jax.jit + optax loop (EMA on both sides)")
    print(f"python {platform.python_version()}, {versions}")
    print(
        f"cpu cores {os.cpu_count()}, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, log_every {LOG_EVERY}, "
        f"{rounds} rounds x {steps} steps per side"
    )
    builders = {"dit": dit_case, "video": video_case, "jepa": jepa_case}
    results = [measure(builders[name](steps, rounds)) for name in chosen if name in builders]
    if results:
        report_steps(results)
        print()
    if "sampler" in chosen:
        sampler(3 if args.quick else 7)
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.2f}")
    if load > (os.cpu_count() or 1):
        print("warning: the load exceeds the core count; ratios near 1 are within the noise.")


if __name__ == "__main__":
    main()
