"""The evaluation paths users call, end to end, against a hand-written floor and torchmetrics.

Target (issue 11): `dew.evaluate` / floor <= 1.2x, where the floor is one `jax.jit` function per
batch that scores and sums, with one host transfer at the end. This script asserts nothing and
always exits 0.

The pass: a `CausalTransformer(vocab_size=64, emb_features=32, num_layers=1, num_heads=2,
mlp_features=64, max_seq_len=16)` scored by `LMObjective(seq_len=16)` on 20 batches of 64 rows
of 17 token IDs (NumPy, seeded, handed to every side before timing), metrics `perplexity` and
`token_accuracy`.

Rows, each timed side by side at several sizes (sides alternate round by round, medians of
the rounds), so a cost that grows with the pass shows as a ratio that grows:

- `evaluate`, at 5, 20 and 80 batches a pass:
  `dew.evaluate(objective, params, batches, metrics=[...], key=key)`, floats out.
- `floor`: `jax.jit(step, donate_argnums=0)` per batch: the model's logits, `log_softmax` +
  `take_along_axis` NLL and argmax correctness summed into a donated (nll, correct, count)
  carry; one `jax.device_get` at the end, then `exp(nll / count)` and `correct / count`.
- `torchmetrics` (20 batches): `Perplexity()` and `MulticlassAccuracy(num_classes=64,
  average="micro")` updated with the same batches' logits (computed once by the model
  beforehand, converted to torch tensors before timing: scoring excluded on its side), then
  `compute()`.
- `Trainer validation`, at 1, 3 and 10 validation events: `Trainer.fit(steps=E,
  log_every=E, eval_every=1)` (E validation events over the same 20 batches, one SGD step
  each before them) against a hand loop of the same E jitted SGD steps, each followed by the
  floor's pass.
- `run_supervised validation`, at 5, 20 and 80 batches: `HeldOutValidation.evaluate`
  (row-weighted mean loss of an MLP regression over batches of 256 x 64) against a jitted
  per-batch loss summed on the device with one transfer at the end.

Each row gives the medians of wall time, their ratio, the median of the per-round paired
ratios, and the ratio of the medians of the process's CPU time (`time.process_time`, every
thread: what the path costs the machine, steadier than wall time under load). When the load
average is above 2 the process is pinned to one core before JAX starts.

`dew eval` and `RunConfig.train` evaluate through `dew.evaluate` and `Trainer.fit` (the rows
above); they add a checkpoint restore and the tracker, nothing per batch.

Run: `python benchmarks/evaluate_pass.py` (about two minutes on 2 idle cores), `--quick`
(smoke run: two sizes, 3 rounds), `--rounds N`. torch and torchmetrics come from the `bench`
extra; without them (or with a torchvision that does not load) the torchmetrics row says so.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import itertools
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

SEED = 20261201
VOCAB, SEQ, ROWS, BATCHES = 64, 16, 64, 20
PASS_SIZES, EVENT_SIZES = (5, 20, 80), (1, 3, 10)
TARGET = 1.2


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _timed(
    sides: dict[str, Callable[[], object]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each side once per round (order reversed every round): wall and CPU ms per call."""
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            gc.collect()
            gc.disable()
            start, start_cpu = time.perf_counter(), time.process_time()
            sides[name]()
            wall[name].append((time.perf_counter() - start) * 1e3)
            cpu[name].append((time.process_time() - start_cpu) * 1e3)
            gc.enable()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 rounds, two sizes")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 21)
    pass_sizes = PASS_SIZES[:2] if args.quick else PASS_SIZES
    event_sizes = EVENT_SIZES[:2] if args.quick else EVENT_SIZES
    load = os.getloadavg()[0]
    pinned = load > 2 and hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1
    if pinned:  # before JAX starts its threads
        os.sched_setaffinity(0, {1})

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    from dew import Trainer, evaluate, metrics
    from dew.data import Dataset
    from dew.nn.backbones.causal_transformer import CausalTransformer
    from dew.objectives.base import combine, token_log_probs
    from dew.objectives.lm import LMObjective
    from dew.supervised import Batch, HeldOutValidation

    print(
        f"dew-ml {_version('dew-ml')}  jax {jax.__version__}  equinox {_version('equinox')}  "
        f"torch {_version('torch')}  torchmetrics {_version('torchmetrics')}"
    )
    print(
        f"cores {os.cpu_count()}  load {load:.1f}  rounds {rounds}"
        + ("  (pinned to core 1)" if pinned else "")
    )

    rng = np.random.default_rng(SEED)
    most = max(pass_sizes)
    all_batches = [
        {"text": rng.integers(0, VOCAB, (ROWS, SEQ + 1), dtype=np.int32)} for _ in range(most)
    ]
    batches = all_batches[:BATCHES]
    model = CausalTransformer(
        vocab_size=VOCAB,
        emb_features=32,
        num_layers=1,
        num_heads=2,
        mlp_features=64,
        max_seq_len=SEQ,
        key=jax.random.key(0),
    )
    objective = LMObjective(model, seq_len=SEQ)
    params = objective.init_params()
    key = jax.random.key(1)
    pass_metrics = [metrics.perplexity(), metrics.token_accuracy()]

    def dew_pass(batches=batches) -> dict[str, float]:
        return evaluate(objective, params, batches, metrics=pass_metrics, key=key).scores

    @_jit_donating
    def floor_step(carry, params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = jax.vmap(combine(params, model))(inputs)
        nll = -token_log_probs(logits, targets)
        correct = jnp.argmax(logits, axis=-1) == targets
        total, right, count = carry
        return total + nll.sum(), right + correct.sum(dtype=jnp.float32), count + targets.size

    def floor_pass(params=params, batches=batches) -> dict[str, float]:
        carry = (jnp.zeros(()), jnp.zeros(()), jnp.zeros(()))
        for batch in batches:
            carry = floor_step(carry, params, batch["text"])
        total, right, count = jax.device_get(carry)
        return {"perplexity": float(np.exp(total / count)), "token_accuracy": right / count}

    dew_scores, floor_scores = dew_pass(), floor_pass()
    for name in floor_scores:
        assert abs(dew_scores[name] - floor_scores[name]) <= 1e-4 * abs(floor_scores[name]), (
            name,
            dew_scores,
            floor_scores,
        )
    sides: dict[str, Callable[[], object]] = {}
    rows: list[tuple[str, str, str]] = []  # (label, dew side, floor side)
    for size in pass_sizes:
        part = all_batches[:size]
        sides[f"evaluate {size}"] = functools.partial(dew_pass, batches=part)
        sides[f"floor {size}"] = functools.partial(floor_pass, batches=part)
        rows.append((f"dew.evaluate, {size} batches", f"evaluate {size}", f"floor {size}"))

    try:
        import torch
        from torchmetrics.classification import MulticlassAccuracy
        from torchmetrics.text import Perplexity
    except (ImportError, RuntimeError) as error:  # a torchvision built for another torch
        torch = None
        print(f"torchmetrics row skipped ({type(error).__name__}: {error})")
    if torch is not None:
        torch.set_num_threads(1 if pinned else os.cpu_count() or 1)

        @jax.jit
        def logits_of(tokens):
            return jax.vmap(combine(params, model))(tokens[:, :-1])

        torch_batches = [
            (
                torch.from_numpy(np.asarray(logits_of(batch["text"]))),
                torch.from_numpy(batch["text"][:, 1:].astype(np.int64)),
            )
            for batch in batches
        ]
        perplexity = Perplexity()
        accuracy = MulticlassAccuracy(num_classes=VOCAB, average="micro")

        def torch_pass() -> dict[str, float]:
            perplexity.reset()
            accuracy.reset()
            with torch.inference_mode():
                for logits, targets in torch_batches:
                    perplexity.update(logits, targets)
                    accuracy.update(logits.reshape(-1, VOCAB), targets.reshape(-1))
                return {
                    "perplexity": float(perplexity.compute()),
                    "token_accuracy": float(accuracy.compute()),
                }

        torch_scores = torch_pass()
        for name in floor_scores:
            assert abs(torch_scores[name] - floor_scores[name]) <= 1e-3 * floor_scores[name], (
                name,
                torch_scores,
                floor_scores,
            )
        sides["torchmetrics"] = torch_pass

    # -- Trainer validation events, end to end ------------------------------------------------
    optimizer = optax.sgd(1e-2)
    train_batch = batches[0]
    data = Dataset(train=lambda _: itertools.repeat(train_batch), val=lambda _: batches)
    trainer = Trainer(objective, optimizer, jax.random.key(2))

    def trainer_fit(steps: int) -> object:
        state = trainer.fit(
            data,
            steps,
            log_every=steps,
            eval_every=1,
            metrics=pass_metrics,
            progress=False,
        )
        return jax.block_until_ready(state.params)

    @_jit_donating
    def hand_train(carry, batch):
        params, opt_state = carry
        _, grads = jax.value_and_grad(objective.loss, has_aux=True)(
            params, batch, jax.random.key(0)
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state)

    def hand_fit(steps: int) -> object:
        carry = jax.tree.map(jnp.copy, (params, optimizer.init(params)))
        for _ in range(steps):
            carry = hand_train(carry, train_batch)
            floor_pass(carry[0])
        return jax.block_until_ready(carry[0])

    for events in event_sizes:
        sides[f"trainer {events}"] = functools.partial(trainer_fit, events)
        sides[f"hand {events}"] = functools.partial(hand_fit, events)
        rows.append((f"Trainer.fit, {events} evals", f"trainer {events}", f"hand {events}"))

    # -- run_supervised's HeldOutValidation ---------------------------------------------------
    mlp = eqx.nn.MLP(64, 1, width_size=64, depth=2, key=jax.random.key(3))
    xs = [rng.standard_normal((256, 64), dtype=np.float32) for _ in range(most)]
    all_supervised = [
        Batch(inputs=x, targets=x[:, :1] * 0.5, sample_weight=np.ones(256, np.float32)) for x in xs
    ]

    def mse(model, inputs, targets, sample_weight, key, training):
        errors = (jax.vmap(model)(inputs) - targets)[:, 0] ** 2
        return jnp.sum(errors * sample_weight) / jnp.sum(sample_weight)

    mlp_params = eqx.filter(mlp, eqx.is_inexact_array)
    static = eqx.filter(mlp, eqx.is_inexact_array, inverse=True)
    held_out_key = jax.random.key(4)

    @_jit_donating
    def loss_sum(carry, params, batch):
        model = eqx.combine(params, static)
        value = mse(model, batch.inputs, batch.targets, batch.sample_weight, None, False)
        rows = batch.inputs.shape[0]
        return carry[0] + value * rows, carry[1] + rows

    def held_out_floor(supervised) -> object:
        carry = (jnp.zeros(()), jnp.zeros(()))
        for batch in supervised:
            carry = loss_sum(carry, mlp_params, batch)
        total, rows = jax.device_get(carry)
        return {"loss": float(total / rows)}

    for size in pass_sizes:
        supervised = all_supervised[:size]
        validation = HeldOutValidation(mlp, lambda split, epoch, part=supervised: part, mse)
        held_out = functools.partial(validation.evaluate, mlp_params, 0, held_out_key)
        dew_loss = held_out()["loss"]
        floor_loss = held_out_floor(supervised)["loss"]
        assert abs(dew_loss - floor_loss) <= 1e-5 * abs(floor_loss), (dew_loss, floor_loss)
        sides[f"held_out {size}"] = held_out
        sides[f"held_out_floor {size}"] = functools.partial(held_out_floor, supervised)
        rows.append((f"HeldOutValidation, {size} b.", f"held_out {size}", f"held_out_floor {size}"))

    for side in sides.values():  # warm every side once more, after all compilation
        side()
    wall, cpu = _timed(sides, rounds)
    median = {name: statistics.median(values) for name, values in wall.items()}
    median_cpu = {name: statistics.median(values) for name, values in cpu.items()}

    print()
    print(
        f"{'path':<30}{'dew ms':>9}{'floor ms':>10}{'ratio':>8}{'paired':>8}{'cpu':>8}"
        f"{'spread':>14}{'target':>8}  met"
    )
    for label, a, b in rows:
        ratio = median[a] / median[b]
        paired = statistics.median(x / y for x, y in zip(wall[a], wall[b], strict=True))
        ratios = sorted(x / y for x, y in zip(wall[a], wall[b], strict=True))
        low, high = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        cpu_ratio = median_cpu[a] / median_cpu[b]
        print(
            f"{label:<30}{median[a]:>9.2f}{median[b]:>10.2f}{ratio:>7.2f}x{paired:>7.2f}x"
            f"{cpu_ratio:>7.2f}x{f'{low:.2f}-{high:.2f}x':>14}{TARGET:>7.1f}x  "
            f"{'met' if ratio <= TARGET else 'not met'}"
        )
    if "torchmetrics" in median:
        reference = f"evaluate {BATCHES}"
        print(
            f"{'torchmetrics (no scoring)':<30}{median['torchmetrics']:>9.2f}{'':>10}"
            f"{median['torchmetrics'] / median[reference]:>7.2f}x  (torchmetrics / "
            f"dew.evaluate, {BATCHES} batches)"
        )
    print("spread: the interquartile range of the per-round paired ratios")


def _jit_donating(function):
    """`jax.jit(function, donate_argnums=0)`: the carry's buffers are reused in place."""
    import jax

    return jax.jit(function, donate_argnums=0)


if __name__ == "__main__":
    main()
