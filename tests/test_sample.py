"""`dew sample RUN` (`dew._sample`, `dew.cli._sample`): an LM's continuations against greedy
decoding by full recomputation and against Hugging Face's own decoding of the run's tokenizer;
a diffusion run's grid against the objective's own samples laid out by the documented grid rule;
masked diffusion's rows; the sampling record beside every file (its SHA-256 by hashlib); one
line and exit status 2 for every bad input."""

import hashlib
import io
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _grids import check_grid, uint8
from _trained_runs import trained
from PIL import Image

import dew
from dew.cli import main
from dew.config import (
    DataConfig,
    ModelConfig,
    ObjectiveConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
)
from dew.config._load import example_batch
from dew.registry import datasets

pytestmark = pytest.mark.slow  # each module fixture trains a run: 5-15 s


def _sample(capsys, *args):
    """`dew sample` in-process: its exit status, standard output and standard error."""
    code = main(["sample", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _record(path):
    """The sampling record beside `path`, after checking it names the file and its SHA-256."""
    record = json.loads(path.with_name(f"{path.stem}.sampling.json").read_text())
    assert record["file"] == path.name
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    return record


# ------------------------------------------------------------------------------ causal LM


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    folder, _ = trained("tiny_lm", tmp_path_factory.mktemp("lm"))
    return folder


def _greedy(model, prompt, new):
    """Greedy decoding by running the whole sequence through the model for every token (padded
    to one length, so it compiles once: the model is causal, so what follows the last token
    leaves its logits as they are)."""
    forward = eqx.filter_jit(lambda model, tokens: model(tokens))
    tokens = list(prompt)
    for _ in range(new):
        padded = jnp.asarray(tokens + [0] * (model.max_seq_len - len(tokens)), jnp.int32)
        logits = forward(model, padded)
        tokens.append(int(np.argmax(np.asarray(logits[len(tokens) - 1]))))
    return tokens[len(prompt) :]


def test_greedy_samples_are_greedy_decoding_by_full_recomputation(lm, tmp_path, capsys):
    out = tmp_path / "greedy.jsonl"
    prompts = ["1 2 3", "7", "4 4 9 0 15"]
    flags = [flag for prompt in prompts for flag in ("--prompt", prompt)]
    code, said, _ = _sample(capsys, lm, *flags, "--temperature", 0, "--max-tokens", 9, "--out", out)
    assert code == 0 and said.startswith(f"wrote 3 samples to {out}")
    model = dew.load_run(lm).model
    samples = _jsonl(out)
    for prompt, sample in zip(prompts, samples, strict=True):
        ids = [int(word) for word in prompt.split()]
        assert sample["prompt"] == prompt and sample["prompt_tokens"] == ids
        assert sample["tokens"] == _greedy(model, ids, 9)
        assert sample["text"] == " ".join(map(str, sample["tokens"]))
        assert sample["stopped"] is False  # the run's data has no tokenizer, so no stop token
    record = _record(out)
    assert record["kind"] == "text" and record["checkpoint_step"] == 2
    assert record["weights"] == "live" and record["temperature"] == 0.0
    assert record["prompt_tokens"] == [[int(w) for w in p.split()] for p in prompts]
    assert record["eos_id"] is None and record["max_new_tokens"] == 9


def test_a_seed_draws_the_same_samples_and_another_seed_others(lm, capsys):
    def draw(seed):
        code, out, _ = _sample(capsys, lm, "--prompt", "1 2", "--rows", 3, "--seed", seed)
        assert code == 0
        return out.splitlines()

    first = draw(5)
    assert len(first) == 3 and all(line.startswith("1 2 | ") for line in first)
    assert draw(5) == first
    assert draw(6) != first


def test_without_a_prompt_it_continues_the_openings_of_the_data(lm, capsys):
    loaded = dew.load_run(lm)
    code, out, _ = _sample(capsys, lm, "--temperature", 0)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 4  # dew._sample.DATA_PROMPTS
    _, batch = example_batch(loaded)
    for line, row in zip(lines, np.asarray(batch["text"])[:4], strict=True):
        prompt = row[: loaded.objective.prompt_len]
        assert line.split(" | ")[0] == " ".join(map(str, prompt))


# ------------------------------------------------------------------- a run on its own text


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    from dew.data.tokenizers import train_tokenizer

    root = tmp_path_factory.mktemp("text")
    corpus = root / "corpus"
    corpus.mkdir()
    for number in range(4):
        (corpus / f"{number}.txt").write_text(f"note {number}: " + "the cat sat on a mat. " * 20)
    tokenizer = root / "tokenizer.json"
    train_tokenizer(str(corpus / "*.txt"), 300, tokenizer, progress=False)
    sizes = {"emb_features": 16, "num_layers": 1, "num_heads": 2, "mlp_features": 32}
    RunConfig(
        model=ModelConfig("causal_transformer", {**sizes, "vocab_size": 320, "max_seq_len": 32}),
        data=DataConfig(
            "text", {"paths": [str(corpus / "*.txt")], "seq_len": 8, "tokenizer": str(tokenizer)}
        ),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(name="mine", checkpoint_dir=str(root), steps=2, batch_size=4),
    ).train(progress=False)
    return root / "mine", tokenizer


def test_a_text_run_s_samples_are_decoded_as_hugging_face_decodes_its_tokenizer(
    text, tmp_path, capsys
):
    from tokenizers import Tokenizer

    folder, path = text
    reference = Tokenizer.from_file(str(path))
    out = tmp_path / "mine.jsonl"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat\n\nnote 3: the\n")  # the blank line is skipped
    code, _, _ = _sample(capsys, folder, "--prompts", prompts, "--rows", 2, "--out", out)
    assert code == 0
    samples = _jsonl(out)
    assert [(s["prompt"], s["sample"]) for s in samples] == [
        ("the cat", 0),
        ("the cat", 1),
        ("note 3: the", 0),
        ("note 3: the", 1),
    ]
    eos = dew.load_run(folder).tokenizer.eos_id
    for sample in samples:
        assert sample["prompt_tokens"] == reference.encode(sample["prompt"]).ids
        assert 1 <= len(sample["tokens"]) <= 32 - len(sample["prompt_tokens"])
        kept = [token for token in sample["tokens"] if token != eos]
        assert sample["text"] == reference.decode(kept)
        assert sample["stopped"] == (sample["tokens"][-1] == eos)
        assert eos not in sample["tokens"][:-1]  # a row ends at its first stop token
    record = _record(out)
    assert record["eos_id"] == eos and record["prompts"] == ["the cat", "note 3: the"]


def test_printed_text_samples_are_the_prompt_and_its_continuation(text, capsys):
    folder, _ = text
    code, out, _ = _sample(capsys, folder, "--prompt", "the cat", "--prompt", "", "--seed", 3)
    assert code == 0
    lines = out.split("\n")
    assert lines[0] == "--- sample 1 of 2 ---" and lines[1].startswith("the cat")
    assert "--- sample 2 of 2 ---" in lines


# ------------------------------------------------------------------------------ diffusion


@pytest.fixture(scope="module")
def diffusion(tmp_path_factory):
    folder, _ = trained("tiny_diffusion", tmp_path_factory.mktemp("diffusion"))
    return folder


def test_the_grid_holds_the_objective_s_own_samples_of_the_classes_asked_for(
    diffusion, tmp_path, capsys
):
    out = tmp_path / "grid.png"
    code, said, err = _sample(
        capsys, diffusion, "--class", "disc", "--class", "0", "--rows", 2, "--seed", 4,
        "--steps", 3, "--solver", "heun", "--guidance", 1.5, "--out", out,
    )  # fmt: skip
    assert code == 0, err
    assert said.startswith(f"wrote a grid of 4 samples to {out}") and "EMA weights" in said
    loaded = dew.load_run(diffusion)
    labels = jnp.asarray([1, 1, 0, 0], jnp.int32)
    sampling = dew.objectives.diffusion.Sampling(solver="heun", steps=3, guidance=1.5)
    objective = dew.objectives.diffusion.DiffusionObjective(
        loaded.objective.model,
        sampling=sampling,
        ema_decay=loaded.objective.ema_decay,
        prediction=loaded.objective.prediction,
    )
    expected = objective.sample(loaded.params, labels, jax.random.key(4))
    picture = np.asarray(Image.open(io.BytesIO(out.read_bytes())).convert("RGB"))
    check_grid(picture, [("generated", uint8(expected))], ["disc", "disc", "square", "square"])
    record = _record(out)
    assert record["kind"] == "images" and record["weights"] == "ema"
    assert (record["solver"], record["steps"], record["guidance"]) == ("heun", 3, 1.5)
    assert record["labels"] == [1, 1, 0, 0]
    assert record["classes"] == ["disc", "disc", "square", "square"]
    digest = hashlib.sha256(np.asarray([1, 1, 0, 0], "<i8").tobytes()).hexdigest()
    assert record["conditioning_sha256"] == digest  # the rule of dew.telemetry.SamplingProtocol


def test_without_a_class_every_class_is_drawn_with_the_run_s_sampler(diffusion, tmp_path, capsys):
    out = tmp_path / "all.png"
    assert _sample(capsys, diffusion, "--rows", 1, "--out", out)[0] == 0
    record = _record(out)
    config = dew.load_run(diffusion).objective.sampling
    assert record["classes"] == ["square", "disc", "bar"]
    assert (record["solver"], record["steps"], record["guidance"]) == (
        config.solver,
        config.steps,
        config.guidance,
    )


# ------------------------------------------------------------------------ masked diffusion


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    root = tmp_path_factory.mktemp("masked")
    sizes = {"emb_features": 16, "num_layers": 1, "num_heads": 2, "mlp_features": 32}
    RunConfig(
        model=ModelConfig(
            "bidirectional_transformer", {**sizes, "vocab_size": 16, "max_seq_len": 16}
        ),
        data=datasets["token_windows"](seq_len=8, num_tokens=1024),
        objective=ObjectiveConfig("masked_diffusion", {"sampling_steps": 4}),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(name="masked", checkpoint_dir=str(root), steps=2, batch_size=8),
    ).train(progress=False)
    return root / "masked"


def test_masked_diffusion_rows_are_the_objective_s_samples(masked, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert _sample(capsys, masked, "--rows", 3, "--steps", 2, "--seed", 9, "--out", out)[0] == 0
    loaded = dew.load_run(masked)
    objective = dew.objectives.masked_diffusion.MaskedDiffusionObjective(
        loaded.objective.model, seq_len=loaded.objective.seq_len, sampling_steps=2
    )
    expected = np.asarray(objective.sample(loaded.params, 3, jax.random.key(9)))
    samples = _jsonl(out)
    assert [sample["tokens"] for sample in samples] == expected.tolist()
    record = _record(out)
    assert (record["kind"], record["solver"], record["steps"]) == ("masked", "ancestral", 2)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("run", "args", "message"),
    [
        ("lm", ["--class", "1"], "--class: {run} is a causal LM run, which takes --prompt, "),
        ("lm", ["--prompt", "a b"], "--prompt 'a b': the run at {run} recorded no tokenizer"),
        ("lm", ["--prompt", "1 99"], "--prompt '1 99': token ID 99 is outside the model's "),
        ("lm", ["--prompt", "1", "--max-tokens", "100"], "--max-tokens 100: the longest "),
        ("lm", ["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan."),
        ("lm", ["--top-p", "1.5"], "--top-p must be a number in (0, 1], got 1.5."),
        ("lm", ["--top-k", "0"], "--top-k must be"),
        ("lm", ["--rows", "0"], "--rows must be"),
        ("lm", ["--out", "x.png"], "--out 'x.png': a causal LM run's samples are written as "),
        ("lm", ["--prompts", "missing.txt"], "--prompts 'missing.txt': no such file."),
        (
            "lm",
            ["--step", "7"],
            "no checkpoint for step 7 under '{run}/checkpoints'; its steps are [1, 2]",
        ),
        ("diffusion", [], "an image diffusion run's samples are a labelled grid: pass --out "),
        ("diffusion", ["--class", "blob", "--out", "g.png"], "--class 'blob': the model has "),
        ("diffusion", ["--class", "3", "--out", "g.png"], "--class '3': the model has no such"),
        ("diffusion", ["--prompt", "hi", "--out", "g.png"], "--prompt: {run} is an image "),
        ("diffusion", ["--out", "g.gif"], "--out 'g.gif': an image diffusion run's samples are"),
        ("diffusion", ["--guidance", "-1", "--out", "g.png"], "--guidance must be a finite "),
        ("diffusion", ["--out", "no/such/g.png"], "--out 'no/such/g.png': no folder 'no/such'"),
        ("masked", ["--guidance", "2"], "--guidance: {run} is a masked diffusion run, which "),
    ],
)
def test_a_bad_input_is_one_line_and_exit_status_2(
    request, run, args, message, tmp_path, monkeypatch, capsys
):
    folder = request.getfixturevalue(run)
    monkeypatch.chdir(tmp_path)
    code, out, err = _sample(capsys, folder, *args)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("dew sample: " + message.format(run=folder)), err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_run_that_generates_nothing_says_what_dew_sample_takes(tmp_path, capsys):
    folder, _ = trained("tiny_classifier", tmp_path)
    code, _, err = _sample(capsys, folder)
    assert code == 2 and err == (
        f"dew sample: the run at {folder} trains a 'classifier' objective, which generates "
        "nothing to sample: dew sample takes causal LM, diffusion and masked diffusion runs "
        "(dew predict scores new rows with a classifier).\n"
    )


def test_help_ends_with_examples(capsys):
    with pytest.raises(SystemExit) as shown:
        main(["sample", "--help"])
    assert shown.value.code == 0
    out = capsys.readouterr().out
    assert "--class NAME_OR_INDEX" in out and "examples:" in out.lower()
    assert "dew sample runs/tiny-diffusion --class disc" in out
