"""dew.config.default_metrics and evaluate_run: the metrics a configured objective declares, and
`dew eval`'s pass over a run folder's latest checkpoint through public names only."""

import ast
import inspect

import jax
import numpy as np
import pytest
from _builders import TINY as SIZES

from dew import metrics
from dew._domains import evaluation_key, run_key
from dew.cli._commands import _eval
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
    with pytest.raises(
        FileNotFoundError, match="has no checkpoints folder: the run saved no checkpoint"
    ):
        evaluate_run(folder)


def test_dew_eval_imports_no_private_module():
    imported = [
        node.module
        for node in ast.walk(ast.parse(inspect.getsource(_eval).strip()))
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


def _rows_dataset(count, batch, val_fraction):
    from dew.data import indexed_dataset
    from dew.data._indexed import fingerprint_of

    class Numbered:
        fingerprint = fingerprint_of("numbered", count)

        def __len__(self):
            return count

        def read(self, indices):
            return {"row": np.asarray(indices, np.int64)}

    return indexed_dataset(Numbered(), batch=batch, seed=3, val_fraction=val_fraction)


def _rows_of(batches, partition):
    return [int(row) for batch in batches(partition) for row in batch["row"]]


def test_the_training_split_is_every_training_row_once_in_row_order_for_any_process_count():
    from dew.config._evaluation import split_batches
    from dew.data import Partition

    data = _rows_dataset(50, batch=4, val_fraction=0.2)
    training = sorted(int(row) for row in data.train.rows.read(np.arange(40))["row"])
    assert _rows_of(split_batches(data, "train"), Partition()) == training
    shares = [_rows_of(split_batches(data, "train"), Partition(index, 3)) for index in range(3)]
    assert (
        sorted(row for share in shares for row in share) == training
    )  # three processes: the same rows, once each
    assert _rows_of(split_batches(data, "validation"), Partition()) == _rows_of(
        data.val, Partition()
    )
    # batches: the pass's first batches x batch rows, whatever the process count.
    first = _rows_of(split_batches(data, "train", batches=3), Partition())
    assert first == training[:12]
    shares = [
        _rows_of(split_batches(data, "train", batches=3), Partition(index, 2)) for index in (0, 1)
    ]
    assert sorted(row for share in shares for row in share) == training[:12]


def test_a_streamed_training_split_needs_a_batch_count_and_a_missing_split_says_which():
    import itertools

    from dew.config._evaluation import split_batches
    from dew.data import Dataset, Partition

    rows = np.arange(4)
    stream = Dataset(train=lambda partition: itertools.repeat({"row": rows}), batch=4)
    with pytest.raises(ValueError, match=r"trains on a stream .* --batches N"):
        split_batches(stream, "train", source="mine")
    assert len(list(split_batches(stream, "train", batches=2)(Partition()))) == 2
    with pytest.raises(ValueError, match=r"'mine' has no validation data .* --split train"):
        split_batches(stream, "validation", source="mine")
    with pytest.raises(ValueError, match="split must be 'validation' or 'train', got 'val'"):
        split_batches(stream, "val")


@pytest.mark.slow  # a 4-step fit on text: about 8 s
def test_evaluate_run_on_the_training_split_is_numpys_perplexity_over_every_window(
    tmp_path, monkeypatch
):
    import equinox as eqx

    from dew.config import DataConfig
    from dew.config._recipe import build_objective

    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for number in range(3):
        (corpus / f"{number}.txt").write_text(f"text {number}: " + "abc def ghi " * (8 + number))
    config = RunConfig(
        model=ModelConfig("causal_transformer", {**SIZES, "vocab_size": 257}),
        data=DataConfig("text", {"paths": ["corpus/*.txt"], "seq_len": 8}),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(name="text", checkpoint_dir=str(tmp_path), steps=4, batch_size=4),
    )
    state = config.train(progress=False)
    with pytest.raises(ValueError, match="'text' has no validation data"):
        evaluate_run(tmp_path / "text")
    scored = evaluate_run(tmp_path / "text", split="train")
    capped = evaluate_run(tmp_path / "text", split="train", batches=2)

    # Every window of the files' bytes (each file followed by the end of a document, 256),
    # scored with the trained params and reduced in NumPy.
    stream = np.concatenate(
        [
            np.append(np.frombuffer(path.read_bytes(), np.uint8).astype(np.int64), 256)
            for path in sorted(corpus.iterdir())
        ]
    )
    windows = np.stack([stream[i * 8 : i * 8 + 9] for i in range((stream.size - 1) // 8)])
    model = eqx.combine(state.params, build_objective(config, None, jax.random.key(0)).model)
    logits = np.asarray(jax.vmap(model)(windows[:, :-1]), np.float64)
    peak = logits.max(-1, keepdims=True)
    log_probs = logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
    losses = -np.take_along_axis(log_probs, windows[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(scored.scores["perplexity"], np.exp(losses.mean()), rtol=1e-5)
    np.testing.assert_allclose(capped.scores["perplexity"], np.exp(losses[:8].mean()), rtol=1e-5)
