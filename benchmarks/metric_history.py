"""The metric history's growth curve: the cost of one append, and of one logged step of
`Trainer.fit`, at 1k to 1M log points.

Target (issue 27, item 1): the per-step time of `Trainer.fit` with `log_every=1` stays flat
within 10% from 1k to 1M log points; an append to `state.metric_history` is O(1) amortised.
This script measures the growth curve side by side in one run; it asserts nothing and always
exits 0. Run it with `PYTHONPATH=<checkout>/src` to time another checkout's code (the
"before" figures: main's code).

Parts:

- `append`: `MetricHistory.with_values({"lm/train/loss": v, "lm/train/token_accuracy": v},
  step)`, the call `Trainer.fit` makes at each log step (two tags: an LM's training
  metrics), on a history prefilled with N points per tag (built untimed, a fresh one each
  round), then appends timed under one `time.perf_counter` interval, each to the history
  the last returned: N // 4 of them (at least 1,000, so a list's growth is amortised as in
  a run), or fewer when 0.3 s has passed (the clock read every 8 appends). Sides: `dew
  with_values`; `dew with_values + hash` (each new history hashed too, as a jitted
  function that took the history as a static argument would; the prefill hashed untimed);
  the floor `dict of lists`, `series[tag].append((step, value))` on a plain dict of lists
  prefilled alike. Ratio = dew / floor per append.
- `fit`: `Trainer.fit(data, steps=start + S, log_every=1, progress=False, state=state)` on
  the 64-32-32-1 MLP of `trainer_overhead.py` (batch 32, Adam, one fixed batch on the
  device), the state's history prefilled with N points (untimed, fresh each round), so the
  fit appends its S points to a history of N. Ratio = ms per step at N / ms per step at the
  smallest N (the target: <= 1.10x at every N).
- `run` (full mode, `--run-steps`): one fit of `--run-steps` steps with `log_every=1` run as
  consecutive `Trainer.fit` calls of 1,000 steps each continuing from the last state (the
  history grows with the run, as a real run's does); ms per step of the chunk at steps
  1k-2k against the chunks from two thirds of the run on (chunks of 250 steps).

Timing: garbage collection paused during each interval (a collection runs before it); the
sides (sizes, for `fit`) alternate round by round, their order reversed every round. The
tables show medians over the rounds, the spread (min-max) and the ratios. When the load
average exceeds 2 the process pins itself to one core (`os.sched_setaffinity`), so every
side runs on the same core.

Run: `python benchmarks/metric_history.py` (full: 4 minutes on 2 cores at load 17; with
main's code 15 minutes, nearly all the 1M rows), `--quick` (smoke: 1k-100k points, a few
rounds, a 3,000-step run: about 45 s at load 10), `--run-steps N` (the `run` part's
length; 0 skips it), `--fit-steps`, `--fit-rounds` (the `fit` part's steps a round and
rounds), `--part append|fit|run` (repeatable: only these parts).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

TAGS = ("lm/train/loss", "lm/train/token_accuracy")
FIT_TAG = "regression/train/loss"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _timed(run: Callable[[], None], count: Callable[[], int]) -> tuple[float, float]:
    """Wall and process CPU seconds of `run()`, each divided by `count()` after it."""
    gc.collect()
    gc.disable()
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu
    finally:
        gc.enable()
    return wall / count(), cpu / count()


def _points(size: int) -> tuple[tuple[int, float], ...]:
    return tuple((step, 0.5) for step in range(size))


def _spread(values: list[float], scale: float) -> str:
    return f"{min(values) * scale:.3g}-{max(values) * scale:.3g}"


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in (columns, *rows)) for i in range(len(columns))]
    for row in (columns, *rows):
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


# -- append ------------------------------------------------------------------------------


BUDGET_S = 0.3  # a round's appends stop at N // 4 or once this much time has passed
CHECK_EVERY = 8  # appends between two looks at the clock


def _appending(append: Callable[[int], None], start: int, most: int) -> int:
    """Call `append(step)` for steps from `start`, at most `most` times and until
    `BUDGET_S` has passed (looked at every `CHECK_EVERY` appends); the number made."""
    deadline = time.perf_counter() + BUDGET_S
    made = 0
    while made < most:
        upto = min(made + CHECK_EVERY, most)
        for step in range(start + made, start + upto):
            append(step)
        made = upto
        if time.perf_counter() > deadline:
            break
    return made


def append_sides(size: int) -> dict[str, Callable[[], tuple[float, float]]]:
    from dew.steps import MetricHistory

    points = _points(size)
    values = dict.fromkeys(TAGS, 0.25)
    most = max(1000, size // 4)

    def history(hashing: bool) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            state = MetricHistory(dict.fromkeys(TAGS, points))
            if hashing:
                hash(state)  # the prefill's hash, as if it had been hashed at each append

            def append(step: int) -> None:
                nonlocal state
                state = state.with_values(values, step)
                if hashing:
                    hash(state)

            made = 0

            def appending() -> None:
                nonlocal made
                made = _appending(append, size, most)

            timing = _timed(appending, lambda: made)
            assert len(state[TAGS[0]]) == size + made
            return timing

        return run

    def floor() -> tuple[float, float]:
        series = {tag: list(points) for tag in TAGS}

        def append(step: int) -> None:
            for tag, value in values.items():
                series[tag].append((step, value))

        made = 0

        def appending() -> None:
            nonlocal made
            made = _appending(append, size, most)

        return _timed(appending, lambda: made)

    return {
        "dict of lists": floor,
        "dew with_values": history(False),
        "dew with_values + hash": history(True),
    }


def _medians(timings: list[tuple[float, float]]) -> tuple[float, float]:
    """The median wall and the median CPU time of `timings`."""
    return (
        statistics.median(wall for wall, _ in timings),
        statistics.median(cpu for _, cpu in timings),
    )


def measure_appends(sizes: list[int], rounds: int) -> None:
    print("== append: us per append of two tags' values, to a history of N points a tag ==")
    rows = []
    for size in sizes:
        sides = append_sides(size)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        order = list(sides)
        for _ in range(rounds):
            for name in order:
                times[name].append(sides[name]())
            order.reverse()
        floor_wall, floor_cpu = _medians(times["dict of lists"])
        for name in ("dict of lists", "dew with_values", "dew with_values + hash"):
            wall, cpu = _medians(times[name])
            rows.append(
                (
                    f"{size:,}",
                    name,
                    f"{wall * 1e6:.2f}",
                    f"{cpu * 1e6:.2f}",
                    _spread([cpu for _, cpu in times[name]], 1e6),
                    f"{wall / floor_wall:.1f}x",
                    f"{cpu / floor_cpu:.1f}x",
                )
            )
        print(f"measured N = {size:,}", flush=True)
    _table(("N", "side", "wall us", "cpu us", "cpu spread", "wall/floor", "cpu/floor"), rows)
    print(
        "wall, cpu = medians over the rounds of wall-clock and process CPU time per append; "
        "cpu spread = min-max over the rounds; floor = the dict of lists at the same N."
    )
    print()


# -- fit ---------------------------------------------------------------------------------


def tiny_trainer() -> tuple[Any, Any]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dew.artifacts import Representations
    from dew.data import Dataset
    from dew.objectives.base import Objective, combine, trainable
    from dew.training import Trainer

    class RegressionObjective(Objective):
        """Mean squared error of an `eqx.nn.MLP` on `batch["x"]` against `batch["y"]`."""

        model: eqx.nn.MLP
        name: str = eqx.field(static=True, default="regression")

        def init_params(self) -> Any:
            return trainable(self.model)

        def loss(self, params: Any, batch: Any, key: Any) -> tuple[jax.Array, dict]:
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

    model = eqx.nn.MLP(64, 1, width_size=32, depth=2, key=jax.random.key(0))
    generator = np.random.default_rng(0)
    batch = {
        "x": jnp.asarray(generator.standard_normal((32, 64)).astype(np.float32)),
        "y": jnp.asarray(generator.standard_normal((32, 1)).astype(np.float32)),
    }
    trainer = Trainer(RegressionObjective(model), optax.adam(1e-3), jax.random.key(0))
    return trainer, Dataset(train=lambda partition: itertools.repeat(batch))


class Fit:
    """Consecutive fits of one trainer, each continuing from the state the last returned."""

    def __init__(self) -> None:
        import jax

        self.trainer, self.data = tiny_trainer()
        self.state = self.trainer.fit(self.data, steps=2, log_every=1, progress=False)
        jax.block_until_ready(self.state.params)

    def run(self, steps: int, history: Any = None) -> tuple[float, float]:
        """Wall and CPU seconds per step of a fit of `steps` more steps (from a state
        holding `history`)."""
        import jax

        state = self.state
        if history is not None:
            state = dataclasses.replace(state, metric_history=history)
        end = int(state.step) + steps

        def fit() -> None:
            self.state = self.trainer.fit(
                self.data, steps=end, log_every=1, progress=False, state=state
            )
            jax.block_until_ready(self.state.params)

        return _timed(fit, lambda: steps)


def measure_fits(fit: Fit, sizes: list[int], steps: int, rounds: int) -> None:
    from dew.steps import MetricHistory

    print(
        f"== fit: ms per step of Trainer.fit(log_every=1), {steps} steps from a history of "
        "N points =="
    )
    points = {size: _points(size) for size in sizes}
    times: dict[int, list[tuple[float, float]]] = {size: [] for size in sizes}
    order = list(sizes)
    for _ in range(rounds):
        for size in order:
            history = MetricHistory({FIT_TAG: points[size]})
            times[size].append(fit.run(steps, history))
        order.reverse()
    base_wall, base_cpu = _medians(times[sizes[0]])
    rows = []
    for size in sizes:
        wall, cpu = _medians(times[size])
        paired = statistics.median(
            mine[1] / first[1] for mine, first in zip(times[size], times[sizes[0]], strict=True)
        )
        rows.append(
            (
                f"{size:,}",
                f"{wall * 1e3:.4f}",
                f"{cpu * 1e3:.4f}",
                _spread([cpu for _, cpu in times[size]], 1e3),
                f"{wall / base_wall:.3f}x",
                f"{cpu / base_cpu:.3f}x",
                f"{paired:.3f}x",
                "<= 1.10x",
                "yes" if max(wall / base_wall, cpu / base_cpu) <= 1.10 else "NO",
            )
        )
    first = f"N={sizes[0]:,}"
    columns = ("N", "wall ms", "cpu ms", "cpu spread", f"wall/{first}", f"cpu/{first}")
    _table((*columns, "cpu paired", "target", "met"), rows)
    print(
        "wall, cpu = medians over the rounds of wall-clock and process CPU time per step; "
        f"cpu paired = the median over the rounds of each round's cpu at N / at {first}; "
        "met = the wall and cpu ratios within the target."
    )
    print()


def measure_run(fit: Fit, run_steps: int, chunk: int = 250) -> None:
    from dew.steps import MetricHistory

    print(f"== run: one fit of {run_steps:,} steps with log_every=1, in chunks of {chunk:,} ==")
    fit.state = dataclasses.replace(fit.state, metric_history=MetricHistory())
    chunks = [fit.run(chunk) for _ in range(run_steps // chunk)]
    early = chunks[1000 // chunk : 2000 // chunk]  # steps 1k-2k
    late_from = (2 * len(chunks)) // 3
    late = chunks[late_from:]
    for kind in ("wall", "cpu"):
        pick = 0 if kind == "wall" else 1
        before = statistics.median(timing[pick] for timing in early)
        after = statistics.median(timing[pick] for timing in late)
        ratio = after / before
        print(
            f"{kind} ms per step: steps 1,000-2,000 {before * 1e3:.4f}; steps "
            f"{late_from * chunk:,}-{len(chunks) * chunk:,} {after * 1e3:.4f} (spread "
            f"{_spread([timing[pick] for timing in late], 1e3)} over {len(late)} chunks); "
            f"late / early {ratio:.3f}x (target <= 1.10x: {'yes' if ratio <= 1.10 else 'NO'})"
        )
    print(f"history points at the end: {len(fit.state.metric_history[FIT_TAG]):,}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1k-100k, few rounds")
    parser.add_argument("--run-steps", type=int, default=None, help="the run part's steps")
    parser.add_argument("--fit-steps", type=int, default=None, help="steps a fit round")
    parser.add_argument("--fit-rounds", type=int, default=None, help="rounds of the fit part")
    parser.add_argument(
        "--part",
        action="append",
        choices=("append", "fit", "run"),
        help="run only this part (repeatable; default all)",
    )
    args = parser.parse_args()
    pinned = os.getloadavg()[0] > 2 and hasattr(os, "sched_setaffinity")
    if pinned:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[-1]})
    import jax

    import dew

    if args.quick:
        sizes, append_rounds, fit_steps, fit_rounds = [1_000, 10_000, 100_000], 3, 200, 3
        run_steps = 3_000 if args.run_steps is None else args.run_steps
    else:
        sizes = [1_000, 10_000, 100_000, 1_000_000]
        append_rounds, fit_steps, fit_rounds = 7, 500, 5
        run_steps = 30_000 if args.run_steps is None else args.run_steps
    fit_steps = args.fit_steps or fit_steps
    fit_rounds = args.fit_rounds or fit_rounds
    parts = set(args.part or ("append", "fit", "run"))
    versions = ", ".join(
        f"{package} {_version(package)}" for package in ("dew-ml", "jax", "jaxlib", "equinox")
    )
    print("The metric history's growth curve: an append, and a logged step of Trainer.fit")
    print(f"python {platform.python_version()}, {versions}; dew from {dew.__file__}")
    print(
        f"cpu cores {os.cpu_count()}, affinity {sorted(os.sched_getaffinity(0))}"
        f"{' (pinned: load > 2)' if pinned else ''}, jax devices {jax.devices()}, "
        f"load average {_load()}, mode {'quick' if args.quick else 'full'}"
    )
    print()
    if "append" in parts:
        measure_appends(sizes, append_rounds)
    fit = Fit()
    if "fit" in parts:
        measure_fits(fit, sizes, fit_steps, fit_rounds)
    if run_steps and "run" in parts:
        measure_run(fit, run_steps)
    print(f"load average at the end: {_load()}")


if __name__ == "__main__":
    main()
