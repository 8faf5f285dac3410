"""Built-in run configurations: `tiny_lm`, what `dew train` trains with no file."""

from dew.config._config import (
    DataConfig,
    ModelConfig,
    ObjectiveConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
)

__all__ = ["tiny_lm"]


def tiny_lm() -> RunConfig:
    """A small causal LM on `token_windows`' synthetic Markov chain (16 token IDs, 32
    predicted positions), trained for 300 steps, evaluated every 100 and checkpointed
    every 100, as the run `quickstart` under `runs/`. About half a minute on 2 CPU cores.

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
        data=DataConfig("token_windows", {"seq_len": 32, "vocab_size": 16}),
        optim=OptimConfig(optimizer="adamw", learning_rate=3e-3),
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
