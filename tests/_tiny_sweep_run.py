"""The tiny language-model run the sweep tests train through the command (one layer, 16-token
vocabulary, batches of 4): seconds a trial."""

from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
from dew.registry import datasets


def tiny_lm_run(tmp_path, steps=1, checkpoint_every=None):
    """The run, evaluated at its last step, its runs under `tmp_path / "runs"`."""
    return RunConfig(
        model=ModelConfig(
            "causal_transformer",
            {
                "vocab_size": 16,
                "emb_features": 8,
                "num_layers": 1,
                "num_heads": 2,
                "mlp_features": 16,
                "max_seq_len": 8,
            },
        ),
        data=datasets["token_windows"](seq_len=8, num_tokens=256),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="tiny",
            checkpoint_dir=str(tmp_path / "runs"),
            steps=steps,
            batch_size=4,
            log_every=1,
            eval_every=steps,
            checkpoint_every=checkpoint_every,
        ),
    )
