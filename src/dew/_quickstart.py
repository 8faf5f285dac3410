"""The built-in quick-start run behind `dew train` with no arguments.

A small causal transformer learns synthetic token sequences drawn from a fixed
random Markov chain; it is evaluated on held-out sequences of the same chain
(perplexity and token accuracy, whose floor the chain's entropy sets) and tracked
to a local run folder with `LocalTracker`.
"""

import pathlib
from collections.abc import Callable, Iterator

import jax
import numpy as np
import optax

from dew import metrics
from dew.data import Dataset, Partition
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective, Samples
from dew.steps import TrainState
from dew.telemetry.records import RunRecord
from dew.tracking import LocalTracker, read_journal
from dew.training import Trainer

VOCAB = 16
SEQ_LEN = 32
BATCH = 32


def markov_chain(seed: int = 0) -> np.ndarray:
    """A fixed transition matrix: each token has four likely successors."""
    rng = np.random.default_rng(seed)
    transitions = np.full((VOCAB, VOCAB), 0.02)
    for token in range(VOCAB):
        transitions[token, rng.choice(VOCAB, 4, replace=False)] += rng.dirichlet(np.ones(4))
    return transitions / transitions.sum(axis=1, keepdims=True)


def sample_rows(transitions: np.ndarray, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Token rows of `SEQ_LEN + 1` IDs walked through the chain."""
    out = np.empty((rows, SEQ_LEN + 1), np.int32)
    out[:, 0] = rng.integers(0, VOCAB, rows)
    cumulative = np.cumsum(transitions, axis=1)
    for position in range(1, SEQ_LEN + 1):
        draws = rng.random(rows)[:, None]
        out[:, position] = (draws > cumulative[out[:, position - 1]]).sum(axis=1)
    return np.minimum(out, VOCAB - 1)


def entropy_rate(transitions: np.ndarray) -> float:
    """The chain's entropy rate in nats: the lowest mean loss any model can reach."""
    values, vectors = np.linalg.eig(transitions.T)
    stationary = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    stationary /= stationary.sum()
    return float(-(stationary[:, None] * transitions * np.log(transitions)).sum())


def run_quickstart(
    out: str | pathlib.Path = "runs/quickstart",
    *,
    steps: int = 300,
    seed: int = 0,
    echo: Callable[[str], None] = print,
) -> TrainState:
    """Train, evaluate and track the quick-start LM; return the final state."""
    out = pathlib.Path(out)
    transitions = markov_chain(seed)
    validation = sample_rows(transitions, 4 * BATCH, np.random.default_rng(seed + 1))

    def train(partition: Partition) -> Iterator[dict[str, np.ndarray]]:
        rng = np.random.default_rng([seed, partition.index])
        while True:
            yield {"text": sample_rows(transitions, BATCH, rng)}

    def val(partition: Partition) -> Iterator[dict[str, np.ndarray]]:
        return iter({"text": validation[i : i + BATCH]} for i in range(0, len(validation), BATCH))

    data = Dataset(train=train, val=val, batch=BATCH)
    log_every, eval_every = min(50, steps), min(100, steps)
    sizes = {
        "vocab_size": VOCAB,
        "emb_features": 64,
        "num_layers": 2,
        "num_heads": 4,
        "mlp_features": 128,
        "max_seq_len": SEQ_LEN + 8,
    }
    model = CausalTransformer(
        **sizes, dtype="float32", attention_impl="xla", key=jax.random.key(seed)
    )
    objective = LMObjective(model, seq_len=SEQ_LEN, samples=Samples(max_new_tokens=8))
    optimizer = optax.adamw(3e-3)
    trainer = Trainer(objective, optimizer, key=jax.random.key(seed), name="quickstart")
    with LocalTracker(out / "tracking") as tracker:
        tracker.log_params(
            {
                "model": {"name": "causal_transformer", **sizes},
                "optimizer": {"name": "adamw", "learning_rate": 3e-3},
                "trainer": {"steps": steps, "seed": seed},
            }
        )
        tracker.log_artifact(
            "run_record",
            RunRecord(
                model={"name": "causal_transformer", **sizes},
                data={
                    "name": "markov_chain",
                    "vocab_size": VOCAB,
                    "seq_len": SEQ_LEN,
                    "batch_size": BATCH,
                    "seed": seed,
                },
                optimizer={"name": "adamw", "learning_rate": 3e-3},
                trainer={"steps": steps, "log_every": log_every, "eval_every": eval_every},
            ),
        )
        state = trainer.fit(
            data,
            steps=steps,
            log_every=log_every,
            eval_every=eval_every,
            metrics=(metrics.perplexity(), metrics.token_accuracy()),
            tracker=tracker,
            preview=True,
        )
    journal = read_journal(out / "tracking")
    final = journal.scalars["lm/validation/perplexity"][-1][1]
    floor = float(np.exp(entropy_rate(transitions)))
    echo(
        f"validation perplexity {final:.3f} (the chain's entropy rate gives {floor:.3f}, "
        f"a uniform guess {VOCAB})"
    )
    echo(f"tracking written to {out / 'tracking'}")
    return state
