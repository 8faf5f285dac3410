"""The causal transformer's own compute: dew's `CausalTransformer` against Flax NNX.

Target (issue 27, item 6): a jitted `value_and_grad` of dew's `CausalTransformer` plus a
plain cross entropy costs at most 1.05x the same step of a Flax NNX model of the same blocks,
in CPU time, at every size. This script measures the two side by side in one run; it asserts
nothing and always exits 0.

The peer is written here as an NNX user would: `nnx.Embed`, a position-embedding
`nnx.Param`, per block `nnx.LayerNorm` (epsilon 1e-5, as Equinox's), one fused `nnx.Linear`
for queries, keys and values, `nnx.dot_product_attention` (Flax's attention, which
`nnx.MultiHeadAttention` uses) with a causal mask, an output `nnx.Linear`, a GELU MLP of two
`nnx.Linear`s; a final `nnx.LayerNorm` and an `nnx.Linear` head. Both sides take the
`(batch, seq)` tokens at once: dew's model is called on the batch, as `LMObjective` calls it
(decision 0058); `--per-sequence` also times it `jax.vmap`ped over the sequences (the `vmap`
rows, how `LMObjective` called it before). dew's weights are copied into the peer (kernels
transposed), and the script prints the two losses and the largest gradient difference: the
sides compute the same function of the same weights.

What each side runs (the `step` rows): `jax.jit(jax.value_and_grad(loss))(params, tokens)`
where `loss` is the mean of `-log_softmax(logits)[target]` over `(batch, seq)`; NNX's
parameters are its `nnx.split` state, merged inside the jitted function (NNX's functional
API; `nnx.jit` adds Python overhead per call, not compute). The `fit` rows: dew's
`Trainer.fit` of `LMObjective` with `optax.adam(1e-3)`, `log_every=10`, against a jitted NNX
step (`value_and_grad`, `optax.adam(1e-3)`, donation, the loss pulled to the host every 10th
step).

Timing: both sides compiled and warmed first; then round by round each side runs N calls
(blocking on the result) under one interval, the order alternating, with garbage collection
paused. Reported per size: median CPU ms per call (`time.process_time`, the whole process)
and its spread (min-max), median wall ms, and dew / NNX as the ratio of the CPU medians,
against the target. When the load average is above 2 the process pins itself to one core
before JAX starts (`--no-pin` to keep every core), so XLA runs single-threaded on both sides.

Run: `python benchmarks/transformer_step.py` (full: 4 sizes; several minutes at load 10),
`--quick` (smoke run: the tiny size, 2 rounds), `--only NAME` (repeatable: tiny, d128,
d256, d512), `--no-fit` (the step rows only), `--per-sequence` (also the `vmap` rows).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TARGET = 1.05
LOG_EVERY = 10
LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class Size:
    name: str
    vocab: int
    emb: int
    layers: int
    heads: int
    mlp: int
    seq: int
    batch: int
    calls: int
    rounds: int


SIZES = {
    # tiny_lm's model and batch.
    "tiny": Size("tiny", 16, 64, 2, 4, 128, 32, 32, 20, 7),
    "d128": Size("d128", 256, 128, 2, 4, 512, 128, 32, 4, 5),
    "d256": Size("d256", 256, 256, 4, 4, 1024, 128, 16, 2, 5),
    "d512": Size("d512", 256, 512, 4, 8, 2048, 256, 8, 1, 3),
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny size, 2 rounds")
    parser.add_argument("--only", action="append", choices=list(SIZES), help="sizes to run")
    parser.add_argument("--no-fit", action="store_true", help="skip the Trainer.fit rows")
    parser.add_argument("--no-pin", action="store_true", help="never pin to one core")
    parser.add_argument(
        "--per-sequence", action="store_true", help="also time dew's model vmapped per sequence"
    )
    return parser.parse_args()


ARGS = parse()
PINNED = not ARGS.no_pin and os.getloadavg()[0] > 2 and len(os.sched_getaffinity(0)) > 1
if PINNED:  # before JAX starts, so XLA sizes its thread pool to the one core
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from dew.data import Dataset  # noqa: E402
from dew.nn.backbones.causal_transformer import CausalTransformer  # noqa: E402
from dew.objectives.base import combine, trainable  # noqa: E402
from dew.objectives.lm import LMObjective  # noqa: E402
from dew.training import Trainer  # noqa: E402

try:
    from flax import nnx
except ImportError:  # pragma: no cover - the peer is optional
    nnx = None


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


if nnx is not None:

    class NNXBlock(nnx.Module):
        def __init__(self, size: Size, rngs: nnx.Rngs) -> None:
            self.heads = size.heads
            self.norm_attention = nnx.LayerNorm(size.emb, epsilon=1e-5, rngs=rngs)
            self.qkv = nnx.Linear(size.emb, 3 * size.emb, rngs=rngs)
            self.out = nnx.Linear(size.emb, size.emb, rngs=rngs)
            self.norm_mlp = nnx.LayerNorm(size.emb, epsilon=1e-5, rngs=rngs)
            self.up = nnx.Linear(size.emb, size.mlp, rngs=rngs)
            self.down = nnx.Linear(size.mlp, size.emb, rngs=rngs)

        def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
            batch, seq, emb = x.shape
            qkv = self.qkv(self.norm_attention(x)).reshape(batch, seq, 3, self.heads, -1)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            attended = nnx.dot_product_attention(q, k, v, mask=mask)
            x = x + self.out(attended.reshape(batch, seq, emb))
            return x + self.down(jax.nn.gelu(self.up(self.norm_mlp(x))))

    class NNXTransformer(nnx.Module):
        def __init__(self, size: Size, rngs: nnx.Rngs) -> None:
            self.token_embedding = nnx.Embed(size.vocab, size.emb, rngs=rngs)
            self.position_embedding = nnx.Param(jnp.zeros((size.seq, size.emb)))
            self.blocks = nnx.List([NNXBlock(size, rngs) for _ in range(size.layers)])
            self.final_norm = nnx.LayerNorm(size.emb, epsilon=1e-5, rngs=rngs)
            self.head = nnx.Linear(size.emb, size.vocab, rngs=rngs)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            seq = tokens.shape[1]
            x = self.token_embedding(tokens) + self.position_embedding[...][:seq]
            mask = nnx.make_causal_mask(tokens)
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.final_norm(x))

    def copy_weights(model: CausalTransformer, peer: NNXTransformer) -> None:
        stack = model.stack

        def linear(source: Any, target: Any) -> None:
            target.kernel[...] = source.weight.T
            target.bias[...] = source.bias

        def norm(source: Any, target: Any) -> None:
            target.scale[...] = source.weight
            target.bias[...] = source.bias

        peer.token_embedding.embedding[...] = stack.token_embedding.weight
        peer.position_embedding[...] = stack.position_embedding
        for source, target in zip(stack.blocks, peer.blocks, strict=True):
            for name in ("norm_attention", "norm_mlp"):
                norm(getattr(source, name), getattr(target, name))
            for name in ("qkv", "out", "up", "down"):
                linear(getattr(source, name), getattr(target, name))
        norm(stack.final_norm, peer.final_norm)
        linear(stack.head, peer.head)


def build(size: Size) -> tuple[CausalTransformer, Any, jax.Array]:
    model = CausalTransformer(
        vocab_size=size.vocab,
        emb_features=size.emb,
        num_layers=size.layers,
        num_heads=size.heads,
        mlp_features=size.mlp,
        max_seq_len=size.seq,
        key=jax.random.key(0),
    )
    peer = None
    if nnx is not None:
        peer = NNXTransformer(size, nnx.Rngs(0))
        copy_weights(model, peer)
    tokens = np.random.default_rng(0).integers(0, size.vocab, (size.batch, size.seq + 1))
    return model, peer, jnp.asarray(tokens, jnp.int32)


def step_functions(model: CausalTransformer, peer: Any, tokens: jax.Array) -> dict[str, Any]:
    def dew_loss(params: Any, rows: jax.Array) -> jax.Array:
        return cross_entropy(combine(params, model)(rows[:, :-1]), rows[:, 1:])

    def vmap_loss(params: Any, rows: jax.Array) -> jax.Array:
        return cross_entropy(jax.vmap(combine(params, model))(rows[:, :-1]), rows[:, 1:])

    sides = {"dew": (jax.jit(jax.value_and_grad(dew_loss)), trainable(model))}
    if ARGS.per_sequence:
        sides["vmap"] = (jax.jit(jax.value_and_grad(vmap_loss)), trainable(model))
    if peer is not None:
        graphdef, state = nnx.split(peer)

        def peer_loss(state: Any, rows: jax.Array) -> jax.Array:
            return cross_entropy(nnx.merge(graphdef, state)(rows[:, :-1]), rows[:, 1:])

        sides["nnx"] = (jax.jit(jax.value_and_grad(peer_loss)), state)
    return sides


def agreement(sides: dict[str, Any], tokens: jax.Array) -> str:
    if "nnx" not in sides:
        return "no peer"
    (dew_value, dew_grads), (nnx_value, nnx_grads) = (
        sides[name][0](sides[name][1], tokens) for name in ("dew", "nnx")
    )
    stack = dew_grads.stack
    pairs = [(stack.token_embedding.weight, nnx_grads["token_embedding"]["embedding"])]
    pairs.append((stack.head.weight.T, nnx_grads["head"]["kernel"]))
    for index, block in enumerate(stack.blocks):
        for name in ("qkv", "out", "up", "down"):
            pairs.append(
                (getattr(block, name).weight.T, nnx_grads["blocks"][index][name]["kernel"])
            )
    worst = max(
        float(jnp.max(jnp.abs(a - b[...])) / (jnp.max(jnp.abs(a)) + 1e-30)) for a, b in pairs
    )
    return (
        f"loss dew {float(dew_value):.6f} nnx {float(nnx_value):.6f} "
        f"(diff {abs(float(dew_value) - float(nnx_value)):.1e}); "
        f"largest weight-gradient difference {worst:.1e} of its largest entry"
    )


def timed(call: Callable[[], Any], calls: int) -> tuple[float, float]:
    gc.collect()
    gc.disable()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(call())
        return (
            (time.process_time() - cpu) * 1e3 / calls,
            (time.perf_counter() - wall) * 1e3 / calls,
        )
    finally:
        gc.enable()


def alternate(runs: dict[str, Callable[[int], Any]], calls: int, rounds: int) -> dict[str, Any]:
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    order = list(runs)
    for _ in range(rounds):
        for name in order:
            times[name].append(runs[name](calls))
        order.reverse()
    return times


def measure_steps(size: Size, rounds: int) -> tuple[dict[str, Any], str]:
    model, peer, tokens = build(size)
    sides = step_functions(model, peer, tokens)
    for function, params in sides.values():
        jax.block_until_ready(function(params, tokens))
    check = agreement(sides, tokens)
    runs = {
        name: (lambda calls, f=function, p=params: timed(lambda: f(p, tokens), calls))
        for name, (function, params) in sides.items()
    }
    return alternate(runs, size.calls, rounds), check


class DewFit:
    def __init__(self, model: CausalTransformer, tokens: jax.Array, seq: int) -> None:
        self.trainer = Trainer(
            LMObjective(model, seq_len=seq), optax.adam(LEARNING_RATE), jax.random.key(0)
        )
        self.data = Dataset(train=lambda partition: itertools.repeat({"text": tokens}))
        self.state, self.done = None, 0

    def run(self, steps: int) -> Any:
        self.done += steps
        self.state = self.trainer.fit(
            self.data, steps=self.done, log_every=LOG_EVERY, progress=False, state=self.state
        )
        return self.state.params


class NNXFit:
    def __init__(self, peer: Any, tokens: jax.Array) -> None:
        graphdef, state = nnx.split(peer)
        optimizer = optax.adam(LEARNING_RATE)

        def loss(state: Any, rows: jax.Array) -> jax.Array:
            return cross_entropy(nnx.merge(graphdef, state)(rows[:, :-1]), rows[:, 1:])

        def step(carry: Any, rows: jax.Array) -> tuple[Any, jax.Array]:
            state, opt_state = carry
            value, grads = jax.value_and_grad(loss)(state, rows)
            updates, opt_state = optimizer.update(grads, opt_state, state)
            return (optax.apply_updates(state, updates), opt_state), value

        self.step = jax.jit(step, donate_argnums=0)
        self.carry = (state, optimizer.init(state))
        self.tokens, self.done = tokens, 0

    def run(self, steps: int) -> Any:
        for index in range(self.done + 1, self.done + steps + 1):
            self.carry, value = self.step(self.carry, self.tokens)
            if index % LOG_EVERY == 0:
                float(value)
        self.done += steps
        return self.carry


def measure_fit(size: Size, rounds: int) -> dict[str, Any]:
    model, peer, tokens = build(size)
    sides = {"dew": DewFit(model, tokens, size.seq)}
    if peer is not None:
        sides["nnx"] = NNXFit(peer, tokens)
    for side in sides.values():
        jax.block_until_ready(side.run(2 * LOG_EVERY))
    steps = LOG_EVERY * max(1, size.calls // LOG_EVERY)
    runs = {name: (lambda calls, s=side: timed_steps(s, calls)) for name, side in sides.items()}
    return alternate(runs, steps, rounds)


def timed_steps(side: Any, steps: int) -> tuple[float, float]:
    done = []
    cpu, wall = timed(lambda: done.append(side.run(steps)) or done[-1], 1)
    return cpu / steps, wall / steps


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def row(label: str, size: Size, times: dict[str, Any], side: str = "dew") -> None:
    cpu = {name: [t[0] for t in values] for name, values in times.items()}
    wall = {name: [t[1] for t in values] for name, values in times.items()}
    cells = []
    for name in (side, "nnx"):
        if name in cpu:
            cells.append(
                f"{statistics.median(cpu[name]):9.2f} ({min(cpu[name]):.2f}-{max(cpu[name]):.2f})"
                f" {statistics.median(wall[name]):9.2f}"
            )
        else:
            cells.append(f"{'-':>9s}")
    if "nnx" in cpu:
        ratio = statistics.median(cpu[side]) / statistics.median(cpu["nnx"])
        verdict = f"{ratio:5.2f}x  <= {TARGET}x  {'met' if ratio <= TARGET else 'NOT met'}"
    else:
        verdict = "no peer (pip install flax)"
    shape = f"d{size.emb} L{size.layers} seq{size.seq} b{size.batch} V{size.vocab}"
    print(f"{label:5s} {size.name:5s} {shape:28s} {cells[0]}  {cells[1]}  {verdict}", flush=True)


def main() -> None:
    names = ARGS.only or (["tiny"] if ARGS.quick else list(SIZES))
    rounds = 2 if ARGS.quick else None
    versions = ", ".join(
        f"{p} {_version(p)}" for p in ("dew-ml", "jax", "jaxlib", "equinox", "flax", "optax")
    )
    print("The causal transformer's step: dew's CausalTransformer vs a Flax NNX peer")
    print(f"python {platform.python_version()}, {versions}")
    print(
        f"cpu cores {os.cpu_count()}, affinity {sorted(os.sched_getaffinity(0))}"
        f"{' (pinned: load above 2)' if PINNED else ''}, jax devices {jax.devices()}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"dew from {sys.modules['dew'].__file__}")
    print(
        "ms per call: CPU median (min-max) and wall median; ratio = dew / nnx CPU medians\n"
        f"{'':5s} {'size':5s} {'':28s} {'dew cpu (spread)     wall':>37s}  "
        f"{'nnx cpu (spread)     wall':>37s}  ratio"
    )
    checks = []
    for name in names:
        size = SIZES[name]
        times, check = measure_steps(size, rounds or size.rounds)
        checks.append(f"{name}: {check}")
        row("step", size, times)
        if "vmap" in times:
            row("vmap", size, times, side="vmap")
    if not ARGS.no_fit:
        for name in names[:2]:
            size = SIZES[name]
            row("fit", size, measure_fit(size, rounds or size.rounds))
    print("\n".join(["same weights, same function:", *checks]))
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
