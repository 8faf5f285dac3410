"""Built-in run configurations: `tiny_lm`, what `dew train` trains with no file."""

from dew.config._config import RunConfig
from dew.config._data import DataConfig
from dew.config._sections import ModelConfig, ObjectiveConfig, OptimConfig, TrainerConfig

__all__ = ["tiny_lm"]


def tiny_lm() -> RunConfig:
    """A small causal LM on `token_windows`' synthetic Markov chain (16 token IDs, 32
    predicted positions), trained for 300 steps with a cosine-decayed AdamW, evaluated
    every 100 and checkpointed every 100, as the run `quickstart` under `runs/`. About
    15 seconds on 2 CPU cores; it ends near the chain's entropy rate (perplexity about 6.3).

    ```python
    >>> config = tiny_lm()
    >>> config.trainer.name, config.model.name, config.data.kwargs["seq_len"]
    ('quickstart', 'causal_transformer', 32)

    ```
    """
    return RunConfig(
        model=ModelConfig(
            "causal_transformer",
            {
                "vocab_size": 16,
                "emb_features": 64,
                "num_layers": 2,
                "num_heads": 4,
                "mlp_features": 128,
                "max_seq_len": 40,
            },
        ),
        # 8191 windows, 2% held out: 300 steps of 32 rows see each training window about once.
        data=DataConfig(
            "token_windows",
            {"seq_len": 32, "vocab_size": 16, "num_tokens": 262144, "val_fraction": 0.02},
        ),
        optim=OptimConfig(optimizer="adamw", learning_rate=3e-3, schedule="cosine"),
        trainer=TrainerConfig(
            name="quickstart",
            checkpoint_dir="runs",
            steps=300,
            batch_size=32,
            log_every=50,
            eval_every=100,
            checkpoint_every=100,
            seed=0,
        ),
        objective=ObjectiveConfig("lm"),
    )
