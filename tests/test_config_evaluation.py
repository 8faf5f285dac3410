"""dew.config.default_metrics and evaluate_run: the metrics a configured objective declares, and
`dew eval`'s pass over a run folder's latest checkpoint through public names only."""

import ast
import inspect

import jax
import numpy as np
import pytest

from dew import cli, metrics
from dew._domains import evaluation_key, run_key
from dew.config import (
    ModelConfig,
    ObjectiveConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
    default_metrics,
    evaluate_run,
)
from dew.registry import datasets

SIZES = {
    "vocab_size": 16,
    "emb_features": 16,
    "num_layers": 1,
    "num_heads": 2,
    "mlp_features": 32,
    "max_seq_len": 16,
}


def _config(root, model="causal_transformer", objective=None, **trainer):
    settings = {
        "name": "tiny",
        "checkpoint_dir": str(root),
        "steps": 6,
        "batch_size": 8,
        "log_every": 3,
        "eval_every": 3,
        "checkpoint_every": 3,
        **trainer,
    }
    return RunConfig(
        model=ModelConfig(model, SIZES),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(**settings),
        **({} if objective is None else {"objective": objective}),
    )


def test_the_default_metrics_are_those_the_configured_objective_declares(tmp_path):
    names = {
        "lm": default_metrics(_config(tmp_path)),
        "masked_diffusion": default_metrics(
            _config(
                tmp_path,
                model="bidirectional_transformer",
                objective=ObjectiveConfig("masked_diffusion"),
            )
        ),
    }
    assert {kind: tuple(m.name for m in chosen) for kind, chosen in names.items()} == {
        "lm": ("perplexity", "token_accuracy"),
        "masked_diffusion": (),
    }


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_evaluate_run_scores_the_latest_checkpoint_as_the_last_validation_event(tmp_path):
    config = _config(tmp_path)
    state = config.train(metrics=default_metrics(config), progress=False)
    result = evaluate_run(tmp_path / "tiny")
    assert result.step == 6 and list(result.scores) == ["perplexity", "token_accuracy"]
    for name, value in result.scores.items():
        step, logged = state.metric_history[f"lm/validation/{name}"][-1]
        assert step == 6
        np.testing.assert_allclose(value, logged, rtol=1e-6)
    # the Trainer's event key at step 6: its run key (the recipe's) and the step
    event_key = evaluation_key(run_key(jax.random.key(config.trainer.seed)), 6)
    assert np.array_equal(jax.random.key_data(result.key), jax.random.key_data(event_key))
    chosen = evaluate_run(tmp_path / "tiny", metrics=[metrics.mean_loss()])
    np.testing.assert_allclose(np.exp(chosen.scores["mean_loss"]), result.scores["perplexity"])


def test_evaluate_run_names_a_folder_without_checkpoints(tmp_path):
    _config(tmp_path, eval_every=None, checkpoint_every=None, steps=1).train(progress=False)
    folder = tmp_path / "tiny"
    for saved in sorted((folder / "checkpoints").rglob("*"), reverse=True):
        saved.rmdir() if saved.is_dir() else saved.unlink()
    (folder / "checkpoints").rmdir()
    with pytest.raises(FileNotFoundError, match="has no checkpoints folder to evaluate"):
        evaluate_run(folder)


def test_dew_eval_imports_no_private_module():
    imported = [
        node.module
        for node in ast.walk(ast.parse(inspect.getsource(cli._eval).strip()))
        if isinstance(node, ast.ImportFrom) and node.module
    ]
    assert imported and not [name for name in imported if "._" in name or "dew._" in name]


@pytest.mark.slow  # about 7 s; CI runs it with the slow tests
def test_evaluate_run_restores_an_ema_objective_and_scores_with_its_ema_params(tmp_path):
    from dew.data import Partition
    from dew.evaluation import evaluate

    dit = {"image_size": 16, "patch_size": 4, "channels": 3, "width": 16, "depth": 1}
    config = RunConfig(
        model=ModelConfig("dit", {**dit, "heads": 2, "num_classes": 3}),
        objective=ObjectiveConfig("diffusion", {"ema_decay": 0.5, "sampling": {"steps": 2}}),
        data=datasets["shapes"](rows=40, val_fraction=0.2),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="ema",
            checkpoint_dir=str(tmp_path),
            steps=4,
            batch_size=8,
            log_every=2,
            eval_every=None,
            checkpoint_every=2,
        ),
    )
    state = config.train(progress=False)
    assert state.ema_params is not None
    mse = (metrics.mse(),)
    result = evaluate_run(tmp_path / "ema", metrics=mse)
    objective = config.objective.build(config.model.build(key=jax.random.key(0)))
    data = config.data.build(batch_size=8, seed=config.trainer.seed)

    def score(params):
        batches = data.val(Partition())
        return evaluate(objective, params, batches, metrics=mse, key=result.key).scores["mse"]

    assert result.scores["mse"] == score(state.ema_params)
    assert result.scores["mse"] != score(state.params)
