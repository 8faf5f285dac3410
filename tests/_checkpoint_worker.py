"""A training run for the SIGKILL resume test: `python _checkpoint_worker.py DIR OUT SLEEP
[TOKENS]`.

Trains a small causal LM for STEPS steps on batches that differ per step, saving a
checkpoint every CHECKPOINT_EVERY steps into DIR (resuming from it when present), and
writes the final parameters to OUT as an .npz. SLEEP seconds pass before each batch. The
batches come from an iterator of random batches (replayed on resume), or, given TOKENS (a
.npy file of token IDs below 8), from `dew.data.tokens` over it (read by step on resume).
"""

import sys
import time

import jax
import numpy as np
import optax

from dew import Trainer
from dew.data import Dataset, tokens
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective

STEPS = 24
CHECKPOINT_EVERY = 4


def batches(sleep: float):
    rng = np.random.default_rng(7)
    while True:
        time.sleep(sleep)
        yield {"text": rng.integers(0, 8, (8, 9)).astype(np.int32)}


class Slowly:
    """A step-indexed training source that sleeps before each batch."""

    def __init__(self, train, sleep: float):
        self.train, self.sleep = train, sleep

    def batch_at(self, step, partition):
        time.sleep(self.sleep)
        return self.train.batch_at(step, partition)

    def __call__(self, partition):
        return self.train(partition)


def objective() -> LMObjective:
    model = CausalTransformer(8, 16, 1, 2, 32, 16, key=jax.random.key(3))
    return LMObjective(model, seq_len=8)


def main(directory: str, out: str, sleep: float, token_file: str | None) -> None:
    if token_file is None:
        data = Dataset(train=lambda partition: batches(sleep))
    else:
        windows = tokens(token_file, seq_len=8, batch=8, vocab_size=8, seed=7)
        data = Dataset(train=Slowly(windows.train, sleep), batch=8)
    trainer = Trainer(
        objective(), optax.adam(3e-3), key=jax.random.key(11), checkpoint_dir=directory
    )
    state = trainer.fit(
        data, steps=STEPS, log_every=2, checkpoint_every=CHECKPOINT_EVERY, progress=False
    )
    leaves = jax.tree.leaves(state.params)
    np.savez(out, *[np.asarray(leaf) for leaf in leaves], step=np.asarray(state.step))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), (sys.argv[4:] or [None])[0])
