"""Generation with the key/value cache: `dew.objectives.lm.generate` against recomputing the
whole prefix for every token, and against a hand-written cached loop in plain JAX.

Design targets (issue 26, item 2): with the cache, tokens per second at least 5x those of
recomputing the whole sequence for every new token (what `sample_continuations` did before
the cache) at 256 new tokens; and `generate` at most 1.1x the time of a hand-written jitted
cached loop on the same weights. This script measures both side by side in one run; it
asserts nothing and always exits 0.

Models (float32, initialised from `jax.random.key(0)`; the numbers do not depend on the
weights):

- `tiny_lm`: the built-in `tiny_lm` config's sizes (vocab 16, width 64, 2 layers, 4 heads,
  MLP 128) with `max_seq_len` 512 instead of 40, so 256 new tokens fit.
- `larger`: vocab 256, width 256, 4 layers, 8 heads, MLP 1024, `max_seq_len` 512.

Each call continues 8 prompts of 16 tokens (4 for the larger model) by 64, 128 and 256
tokens, sampling at temperature 1 with no filters and no stop token, so every side generates
every token. What each side runs, compiled once (excluded from the timings) and called with
the model as an argument:

- `cache`: `generate(model, prompts, max_new_tokens=n, key=key)`, the public call (its
  argument checks included), then `jax.block_until_ready` on the tokens.
- `recompute`: the pre-cache `sample_continuations`, kept below as `recompute_continuations`:
  a `lax.fori_loop` whose every step runs the model over the whole `(rows, 16 + n)` buffer
  and samples the next token from the logits at the current position.
- `hand`: `hand_generate`, written here in plain JAX on the model's weights pulled out as
  arrays: a batched prefill of the prompts, then a `lax.scan` of decode steps over a
  `(rows, capacity, heads, head)` cache per layer that every row writes at the same position
  (`dynamic_update_slice`), einsum attention under a position mask, `jax.random.categorical`
  over the rows. Its greedy tokens are checked equal to `generate`'s (temperature 0) before
  timing.

Timing: a call generates every row's tokens, timed with garbage collection paused. Each of
`--rounds` rounds (default 21) times the cache and the hand loop, in alternating order; the first
`--slow-rounds` (default 3) also time the recomputation, right after the cache (it takes
minutes a call on the larger model, and its ratio is far from the target either way). The
table reports the median and best seconds per call, tokens per second (rows x new tokens /
median), the cache's speed-up over recomputing (recompute median / the median of the cache
calls of the same rounds; target >= 5x at 256), and generate / hand three ways: the ratio of
medians, the median of the per-round ratios and the ratio of the best rounds (target <= 1.1x;
on a loaded machine the best rounds are the ones least disturbed).

Run: `python benchmarks/generate.py` (full: about 30 minutes pinned to one core at load 9, most
of it the larger model's recomputation), `--quick` (smoke run: the tiny model, 64 tokens, 4 rounds),
`--only tiny_lm|larger`, `--rounds N`, `--slow-rounds N`. On a loaded machine, pin the process
to one core (`taskset -c 1 python benchmarks/generate.py`): XLA then runs every side
single-threaded and descheduled pool threads stop distorting the ratios.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import generate

PROMPT = 16
NEW_TOKENS = (64, 128, 256)
SPEEDUP_TARGET = 5.0
HAND_TARGET = 1.1


@dataclass
class Case:
    name: str
    sizes: dict[str, int]
    rows: int


CASES = {
    "tiny_lm": Case(
        "tiny_lm",
        {
            "vocab_size": 16,
            "emb_features": 64,
            "num_layers": 2,
            "num_heads": 4,
            "mlp_features": 128,
            "max_seq_len": 512,
        },
        8,
    ),
    "larger": Case(
        "larger",
        {
            "vocab_size": 256,
            "emb_features": 256,
            "num_layers": 4,
            "num_heads": 8,
            "mlp_features": 1024,
            "max_seq_len": 512,
        },
        4,
    ),
}


# The recomputing side: sample_continuations as it was before the cache.
def recompute_continuations(
    model: CausalTransformer, prompts: jax.Array, key: jax.Array, max_new_tokens: int
) -> jax.Array:
    rows, prompt_len = prompts.shape
    buffer = jnp.concatenate(
        [prompts.astype(jnp.int32), jnp.zeros((rows, max_new_tokens), jnp.int32)], axis=1
    )

    def step(index: Any, carry: Any) -> Any:
        buffer, key = carry
        key, sample_key = jax.random.split(key)
        logits = jax.vmap(model)(buffer)
        position = prompt_len + index
        current = jax.lax.dynamic_index_in_dim(logits, position - 1, axis=1, keepdims=False)
        token = jax.random.categorical(sample_key, current, axis=-1).astype(jnp.int32)
        buffer = jax.lax.dynamic_update_index_in_dim(buffer, token, position, axis=1)
        return buffer, key

    buffer, _ = jax.lax.fori_loop(0, max_new_tokens, step, (buffer, key))
    return buffer


# The hand-written side: a cached loop in plain JAX over the model's weights.
def weights_of(model: CausalTransformer) -> dict[str, Any]:
    stack = model.stack

    def linear(layer: eqx.nn.Linear) -> tuple[jax.Array, jax.Array]:
        return layer.weight, layer.bias

    def norm(layer: eqx.nn.LayerNorm) -> tuple[jax.Array, jax.Array]:
        return layer.weight, layer.bias

    return {
        "embedding": stack.token_embedding.weight,
        "positions": stack.position_embedding,
        "blocks": [
            {
                "norm_attention": norm(block.norm_attention),
                "qkv": linear(block.qkv),
                "out": linear(block.out),
                "norm_mlp": norm(block.norm_mlp),
                "up": linear(block.up),
                "down": linear(block.down),
            }
            for block in stack.blocks
        ],
        "final_norm": norm(stack.final_norm),
        "head": linear(stack.head),
    }


def _layer_norm(x: jax.Array, weight_bias: tuple[jax.Array, jax.Array]) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    weight, bias = weight_bias
    return (x - mean) * jax.lax.rsqrt(variance + 1e-5) * weight + bias


def _dense(x: jax.Array, weight_bias: tuple[jax.Array, jax.Array]) -> jax.Array:
    weight, bias = weight_bias
    return x @ weight.T + bias


def _block(
    block: dict[str, Any], x: jax.Array, keys: jax.Array, values: jax.Array, position: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`x` (rows, seq, emb) at positions `position ..`; writes the cache there and attends
    to every cached position up to each query's own."""
    rows, seq, emb = x.shape
    heads = keys.shape[2]
    qkv = _dense(_layer_norm(x, block["norm_attention"]), block["qkv"])
    q, k, v = jnp.moveaxis(qkv.reshape(rows, seq, 3, heads, emb // heads), 2, 0)
    keys = jax.lax.dynamic_update_slice(keys, k, (0, position, 0, 0))
    values = jax.lax.dynamic_update_slice(values, v, (0, position, 0, 0))
    scores = jnp.einsum("rqhd,rkhd->rhqk", q, keys) / math.sqrt(emb // heads)
    query = position + jnp.arange(seq)
    visible = jnp.arange(keys.shape[1])[None, :] <= query[:, None]
    scores = jnp.where(visible[None, None], scores, -jnp.inf)
    attended = jnp.einsum("rhqk,rkhd->rqhd", jax.nn.softmax(scores, axis=-1), values)
    x = x + _dense(attended.reshape(rows, seq, emb), block["out"])
    hidden = jax.nn.gelu(_dense(_layer_norm(x, block["norm_mlp"]), block["up"]))
    return x + _dense(hidden, block["down"]), keys, values


def hand_generate(
    weights: dict[str, Any],
    prompts: jax.Array,
    key: jax.Array,
    steps: int,
    heads: int,
    greedy: bool = False,
) -> jax.Array:
    rows, prompt_len = prompts.shape
    emb = weights["embedding"].shape[1]
    capacity = prompt_len + steps
    cache = [
        (
            jnp.zeros((rows, capacity, heads, emb // heads)),
            jnp.zeros((rows, capacity, heads, emb // heads)),
        )
        for _ in weights["blocks"]
    ]
    step_keys = jax.random.split(key, steps)

    def forward(tokens: jax.Array, position: Any, cache: list[Any]) -> tuple[jax.Array, Any]:
        seq = tokens.shape[1]
        x = weights["embedding"][tokens] + jax.lax.dynamic_slice_in_dim(
            weights["positions"], position, seq
        )
        written = []
        for block, (keys, values) in zip(weights["blocks"], cache, strict=True):
            x, keys, values = _block(block, x, keys, values, position)
            written.append((keys, values))
        logits = _dense(_layer_norm(x[:, -1], weights["final_norm"]), weights["head"])
        return logits, written

    def pick(logits: jax.Array, step_key: jax.Array) -> jax.Array:
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(step_key, logits, axis=-1).astype(jnp.int32)

    logits, cache = forward(prompts, 0, cache)
    first = pick(logits, step_keys[0])

    def decode(carry: Any, index: jax.Array) -> tuple[Any, jax.Array]:
        token, cache = carry
        logits, cache = forward(token[:, None], prompt_len + index - 1, cache)
        token = pick(logits, step_keys[index])
        return (token, cache), token

    _, rest = jax.lax.scan(decode, (first, cache), jnp.arange(1, steps))
    return jnp.concatenate([first[:, None], rest.T], axis=1)


def timed(run: Callable[[], Any]) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        jax.block_until_ready(run())
        return time.perf_counter() - start
    finally:
        gc.enable()


@dataclass
class Result:
    case: Case
    new_tokens: int
    times: dict[str, list[float]]
    warmup_s: dict[str, float]


def measure(case: Case, new_tokens: int, rounds: int, slow_rounds: int) -> Result:
    model = CausalTransformer(**case.sizes, key=jax.random.key(0))
    prompts = jax.random.randint(
        jax.random.key(1), (case.rows, PROMPT), 0, case.sizes["vocab_size"], jnp.int32
    )
    key = jax.random.key(2)
    heads = case.sizes["num_heads"]
    weights = weights_of(model)
    recompute = eqx.filter_jit(recompute_continuations)
    hand = jax.jit(hand_generate, static_argnums=(3, 4, 5))

    greedy = generate(model, prompts, max_new_tokens=new_tokens, key=key, temperature=0.0)
    by_hand = hand(weights, prompts, key, new_tokens, heads, True)
    if not np.array_equal(np.asarray(greedy.tokens), np.asarray(by_hand)):
        same = float(np.mean(np.asarray(greedy.tokens) == np.asarray(by_hand)))
        print(f"  note: greedy tokens of generate and the hand loop agree at {same:.1%} only")

    sides: dict[str, Callable[[], Any]] = {
        "cache": lambda: generate(model, prompts, max_new_tokens=new_tokens, key=key).tokens,
        "hand": lambda: hand(weights, prompts, key, new_tokens, heads, False),
        "recompute": lambda: recompute(model, prompts, key, new_tokens),
    }
    warmup_s = {name: timed(run) for name, run in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    # Every round times the cache and the hand loop, in alternating order; the first
    # `slow_rounds` rounds also time the recomputation, right after the cache.
    for index in range(rounds):
        order = ["cache", "hand"] if index % 2 else ["hand", "cache"]
        if index < slow_rounds:
            order.insert(order.index("cache") + 1, "recompute")
        for name in order:
            times[name].append(timed(sides[name]))
    return Result(case, new_tokens, times, warmup_s)


def report(results: list[Result]) -> None:
    columns = (
        "model",
        "new",
        "cache s",
        "best",
        "cache tok/s",
        "recompute s",
        "recompute tok/s",
        "speed-up",
        ">= 5x",
        "hand s",
        "generate/hand",
        "paired",
        "best",
        "<= 1.1x",
    )
    rows = []
    for result in results:
        cache = statistics.median(result.times["cache"])
        recompute = statistics.median(result.times["recompute"])
        hand = statistics.median(result.times["hand"])
        tokens = result.case.rows * result.new_tokens
        paired = statistics.median(
            c / h for c, h in zip(result.times["cache"], result.times["hand"], strict=True)
        )
        # The recomputation against the cache calls of the same rounds.
        speedup = recompute / statistics.median(
            result.times["cache"][: len(result.times["recompute"])]
        )
        rows.append(
            (
                f"{result.case.name} ({result.case.rows} rows)",
                str(result.new_tokens),
                f"{cache:.4f}",
                f"{min(result.times['cache']):.4f}",
                f"{tokens / cache:,.0f}",
                f"{recompute:.4f}",
                f"{tokens / recompute:,.0f}",
                f"{speedup:.1f}x",
                "yes" if speedup >= SPEEDUP_TARGET else ("NO" if result.new_tokens == 256 else "-"),
                f"{hand:.4f}",
                f"{cache / hand:.3f}x",
                f"{paired:.3f}x",
                f"{min(result.times['cache']) / min(result.times['hand']):.3f}x",
                "yes" if cache / hand <= HAND_TARGET else "NO",
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
        "s = median wall seconds per call (every row's tokens); best = the fastest round; "
        "tok/s = rows x new tokens / median; speed-up = recompute / cache (target >= 5x at "
        "256 new tokens, against the cache calls of the same rounds); generate/hand = ratio "
        "of the medians, paired = median of the per-round ratios, best = ratio of the fastest "
        "rounds (target <= 1.1x, read on the ratio of the medians)."
    )
    for result in results:
        warm = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in result.warmup_s.items())
        print(
            f"warm-up (compilation + one call, excluded) {result.case.name} "
            f"{result.new_tokens}: {warm}"
        )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny_lm, 64 tokens")
    parser.add_argument("--only", action="append", choices=tuple(CASES), help="repeatable")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (cache, hand)")
    parser.add_argument(
        "--slow-rounds", type=int, default=None, help="rounds that also time the recomputation"
    )
    args = parser.parse_args()
    chosen = ["tiny_lm"] if args.quick and not args.only else (args.only or list(CASES))
    sizes = (64,) if args.quick else NEW_TOKENS
    rounds = args.rounds or (4 if args.quick else 21)
    slow_rounds = min(rounds, args.slow_rounds or (2 if args.quick else 3))
    versions = ", ".join(
        f"{package} {_version(package)}" for package in ("dew-ml", "jax", "jaxlib", "equinox")
    )
    print("Generation: generate (key/value cache) vs recomputing the prefix vs a hand cached loop")
    print(f"python {platform.python_version()}, {versions}")
    print(
        f"cpu cores {os.cpu_count()} (this process may use {len(os.sched_getaffinity(0))}), "
        f"jax devices {jax.devices()}, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for name in chosen:
        case = CASES[name]
        print(f"  {name}: {case.sizes}, {case.rows} prompts of {PROMPT} tokens")
    print(
        f"new tokens {', '.join(map(str, sizes))}; {rounds} rounds of cache and hand, the "
        f"first {slow_rounds} also of recompute\n"
    )
    results = []
    for name in chosen:
        for new in sizes:
            start = time.perf_counter()
            results.append(measure(CASES[name], new, rounds, slow_rounds))
            elapsed = time.perf_counter() - start
            print(f"  measured {name}, {new} new tokens ({elapsed:.0f} s)", flush=True)
    print()
    report(results)
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.2f}")
    if load > len(os.sched_getaffinity(0)):
        print(
            "warning: the load exceeds the cores this process may use; ratios near 1 are "
            "within the noise (try `taskset -c 1 python benchmarks/generate.py`)."
        )


if __name__ == "__main__":
    main()
