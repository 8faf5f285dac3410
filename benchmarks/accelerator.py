"""A ~100M-parameter causal transformer on an accelerator: `Trainer.fit` and `dew.evaluate`
against a hand-written `jax.jit` + optax loop on the same model, with tokens per second and MFU.

Issue 29, item 7. This script asserts nothing and always exits 0.

The model (`--size gpu`, the default on a GPU or TPU): `CausalTransformer(vocab_size=32768,
emb_features=768, num_layers=12, num_heads=12, mlp_features=3072, max_seq_len=1024)`, 110.3M
parameters (GPT-2 small's blocks, a 32k vocabulary), the parameters and the optimizer state in
float32 and the blocks computing in bfloat16 with float32 logits: the trainer's sides run the
float32 model under `Trainer(precision="mixed_bfloat16")` (issue 29 item 1), and the hand loop
runs the same params through the backbone's own `dtype="bfloat16"` (the casts a user writes
into a model), the same arithmetic (decision 0078). Attention goes through
`jax.nn.dot_product_attention` (`attention_impl="cudnn"`, its fused kernel, on a CUDA GPU;
`"xla"` elsewhere). Batches of 16 rows of 1,025 token IDs
(16,384 target tokens a step), NumPy-seeded, put on the device before timing. `--size cpu` (the
default without an accelerator) is the same script at a CPU-sized model (vocab 256, emb 128, 2
layers, seq 128, batch 8).

Sides, per step, on the same batch and the same `LMObjective(model, seq_len)`:

- `trainer`: `Trainer(objective, optax.adamw(3e-4), key).fit(data, steps=..., log_every=10,
  progress=False, state=state)`, each round continuing from the last round's state.
- `hand`: `jax.jit(step, donate_argnums=0)`, where `step` is `jax.value_and_grad` of the
  objective's loss, `optimizer.update` and `optax.apply_updates`; every 10th step its outputs
  are fetched with `jax.device_get`, as the trainer fetches its window at a log step.
- Both with the batch as a loader yields it (NumPy, on the host: the trainer checks its token
  IDs there and each step copies it to the device), and again with the batch already on the
  device (`, device batch`: the trainer's compiled step then checks the IDs itself, a host
  callback each step, which waits for the device), and `trainer, fused`: `fit(...,
  steps_per_call=10)`, ten steps a compiled call (a `lax.scan`), host batches, against `hand`;
  and `trainer, fsdp`: `Trainer(..., mesh=jax.make_mesh((devices,), ("data",)),
  strategy="fsdp")`, each param and its optimizer state sharded along its largest axis the
  devices divide (issue 29 item 3), host batches, against `hand` (on one device the layout is
  a plain fit's, so the row shows what the strategy's own step costs).
- `evaluate`: `dew.evaluate(objective, params, batches, metrics=[perplexity()], key=key)` over
  8 batches, against a floor: a jitted per-batch negative log-likelihood sum carried on the
  device, one fetch at the end.

FLOPs: XLA's own count of the hand step (`compiled.cost_analysis()["flops"]`), printed beside
the estimate `6 * N * tokens + 12 * layers * seq * emb * tokens` (N the parameters without the
embeddings' lookup: the matrix products' multiply-adds, forward and backward, plus attention's
two products). MFU: the estimate's FLOPs per step (on a GPU XLA's count leaves out the products
it hands to cuBLAS and cuDNN as custom calls) / step time / the device's peak dense bfloat16
rate from `PEAKS` (vendor figures; none on CPU, where MFU is not printed).

Each round's `fit` call runs `--steps` steps (default 100): a fit's own start and end (about
40 ms on the H200: its records, the final checks of the loss and the params) are spread over
them, as over a real run's thousands.

Run: `python benchmarks/accelerator.py` (about 2 minutes on an H200 including compilation),
`--size cpu|gpu`, `--rounds N`, `--steps N` (steps a round).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

PEAKS = {  # dense bfloat16 TFLOP/s per chip, vendor figures (no sparsity)
    "H100": 989.4,
    "H200": 989.4,
    "A100": 312.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,
    "TPU v5e": 197.0,
    "TPU v5p": 459.0,
}
LOG_EVERY = 10


@dataclass(frozen=True)
class Size:
    vocab: int
    emb: int
    layers: int
    heads: int
    mlp: int
    seq: int
    batch: int


SIZES = {
    "gpu": Size(32768, 768, 12, 12, 3072, 1024, 16),
    "cpu": Size(256, 128, 2, 4, 512, 128, 8),
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), help="default: gpu on an accelerator")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--steps", type=int, default=100, help="steps a round, one fit call (a multiple of 10)"
    )
    return parser.parse_args()


def peak(device: Any) -> float | None:
    """The device's peak dense bfloat16 TFLOP/s from `PEAKS`, or None (CPU, unknown)."""
    kind = getattr(device, "device_kind", "")
    for name, tflops in PEAKS.items():
        if name.lower() in kind.lower():
            return tflops
    return None


def timed(run: Any, steps: int) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run(steps)
        return (time.perf_counter() - start) / steps
    finally:
        gc.enable()


def main() -> None:
    args = parse()
    import jax
    import jax.numpy as jnp
    import optax

    from dew import Trainer, evaluate, metrics
    from dew.data import Dataset
    from dew.nn.backbones import CausalTransformer
    from dew.objectives.base import combine, token_log_probs
    from dew.objectives.lm import LMObjective

    device = jax.devices()[0]
    accelerator = device.platform != "cpu"
    size = SIZES[args.size or ("gpu" if accelerator else "cpu")]
    impl = "cudnn" if device.platform == "gpu" else "xla"
    print(
        f"jax {jax.__version__}, device {device.device_kind} ({device.platform}), cores "
        f"{os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    )

    def transformer(dtype: str) -> Any:
        return CausalTransformer(
            vocab_size=size.vocab, emb_features=size.emb, num_layers=size.layers,
            num_heads=size.heads, mlp_features=size.mlp, max_seq_len=size.seq, dtype=dtype,
            attention_impl=impl, key=jax.random.key(0),
        )  # fmt: skip

    model = transformer("float32")  # the trainer's, under precision="mixed_bfloat16"
    objective = LMObjective(model, seq_len=size.seq)
    hand_objective = LMObjective(transformer("bfloat16"), seq_len=size.seq)  # the same params
    params = objective.init_params()
    hand_params = hand_objective.init_params()  # the same values; the static dtype differs
    count = sum(int(leaf.size) for leaf in jax.tree.leaves(params))
    rows = np.random.default_rng(0).integers(0, size.vocab, (size.batch, size.seq + 1))
    host_batch = {"text": rows.astype(np.int32)}  # as a loader yields it
    batch = {"text": jax.device_put(jnp.asarray(rows, jnp.int32))}  # already on the device
    tokens = size.batch * size.seq
    print(f"model: {count / 1e6:.1f}M parameters, emb {size.emb}, {size.layers} layers, seq "
          f"{size.seq}, batch {size.batch} ({tokens} tokens a step), bfloat16 compute, "
          f"attention {impl}")  # fmt: skip

    optimizer = optax.adamw(3e-4)
    key = jax.random.key(0)

    def step(carry: Any, batch: Any) -> Any:
        params, opt_state = carry
        loss_fn = jax.value_and_grad(hand_objective.loss, has_aux=True)
        (loss, aux), grads = loss_fn(params, batch, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": loss, **aux}

    hand_step = jax.jit(step, donate_argnums=0)
    fresh = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), hand_params)
    carry = [(fresh, optimizer.init(fresh))]
    compiled = hand_step.lower(carry[0], batch).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    flops = float(analysis.get("flops", float("nan")))
    matrix = count - size.vocab * size.emb - size.seq * size.emb  # no lookup tables
    estimate = 6 * matrix * tokens + 12 * size.layers * size.seq * size.emb * tokens
    print(
        f"FLOPs a step: XLA {flops / 1e12:.3f} T, estimate 6N + attention "
        f"{estimate / 1e12:.3f} T (XLA / estimate {flops / estimate:.2f})"
    )

    def hand_on(each: Any) -> Any:
        def hand(steps: int) -> None:
            state = carry[0]
            for index in range(1, steps + 1):
                state, outputs = hand_step(state, each)
                if index % LOG_EVERY == 0:
                    last.update((name, float(v)) for name, v in jax.device_get(outputs).items())
            jax.block_until_ready(state)
            carry[0] = state

        return hand

    policy = "mixed_bfloat16"
    mesh = jax.make_mesh((jax.device_count(),), ("data",))

    def fit_on(each: Any, steps_per_call: int = 1, **options: Any) -> Any:
        data = Dataset(train=lambda partition: itertools.repeat(each))
        trainer = Trainer(objective, optimizer, key, precision=policy, **options)
        fitted: list[Any] = [None, 0]

        def fit(steps: int) -> None:
            fitted[1] += steps
            fitted[0] = trainer.fit(
                data,
                steps=fitted[1],
                log_every=LOG_EVERY,
                progress=False,
                state=fitted[0],
                steps_per_call=steps_per_call,
            )
            jax.block_until_ready(fitted[0].params)

        return fit

    eval_batches = [batch] * 8
    perplexity = [metrics.perplexity()]

    last: dict[str, Any] = {}

    def dew_pass(_: int) -> None:
        scores = evaluate(
            objective, params, eval_batches, metrics=perplexity, key=key, precision=policy
        ).scores
        last.update(scores)

    @jax.jit
    def floor_nll(total: Any, params: Any, text: Any) -> Any:
        logits = jax.vmap(combine(params, hand_objective.model))(text[:, :-1])
        return total + (-token_log_probs(logits, text[:, 1:])).sum()

    def floor_pass(_: int) -> None:
        total = jnp.zeros(())
        for each in eval_batches:
            total = floor_nll(total, hand_params, each["text"])
        last["floor"] = float(jax.device_get(total))

    sides = {
        "trainer": fit_on(host_batch),
        "hand": hand_on(host_batch),
        "trainer, device batch": fit_on(batch),
        "hand, device batch": hand_on(batch),
        "trainer, fused": fit_on(host_batch, LOG_EVERY),
        "trainer, fsdp": fit_on(host_batch, mesh=mesh, strategy="fsdp"),
        "evaluate": dew_pass,
        "floor": floor_pass,
    }
    stepping = [name for name in sides if name.startswith(("trainer", "hand"))]
    for name, run in sides.items():  # compile and warm up
        start = time.perf_counter()
        run(2 * LOG_EVERY if name in stepping else 1)
        print(f"warm-up {name}: {time.perf_counter() - start:.1f} s")
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for _ in range(args.rounds):
        for name in order:
            times[name].append(timed(sides[name], args.steps if name in stepping else 1))
        order = order[1:] + order[:1]

    top = peak(device)
    # XLA's count leaves out the matrix products it hands to cuBLAS and cuDNN as custom calls
    # (on a GPU it is a small part of the step's work), so MFU reads the estimate there.
    counted = estimate if accelerator else flops
    print(
        f"\nmedians of {args.rounds} rounds; peak bf16 {top or 'unknown'} TFLOP/s; MFU from "
        f"{'the estimate' if accelerator else 'XLA'}'s {counted / 1e12:.3f} TFLOP a step"
    )
    for name in stepping:
        median = statistics.median(times[name])
        line = (
            f"{name:24s} {median * 1e3:9.2f} ms/step  "
            f"[{min(times[name]) * 1e3:.2f}-{max(times[name]) * 1e3:.2f}]  "
            f"{tokens / median:12,.0f} tokens/s  {counted / median / 1e12:7.1f} TFLOP/s"
        )
        if top is not None:
            line += f"  MFU {counted / median / (top * 1e12):.1%}"
        print(line)
    for suffix in ("", ", device batch", ", fused", ", fsdp"):
        hand_suffix = suffix if suffix == ", device batch" else ""
        dew, floor = times["trainer" + suffix], times["hand" + hand_suffix]
        ratio = statistics.median(dew) / statistics.median(floor)
        paired = statistics.median(a / b for a, b in zip(dew, floor, strict=True))
        print(f"Trainer.fit / hand{suffix}: {ratio:.3f}x (paired {paired:.3f}x; target <= 1.02x)")
    eval_tokens = tokens * len(eval_batches)
    for name, label in (("evaluate", "dew.evaluate (8 batches)"), ("floor", "jitted NLL floor")):
        median = statistics.median(times[name])
        print(f"{label:24s} {median * 1e3:9.2f} ms/pass {eval_tokens / median:12,.0f} tokens/s")
    ratio = statistics.median(times["evaluate"]) / statistics.median(times["floor"])
    print(f"dew.evaluate / floor: {ratio:.3f}x")
    print(f"strategies: data and fsdp over {jax.device_count()} device(s)")


if __name__ == "__main__":
    main()
