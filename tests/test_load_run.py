"""`dew.load_run`: a run folder's trained parameters (only those read from the checkpoint),
objective, model, tokenizer and class names; and the `data.json` the recipe writes for it."""

import json
import re
import shutil
import warnings

import jax
import numpy as np
import pytest
from _trained_runs import trained

import dew
from dew.checkpoints import Checkpointer, DamagedCheckpointWarning
from dew.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
)
from dew.data import Partition
from dew.registry import SHAPE_KINDS

# Every test here loads a run trained for it (a fit compiles its step: 10 s or more here);
# the params-only restore underneath is tested fast in test_checkpoints.py.
pytestmark = pytest.mark.slow


def _leaves_equal(left, right):
    pairs = zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True)
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A 2-step tiny_classifier run (checkpoints at steps 1 and 2) and its final state."""
    return trained("tiny_classifier", tmp_path_factory.mktemp("classifier"))


@pytest.fixture(scope="module")
def diffusion(tmp_path_factory):
    """A 2-step tiny_diffusion run (it keeps EMA weights) and its final state."""
    return trained("tiny_diffusion", tmp_path_factory.mktemp("diffusion"))


def test_a_classifier_run_loads_its_trained_params_model_and_class_names(classifier):
    folder, state = classifier
    loaded = dew.load_run(folder)
    assert (loaded.step, loaded.weights, loaded.folder) == (2, "live", folder)
    assert loaded.config == RunConfig.from_run_record(folder)
    assert loaded.classes == SHAPE_KINDS == ("square", "disc", "bar")
    assert loaded.fields == {"images": ((16, 16, 3), "float32"), "labels": ((), "int32")}
    assert loaded.tokenizer is None
    assert _leaves_equal(loaded.params, state.params)  # the state the fit returned
    assert _leaves_equal(loaded.objective.init_params(), state.params)
    # The model is the trained one: its logits are the objective's with the fit's params.
    batch = next(loaded.config.data.build(batch_size=4, seed=0).val(Partition()))
    scores = loaded.objective.evaluate(state.params, batch, jax.random.key(0))
    logits = jax.vmap(loaded.model)(batch["images"])
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(scores.logits))


def test_an_earlier_step_loads_that_checkpoint(classifier):
    folder, state = classifier
    earlier = dew.load_run(folder, step=1)
    assert earlier.step == 1 and not _leaves_equal(earlier.params, state.params)
    with Checkpointer(folder / "checkpoints") as saved:  # the whole state, as a resume reads it
        whole, _ = saved.restore(state, step=1)  # `state` gives the structure
    assert _leaves_equal(earlier.params, whole.params)


def test_loading_builds_no_optimizer_and_reads_only_the_params(classifier, monkeypatch):
    import orbax.checkpoint as ocp

    folder, state = classifier

    def refuse(*args, **kwargs):
        raise AssertionError("load_run built an optimizer or restored a whole TrainState")

    monkeypatch.setattr(OptimConfig, "build", refuse)
    monkeypatch.setattr(Checkpointer, "restore", refuse)
    asked = []
    restore = ocp.PyTreeCheckpointHandler.restore

    def spy(self, directory, args=None):
        asked.append(args.item)
        return restore(self, directory, args=args)

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "restore", spy)
    loaded = dew.load_run(folder)
    assert _leaves_equal(loaded.params, state.params)
    (item,) = asked
    read = [index for index, leaf in enumerate(item) if leaf is not ocp.PLACEHOLDER]
    count = len(jax.tree.leaves(state.params))
    assert read == list(range(1, 1 + count))  # the params alone: not the step, Adam, the key
    assert len(item) == len(jax.tree.leaves(state)) > 2 * count


def test_a_diffusion_run_loads_its_ema_weights_by_default_and_its_live_ones_on_request(diffusion):
    folder, state = diffusion
    ema = dew.load_run(folder)
    live = dew.load_run(folder, weights="live")
    assert (ema.weights, live.weights) == ("ema", "live")
    assert _leaves_equal(ema.params, state.ema_params)
    assert _leaves_equal(live.params, state.params)
    assert not _leaves_equal(ema.params, live.params)
    assert _leaves_equal(dew.load_run(folder, weights="ema").params, state.ema_params)
    assert ema.classes == SHAPE_KINDS


def test_asking_a_run_without_ema_weights_for_them_is_one_line(classifier):
    folder, _ = classifier
    with pytest.raises(ValueError, match="weights='ema'") as caught:
        dew.load_run(folder, weights="ema")
    assert str(caught.value) == (
        f"{folder}: weights='ema', but the run keeps no EMA weights (its 'classifier' objective "
        "declares no ema_decay); load its live weights (weights='live' or 'auto')."
    )


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {"weights": "best"},
            ValueError,
            re.escape("load_run: weights must be one of ('auto', 'live', 'ema'), got 'best'."),
        ),
        (
            {"step": -1},
            ValueError,
            re.escape("load_run: step must be None or an integer >= 0, got -1."),
        ),
        (
            {"step": 3},
            FileNotFoundError,
            "no checkpoint for step 3 under .*; its steps are \\[1, 2\\]",
        ),
    ],
)
def test_a_bad_argument_names_what_is_allowed(classifier, arguments, error, message):
    folder, _ = classifier
    with pytest.raises(error, match=message):
        dew.load_run(folder, **arguments)


def test_a_folder_without_run_json_or_checkpoints_is_named(classifier, tmp_path):
    folder, _ = classifier
    with pytest.raises(FileNotFoundError) as caught:
        dew.load_run(tmp_path)
    assert str(caught.value) == f"{tmp_path} is not a run folder: it has no run.json."
    with pytest.raises(FileNotFoundError, match=r"^no run folder at .*nowhere\.$"):
        dew.load_run(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"data.json is a file, not a run folder"):
        dew.load_run(folder / "data.json")
    assert dew.load_run(folder / "run.json").step == 2  # its run.json names it too
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(FileNotFoundError) as caught:
        dew.load_run(copy)
    assert str(caught.value) == f"{copy} has no checkpoints folder: the run saved no checkpoint."


def test_a_checkpoint_of_another_model_names_the_first_leaf_that_differs(classifier, tmp_path):
    folder, _ = classifier
    copy = tmp_path / "tiny-classifier"
    shutil.copytree(folder, copy)
    record = json.loads((copy / "run.json").read_text())
    record["model"]["kwargs"]["width"] = 8  # run.json now names another model
    (copy / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="another model") as caught:
        dew.load_run(copy)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint step 2 under {str(copy / 'checkpoints')!r}: it was ")
    assert "written for another model: its params are 19 arrays, this model's 19, and the " in (
        message
    )
    assert message.endswith(
        "first that differs is .encoder.patch_embedding.weight: saved float32[16, 48], expected "
        "float32[8, 48]."
    )


def test_a_damaged_newest_step_gives_way_to_the_one_before(classifier, tmp_path):
    folder, _ = classifier
    copy = tmp_path / "tiny-classifier"
    shutil.copytree(folder, copy)
    shutil.rmtree(copy / "checkpoints" / "2" / "state")
    with pytest.warns(DamagedCheckpointWarning, match="checkpoint step 2 under .* is damaged"):
        loaded = dew.load_run(copy)
    assert loaded.step == 1
    assert _leaves_equal(loaded.params, dew.load_run(folder, step=1).params)
    shutil.rmtree(copy / "checkpoints" / "1" / "extra")
    with pytest.raises(ValueError, match=r"^no intact checkpoint under .*step 1: its extra/"):
        dew.load_run(copy)


def test_the_run_folder_records_its_data_for_later(classifier):
    folder, _ = classifier
    record = json.loads((folder / "data.json").read_text())
    assert record == {
        "type": "data_record",
        "classes": ["square", "disc", "bar"],
        "tokenizer": None,
        "fields": {
            "images": {"shape": [16, 16, 3], "dtype": "float32"},
            "labels": {"shape": [], "dtype": "int32"},
        },
    }


def _text_run(root, tokenizer, **kwargs):
    sizes = {"emb_features": 16, "num_layers": 1, "num_heads": 2, "mlp_features": 32}
    return RunConfig(
        model=ModelConfig("causal_transformer", {**sizes, "vocab_size": 320, "max_seq_len": 16}),
        data=DataConfig(
            "text",
            {"paths": [str(root / "corpus" / "*.txt")], "seq_len": 8, "tokenizer": tokenizer},
        ),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="text", checkpoint_dir=str(root), steps=1, batch_size=4, **kwargs
        ),
    )


def _corpus(root):
    corpus = root / "corpus"
    corpus.mkdir()
    for number in range(4):
        (corpus / f"{number}.txt").write_text(f"note {number}: " + "the cat sat on a mat. " * 20)
    return corpus


def test_a_text_run_keeps_a_copy_of_its_tokenizer_that_loads_when_the_original_is_gone(tmp_path):
    from dew.data.tokenizers import HFTokenizer, train_tokenizer

    corpus = _corpus(tmp_path)
    original = tmp_path / "mine.json"
    train_tokenizer(str(corpus / "*.txt"), 300, original, progress=False)
    before = HFTokenizer(original)
    _text_run(tmp_path, str(original)).train(progress=False)
    folder = tmp_path / "text"
    assert (folder / "tokenizer.json").read_bytes() == original.read_bytes()
    original.unlink()  # the user moved it
    loaded = dew.load_run(folder)
    assert isinstance(loaded.tokenizer, HFTokenizer)
    assert loaded.tokenizer.fingerprint == before.fingerprint
    assert loaded.tokenizer.eos_id == before.eos_id
    text = "the cat sat on the mat"
    assert list(loaded.tokenizer.encode(text)) == list(before.encode(text))
    assert loaded.classes is None
    assert loaded.fields == {"text": ((9,), "int32")}
    # A copy that is no longer the tokenizer the run recorded is refused, naming both.
    (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text() + " ")
    with pytest.raises(ValueError, match=r"is not the one the run recorded \(fingerprint hf-"):
        dew.load_run(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"copied to .*tokenizer.json, but that file is missing"):
        dew.load_run(folder)


def test_a_bytes_tokenizer_is_recorded_by_its_name(tmp_path):
    from dew.data.tokenizers import BytesTokenizer

    _corpus(tmp_path)
    _text_run(tmp_path, "bytes").train(progress=False)
    folder = tmp_path / "text"
    assert json.loads((folder / "data.json").read_text())["tokenizer"] == {
        "kind": "bytes",
        "fingerprint": "bytes-1",
        "vocab_size": 257,
        "eos_id": 256,
    }
    assert not (folder / "tokenizer.json").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dew.load_run(folder).tokenizer == BytesTokenizer()
