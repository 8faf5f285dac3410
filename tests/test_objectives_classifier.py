"""ClassifierObjective: its loss is the weighted cross entropy, evaluate returns ClassScores,
bad labels reach the user as a plain ValueError from a compiled pass, and tiny_classifier
trains above chance and rescores with `dew eval`."""

import contextlib
import io
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import evaluate, metrics
from dew.artifacts import ClassScores
from dew.cli import main
from dew.cli._console import higher_is_better
from dew.config import builtin
from dew.objectives.classifier import ClassifierObjective
from dew.registry import objectives
from dew.tracking import read_journal


@pytest.fixture(scope="module")
def objective():
    return ClassifierObjective(eqx.nn.Linear(4, 3, key=jax.random.key(0)), classes=3)


def _batch(rows=6, seed=0, weights=False):
    rng = np.random.default_rng(seed)
    batch = {
        "inputs": rng.normal(size=(rows, 4)).astype(np.float32),
        "labels": rng.integers(0, 3, rows).astype(np.int32),
    }
    if weights:
        batch["sample_weight"] = rng.random(rows).astype(np.float32)
    return batch


@pytest.mark.parametrize("weights", [False, True])
def test_the_loss_is_the_weighted_cross_entropy_the_metric_reports(objective, weights):
    batch = _batch(weights=weights)
    params = objective.init_params()
    loss, aux = objective.loss(params, batch, jax.random.key(0))
    scores = objective.evaluate(params, batch, jax.random.key(0))
    assert isinstance(scores, ClassScores) and aux == {}
    assert scores.logits.shape == (6, 3) and (scores.weights is None) == (not weights)
    logits = np.asarray(jax.vmap(objective.model)(jnp.asarray(batch["inputs"])), np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    losses = -log_probs[np.arange(6), batch["labels"]]
    weight = batch.get("sample_weight", np.ones(6))
    expected = np.sum(losses * weight) / np.sum(weight)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    metric = metrics.cross_entropy()
    np.testing.assert_allclose(float(metric.finalize(metric(scores))), expected, rtol=1e-5)


def test_the_default_metrics_and_the_registry_entry(objective):
    names = [metric.name for metric in objective.default_metrics()]
    assert names == ["accuracy", "cross_entropy", "f1", "expected_calibration_error"]
    assert objective.name == "classifier"
    assert "classifier" in objectives


def test_a_bad_label_in_a_compiled_pass_is_a_plain_value_error(objective):
    bad = _batch()
    bad["labels"][4] = 3
    message = "ClassifierObjective: batch['labels'] holds label 3 at row 4; valid labels are 0 to 2"
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        evaluate(
            objective,
            objective.init_params(),
            [_batch(), bad],
            metrics=objective.default_metrics(),
            key=jax.random.key(0),
        )
    assert type(caught.value) is ValueError
    with pytest.raises(ValueError, match=re.escape(message)):
        objective.check_batch(bad)
    with pytest.raises(KeyError, match=r"reads batch key 'labels', but the batch has 'inputs'\."):
        objective.check_batch({"inputs": bad["inputs"]})
    with pytest.raises(ValueError, match=re.escape("shaped (6,), got shape (5,)")):
        objective.check_batch({**_batch(), "sample_weight": np.ones(5, np.float32)})


def test_the_arguments_are_checked():
    with pytest.raises(ValueError, match="classes must be an integer >= 2, got 1"):
        ClassifierObjective(eqx.nn.Linear(4, 1, key=jax.random.key(0)), classes=1)
    with pytest.raises(TypeError, match="needs a callable model"):
        ClassifierObjective(3, classes=2)
    wrong = ClassifierObjective(eqx.nn.Linear(4, 2, key=jax.random.key(0)), classes=3)
    with pytest.raises(ValueError, match=re.escape("must map each example to 3 logits")):
        wrong.evaluate(wrong.init_params(), _batch(), jax.random.key(0))


def test_the_console_ranks_the_classification_metrics():
    for name in ("accuracy", "top_3_accuracy", "precision_class_2", "recall", "f1", "auroc"):
        assert higher_is_better(f"classifier/validation/{name}"), name
    for name in ("cross_entropy", "expected_calibration_error"):
        assert not higher_is_better(f"classifier/validation/{name}"), name


def _run(arguments):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(arguments)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_tiny_classifier_trains_above_chance_and_dew_eval_rescores_it(tmp_path):
    steps = 100
    arguments = ["train", "--config", "tiny_classifier", "--checkpoint-dir", str(tmp_path)]
    arguments += ["--steps", str(steps), "--set", f"trainer.eval_every={steps}"]
    arguments += ["--set", f"trainer.checkpoint_every={steps}", "--quiet"]
    status, _, err = _run(arguments)
    assert status == 0, err
    folder = tmp_path / builtin("tiny_classifier").trainer.name
    ((step, accuracy),) = read_journal(folder).scalars["classifier/validation/accuracy"]
    assert step == steps and accuracy > 0.5  # chance is 1/3
    status, out, err = _run(["eval", str(folder)])
    assert status == 0, err
    assert out.splitlines()[0].startswith(f"step {steps}  accuracy {accuracy:.4f}  cross_entropy")


def test_the_registry_entry_reads_the_classes_inputs_key():
    model = eqx.nn.Linear(4, 3, key=jax.random.key(0))
    built = objectives["classifier"](model, key=jax.random.key(1), classes=3)
    assert built.inputs == ClassifierObjective(model, classes=3).inputs == "inputs"


@pytest.mark.slow  # about 9 s: the command builds the model and the shapes first
def test_dew_train_names_the_inputs_key_the_batch_lacks_in_one_line(tmp_path):
    # tiny_classifier names `inputs="images"`, the key `shapes` yields; a config that
    # leaves it out reads the default key, which the batch lacks: one line, exit 2.
    arguments = ["train", "--config", "tiny_classifier", "--checkpoint-dir", str(tmp_path)]
    arguments += ["--steps", "1", "--set", 'objective.kwargs.inputs="inputs"', "--quiet"]
    arguments += ["--set", "data.kwargs.rows=64", "--set", "trainer.batch_size=8"]
    status, _, err = _run(arguments)
    assert status == 2
    assert err == (
        "dew train: the data's first training batch does not fit the 'classifier' objective: "
        "ClassifierObjective reads batch key 'inputs' (its `inputs` field), but the batch has "
        "'images', 'labels'.\n"
    )
