"""The evaluation paths users call, end to end, against a hand-written floor and torchmetrics.

Target (issue 11): `dew.evaluate` / floor <= 1.2x, where the floor is one `jax.jit` function per
batch that scores and sums, with one host transfer at the end. This script asserts nothing and
always exits 0.

The pass: a `CausalTransformer(vocab_size=64, emb_features=32, num_layers=1, num_heads=2,
mlp_features=64, max_seq_len=16)` scored by `LMObjective(seq_len=16)` on 20 batches of 64 rows
of 17 token IDs (NumPy, seeded, handed to every side before timing), metrics `perplexity` and
`token_accuracy`.

Rows, each timed side by side (sides alternate round by round, medians of the rounds):

- `evaluate`: `dew.evaluate(objective, params, batches, metrics=[...], key=key)`, floats out.
- `floor`: `jax.jit(step, donate_argnums=0)` per batch: the model's logits, `log_softmax` +
  `take_along_axis` NLL and argmax correctness summed into a donated (nll, correct, count)
  carry; one `jax.device_get` at the end, then `exp(nll / count)` and `correct / count`.
- `torchmetrics`: `Perplexity()` and `MulticlassAccuracy(num_classes=64, average="micro")`
  updated with the same batches' logits (computed once by the model beforehand, converted to
  torch tensors before timing: scoring excluded on its side), then `compute()`.
- `Trainer validation`: `Trainer.fit(steps=10, log_every=10, eval_every=1)` (ten validation
  events over the same 20 batches, one SGD step each between them) against a hand loop of the
  same ten jitted SGD steps, each followed by the floor's pass.
- `run_supervised validation`: `HeldOutValidation.evaluate` (row-weighted mean loss of an MLP
  regression over 20 batches of 256 x 64) against a jitted per-batch loss summed on the device
  with one transfer at the end.

`dew eval` and `RunConfig.train` evaluate through `dew.evaluate` and `Trainer.fit` (the rows
above); they add a checkpoint restore and the tracker, nothing per batch.

Run: `python benchmarks/evaluate_pass.py` (about a minute on 2 idle cores), `--quick` (smoke
run), `--rounds N`. torch and torchmetrics come from the `bench` extra; without them the
torchmetrics row says so.
"""

from __future__ import annotations

import argparse
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
TARGET = 1.2


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _timed(sides: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Each side once per round (order reversed every round), ms per call."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            gc.collect()
            gc.disable()
            start = time.perf_counter()
            sides[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
            gc.enable()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 21)

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
    print(f"cores {os.cpu_count()}  load {os.getloadavg()[0]:.1f}  rounds {rounds}")

    rng = np.random.default_rng(SEED)
    batches = [
        {"text": rng.integers(0, VOCAB, (ROWS, SEQ + 1), dtype=np.int32)} for _ in range(BATCHES)
    ]
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

    def dew_pass() -> dict[str, float]:
        return evaluate(objective, params, batches, metrics=pass_metrics, key=key).scores

    @_jit_donating
    def floor_step(carry, params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = jax.vmap(combine(params, model))(inputs)
        nll = -token_log_probs(logits, targets)
        correct = jnp.argmax(logits, axis=-1) == targets
        total, right, count = carry
        return total + nll.sum(), right + correct.sum(dtype=jnp.float32), count + targets.size

    def floor_pass(params=params) -> dict[str, float]:
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
    sides: dict[str, Callable[[], object]] = {"evaluate": dew_pass, "floor": floor_pass}

    try:
        import torch
        from torchmetrics.classification import MulticlassAccuracy
        from torchmetrics.text import Perplexity
    except ImportError:
        torch = None
        print("torchmetrics row skipped: torch and torchmetrics are in the bench extra")
    if torch is not None:
        torch.set_num_threads(os.cpu_count() or 1)

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

    # -- a Trainer validation event, end to end ---------------------------------------------
    steps = 10
    optimizer = optax.sgd(1e-2)
    train_batch = batches[0]
    data = Dataset(train=lambda _: itertools.repeat(train_batch), val=lambda _: batches)
    trainer = Trainer(objective, optimizer, jax.random.key(2))

    def trainer_fit() -> object:
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

    def hand_fit() -> object:
        carry = jax.tree.map(jnp.copy, (params, optimizer.init(params)))
        for _ in range(steps):
            carry = hand_train(carry, train_batch)
            floor_pass(carry[0])
        return jax.block_until_ready(carry[0])

    trainer_fit(), hand_fit()

    # -- run_supervised's HeldOutValidation ---------------------------------------------------
    mlp = eqx.nn.MLP(64, 1, width_size=64, depth=2, key=jax.random.key(3))
    xs = [rng.standard_normal((256, 64), dtype=np.float32) for _ in range(BATCHES)]
    supervised = [
        Batch(inputs=x, targets=x[:, :1] * 0.5, sample_weight=np.ones(256, np.float32)) for x in xs
    ]

    def mse(model, inputs, targets, sample_weight, key, training):
        errors = (jax.vmap(model)(inputs) - targets)[:, 0] ** 2
        return jnp.sum(errors * sample_weight) / jnp.sum(sample_weight)

    validation = HeldOutValidation(mlp, lambda split, epoch: supervised, mse)
    mlp_params = eqx.filter(mlp, eqx.is_inexact_array)

    def held_out() -> object:
        return validation.evaluate(mlp_params, 0, jax.random.key(4))

    static = eqx.filter(mlp, eqx.is_inexact_array, inverse=True)

    @_jit_donating
    def loss_sum(carry, params, batch):
        model = eqx.combine(params, static)
        value = mse(model, batch.inputs, batch.targets, batch.sample_weight, None, False)
        rows = batch.inputs.shape[0]
        return carry[0] + value * rows, carry[1] + rows

    def held_out_floor() -> object:
        carry = (jnp.zeros(()), jnp.zeros(()))
        for batch in supervised:
            carry = loss_sum(carry, mlp_params, batch)
        total, rows = jax.device_get(carry)
        return {"loss": float(total / rows)}

    dew_loss, floor_loss = held_out()["loss"], held_out_floor()["loss"]
    assert abs(dew_loss - floor_loss) <= 1e-5 * abs(floor_loss), (dew_loss, floor_loss)

    sides |= {
        "trainer": trainer_fit,
        "hand": hand_fit,
        "held_out": held_out,
        "held_out_floor": held_out_floor,
    }
    for side in sides.values():  # warm every side once more, after all compilation
        side()
    times = _timed(sides, rounds)
    median = {name: statistics.median(values) for name, values in times.items()}
    paired = {
        (a, b): statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))
        for a, b in (("evaluate", "floor"), ("trainer", "hand"), ("held_out", "held_out_floor"))
    }

    print()
    print(f"{'path':<28}{'dew ms':>10}{'floor ms':>10}{'ratio':>8}{'paired':>8}{'target':>8}")
    for label, a, b in (
        ("dew.evaluate", "evaluate", "floor"),
        ("Trainer.fit, 10 evals", "trainer", "hand"),
        ("HeldOutValidation", "held_out", "held_out_floor"),
    ):
        ratio = median[a] / median[b]
        print(
            f"{label:<28}{median[a]:>10.2f}{median[b]:>10.2f}{ratio:>7.2f}x"
            f"{paired[(a, b)]:>7.2f}x{TARGET:>7.1f}x"
        )
    if "torchmetrics" in median:
        print(
            f"{'torchmetrics (no scoring)':<28}{median['torchmetrics']:>10.2f}{'':>10}"
            f"{median['torchmetrics'] / median['evaluate']:>7.2f}x  (torchmetrics / dew.evaluate)"
        )


def _jit_donating(function):
    """`jax.jit(function, donate_argnums=0)`: the carry's buffers are reused in place."""
    import jax

    return jax.jit(function, donate_argnums=0)


if __name__ == "__main__":
    main()
