"""Multi-process costs: `Trainer.fit` and `dew.evaluate` under `jax.distributed` against a
hand-written `jax.distributed` loop with the same model, loss, optimizer and global batch.

Target (issue 29, item 6): two processes of dew's training step cost at most 1.1x the
hand-written loop's step on the same global batch; the same for an evaluation pass. This
script measures the sides in one run and asserts nothing; it always exits 0.

What each side runs, per model size (`tiny` is `dew train --config tiny_lm`'s model; `d128`
and `d256` widen it), on one global batch of 32 sequences of 32 tokens (dew's
`trainer.batch_size` is one process's rows, so it is set to 32 / processes):

- `dew fit`: what `dew train` runs, built as the recipe builds it: the configuration's
  `token_windows` data (`config.data.build`, each process reading its own `Partition`), its
  `LMObjective` and its `adamw` with the cosine schedule, then `Trainer.fit(data, steps,
  log_every=25, progress=False)` with no evaluation and no checkpoint. Its step time is read
  between two `step_end` events (an event sink stamps the time), so compilation and the fit's
  start and end are left out.
- `hand fit`: the loop a JAX user writes: a mesh over every process's device, parameters
  replicated and the batch sharded over the `data` axis (`jax.make_array_from_process_local_
  data`), one `jax.jit` of `value_and_grad` of the same model (the very module dew built)
  with `optax.softmax_cross_entropy_with_integer_labels` and the same optimizer, donated
  buffers, each process drawing its rows of the global batch with NumPy and the loss pulled
  to the host every 25 steps, as dew's log does.
- `dew eval`: `dew.evaluate(objective, params, data.val, metrics=perplexity and token
  accuracy)`, a whole pass of the validation split (10% of the tokens here, 24 global
  batches), end to end.
- `hand eval`: one `jax.jit` of the summed token negative log-likelihood and the correct
  tokens over a global batch, on the same local batches as dew's pass (read from its split
  once), the sums pulled to the host once at the end.
- `allgather`: `process_allgather` of two integers (what agreeing on a batch draw exchanges),
  per call.
- `all-reduce`: a compiled sum over the global batch's rows of 70,000 floats, as one operand
  and as 32 operands of the same total size (the compiled steps' gradient all-reduce has 31
  and 32), per call: the CPU collectives reduce a tuple's operands one by one, each its own
  rendezvous of the processes (decision 0090).

Both sides run in the same processes, round by round, the order alternating, so launches and
machine load fall on both alike. Each process runs XLA on one thread and, unless `--no-pin`,
is pinned to its own core (process `r` to core `r`); the one-process rows use one core too.
Reported: medians over the rounds (ms per step, per pass, per call), the spread (min-max), and
the ratios dew / hand.

Run: `python benchmarks/multi_process.py` (3 sizes, 2 and 1 processes, 5 rounds),
`--quick` (tiny only, 2 rounds), `--only NAME` (repeatable), `--rounds N`, `--profile`
(cProfile of one dew chunk on process zero, the top entries printed).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {
    "tiny": {"emb_features": 64, "mlp_features": 128},
    "d128": {"emb_features": 128, "mlp_features": 256},
    "d256": {"emb_features": 256, "mlp_features": 512},
}
LOG_EVERY = 25
GLOBAL_BATCH = 32  # rows of one step's global batch, whatever the process count
CHUNK = 100  # steps per fit call; the time is read between its first and last log step
TARGET = 1.1
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"


def _config(size: str, processes: int):
    """The recipe's configuration at `size`, each of `processes` processes reading its share
    of the global batch: `trainer.batch_size` is the rows of one process's batch."""
    from dew.config import builtin
    from dew.config._overrides import override

    point = {f"model.kwargs.{name}": value for name, value in SIZES[size].items()}
    point["trainer.batch_size"] = GLOBAL_BATCH // processes
    return override(builtin("tiny_lm"), {**point, "data.kwargs.val_fraction": 0.1})


class _Stamps:
    """An event sink that stamps each `step_end` event with the wall time."""

    def __init__(self) -> None:
        self.times: list[tuple[int, float]] = []

    def on_event(self, event) -> None:
        if event.name == "step_end":
            self.times.append((event.step, time.perf_counter()))


def _worker(size: str, rounds: int, out: str, profile: bool) -> None:
    import jax
    import numpy as np

    from dew import distributed

    if os.environ.get("JAX_NUM_PROCESSES", "1") != "1":
        distributed.initialize()
    import equinox as eqx
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dew import Trainer, evaluate, metrics
    from dew._processes import _allgather
    from dew.config._recipe import build_objective
    from dew.data import Partition

    config = _config(size, jax.process_count())
    settings = config.trainer
    total = CHUNK * (rounds + 1)
    seed = jax.random.key(0)
    objective = build_objective(config, None, seed)
    data = config.data.build(batch_size=settings.batch_size, seed=settings.seed)
    rank, count = jax.process_index(), jax.process_count()
    local_rows = settings.batch_size
    seq_len = config.data.kwargs["seq_len"]
    vocab = config.data.kwargs["vocab_size"]

    # --- dew: the recipe's trainer, one fit call per chunk ---------------------------------
    trainer = Trainer(objective, config.optim.build(total), key=jax.random.key(1))
    stamps = _Stamps()
    fit_state = None

    def dew_chunk(upto: int) -> float:
        nonlocal fit_state
        stamps.times.clear()
        fit_state = trainer.fit(
            data, upto, log_every=LOG_EVERY, progress=False, event_sinks=[stamps], state=fit_state
        )
        (first, t0), (last, t1) = stamps.times[0], stamps.times[-1]
        return (t1 - t0) / (last - first)

    # --- hand: jit + optax over a data mesh -------------------------------------------------
    mesh = jax.make_mesh((jax.device_count(),), ("data",), (jax.sharding.AxisType.Auto,))
    rows_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    params, static = eqx.partition(objective.model, eqx.is_array)
    optimizer = config.optim.build(total)

    def to_global(leaf):
        return jax.make_array_from_process_local_data(replicated, np.asarray(leaf))

    hand_params = jax.tree.map(to_global, params)
    hand_opt = jax.jit(optimizer.init, out_shardings=replicated)(hand_params)

    def loss_fn(p, tokens):
        model = eqx.combine(p, static)
        logits = jax.vmap(model)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def hand_step(p, o, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens)
        updates, o = optimizer.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    hand_step = jax.jit(hand_step, donate_argnums=(0, 1), out_shardings=replicated)
    text = np.random.default_rng(7).integers(0, vocab, 1 << 18).astype(np.int32)
    window = np.arange(seq_len + 1)
    hand_count = 0

    def hand_batch(step: int):
        rng = np.random.default_rng(step * count + rank)
        starts = rng.integers(0, len(text) - seq_len - 1, local_rows)
        return jax.make_array_from_process_local_data(rows_sharding, text[starts[:, None] + window])

    def hand_chunk(steps: int) -> float:
        nonlocal hand_params, hand_opt, hand_count
        t0 = None
        for index in range(1, steps + 1):
            hand_count += 1
            hand_params, hand_opt, loss = hand_step(hand_params, hand_opt, hand_batch(hand_count))
            if index % LOG_EVERY == 0:
                float(loss.addressable_data(0))
                if index == LOG_EVERY:
                    t0 = time.perf_counter()
        return (time.perf_counter() - t0) / (steps - LOG_EVERY)

    # --- evaluation --------------------------------------------------------------------------
    scoring = [metrics.perplexity(), metrics.token_accuracy()]
    local_val = [dict(batch) for batch in data.val(Partition(rank, count))]
    (field,) = local_val[0]

    def dew_eval() -> float:
        t0 = time.perf_counter()
        evaluate(objective, fit_state.params, data.val, metrics=scoring, key=jax.random.key(2))
        return time.perf_counter() - t0

    @jax.jit
    def hand_sums(p, tokens):
        logits = jax.vmap(eqx.combine(p, static))(tokens[:, :-1])
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        return nll.sum(), (logits.argmax(-1) == tokens[:, 1:]).sum()

    hand_sums = jax.jit(hand_sums, out_shardings=replicated)

    def hand_eval() -> float:
        t0 = time.perf_counter()
        total_nll, total_right = 0.0, 0
        for batch in local_val:
            tokens = jax.make_array_from_process_local_data(rows_sharding, batch[field])
            nll, right = hand_sums(hand_params, tokens)
            total_nll, total_right = total_nll + nll, total_right + right
        float(jax.device_get(total_nll.addressable_data(0)))
        return time.perf_counter() - t0

    def gather_cost(calls: int = 200) -> float:
        row = np.array([0, local_rows], np.int64)
        t0 = time.perf_counter()
        for _ in range(calls):
            _allgather(row) if count > 1 else multihost_utils.process_allgather(row)
        return (time.perf_counter() - t0) / calls

    def allreduce_cost(operands: int, total: int = 70_000, calls: int = 50) -> float:
        size = total // operands
        summed = jax.jit(lambda xs: [x.sum(0) for x in xs], out_shardings=replicated)
        ones = np.ones((1, size), np.float32)  # one row a process
        xs = [jax.make_array_from_process_local_data(rows_sharding, ones) for _ in range(operands)]
        for _ in range(3):
            jax.block_until_ready(summed(xs))
        t0 = time.perf_counter()
        for _ in range(calls):
            out = summed(xs)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / calls

    # Warm up (compile) both sides once, then alternate.
    dew_chunk(CHUNK)
    hand_chunk(CHUNK)
    dew_eval()
    hand_eval()
    results: dict[str, list[float]] = {key: [] for key in ("dew", "hand", "dew_eval", "hand_eval")}
    for index in range(rounds):
        upto = CHUNK * (index + 2)
        pairs = [("dew", lambda u=upto: dew_chunk(u)), ("hand", lambda: hand_chunk(CHUNK))]
        evals = [("dew_eval", dew_eval), ("hand_eval", hand_eval)]
        if index % 2:
            pairs.reverse()
            evals.reverse()
        for name, run in [*pairs, *evals]:
            if profile and name == "dew" and index == rounds - 1 and rank == 0:
                profiler = cProfile.Profile()
                results[name].append(profiler.runcall(run))
                stats = pstats.Stats(profiler).sort_stats("cumulative")
                stats.print_stats(40)
            else:
                results[name].append(run())
    results["allgather"] = [gather_cost()]
    results["allreduce"] = [allreduce_cost(1), allreduce_cost(32)]
    if rank == 0:
        with open(out, "w") as file:
            json.dump(results, file)


def _launch(size: str, count: int, rounds: int, pin: bool, profile: bool) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "rank0.json")
        port = _free_port()
        processes = []
        for rank in range(count):
            env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + ONE_THREAD).strip()
            env.update(
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES=str(count),
                JAX_PROCESS_ID=str(rank),
            )
            command = [sys.executable, __file__, "--worker", size, "--rounds", str(rounds)]
            command += ["--out", out] + (["--profile"] if profile else [])
            if pin:
                command = ["taskset", "-c", str(rank % os.cpu_count()), *command]
            processes.append(subprocess.Popen(command, env=env))
        codes = [process.wait(timeout=3600) for process in processes]
        if any(codes):
            raise SystemExit(f"a worker failed: exit statuses {codes}")
        with open(out) as file:
            return json.load(file)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cell(values: list[float], scale: float = 1e3) -> str:
    median = statistics.median(values) * scale
    return f"{median:8.2f} ({min(values) * scale:.2f}-{max(values) * scale:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", metavar="SIZE")
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", action="append", choices=sorted(SIZES))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.rounds, args.out, args.profile)
        return
    sizes = args.only or (["tiny"] if args.quick else list(SIZES))
    rounds = 2 if args.quick else args.rounds
    print(f"load before: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    print(f"rounds {rounds}, {CHUNK} steps per fit call, global batch 32 x 32 tokens")
    print("ms per step / per pass / per call: median (min-max); ratios are dew / hand medians")
    for size in sizes:
        for count in (2, 1):
            result = _launch(size, count, rounds, not args.no_pin, args.profile and count == 2)
            ratio = statistics.median(result["dew"]) / statistics.median(result["hand"])
            eval_ratio = statistics.median(result["dew_eval"]) / statistics.median(
                result["hand_eval"]
            )
            gather = result["allgather"][0] / statistics.median(result["hand"])
            print(
                f"{size:5} {count} process(es)  step: dew {_cell(result['dew'])}  hand "
                f"{_cell(result['hand'])}  dew/hand {ratio:.2f}x (target {TARGET}x)\n"
                f"{'':20}pass: dew {_cell(result['dew_eval'])}  hand "
                f"{_cell(result['hand_eval'])}  dew/hand {eval_ratio:.2f}x\n"
                f"{'':20}allgather of 2 ints: {result['allgather'][0] * 1e3:.3f} ms a call, "
                f"{gather:.2f}x the hand step\n"
                f"{'':20}all-reduce of 70,000 floats: {result['allreduce'][0] * 1e3:.2f} ms "
                f"as 1 operand, {result['allreduce'][1] * 1e3:.2f} ms as 32"
            )
    print(f"load after: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
