"""What many test files build the same way: the tiny causal transformer's sizes, its language
model objective, a run configuration of it written to TOML, and an event sink that records.
Each file keeps its own steps and cadences and passes them in."""

import jax

from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.registry import datasets

TINY = {
    "vocab_size": 16,
    "emb_features": 16,
    "num_layers": 1,
    "num_heads": 2,
    "mlp_features": 32,
    "max_seq_len": 16,
}
"""The tiny causal transformer's sizes (`ModelConfig("causal_transformer", TINY)`)."""


def tiny_lm_objective(vocab_size: int = 4, *, seed: int = 0) -> LMObjective:
    """A language model on `TINY`'s transformer with `vocab_size` tokens, initialized from
    `jax.random.key(seed)`, trained on windows of 8 tokens."""
    sizes = TINY | {"vocab_size": vocab_size}
    return LMObjective(CausalTransformer(**sizes, key=jax.random.key(seed)), seq_len=8)


def write_config(tmp_path, **trainer):
    """`TINY`'s run on 2048 tokens of `token_windows` (windows of 8, Adam at 1e-2, batches
    of 8), named `tiny` under `tmp_path / "runs"`, written to `tmp_path / "run.toml"`:
    the path and the `RunConfig`. `trainer` sets the rest of `TrainerConfig` (steps,
    cadences)."""
    config = RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            **{"name": "tiny", "checkpoint_dir": str(tmp_path / "runs"), "batch_size": 8, **trainer}
        ),
    )
    path = tmp_path / "run.toml"
    config.dump_toml(path)
    return path, config


class Recorder:
    """An event sink that keeps every event it is sent, in order."""

    def __init__(self):
        self.events = []

    def on_event(self, event):
        self.events.append(event)
