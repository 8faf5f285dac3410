"""The token objectives' previews from real fits on text, decoded through the data's tokenizer.

One tiny fit per objective (a causal LM continuing prompts, masked diffusion generating whole
rows) on `dew.data.text` over a few stdlib files, reporting to every tracker at once; each
tracker's own reader (the local files, TensorBoard's `EventAccumulator`, `MlflowClient`, W&B's
offline log) gives back each row's prompt and continuation, which must be the tokenizer's
decode of the IDs the fit generated. The LM's vocabulary is larger than the tokenizer's, as a
padded vocabulary is: an ID no tokenizer decodes must show, not end the fit.
"""

import importlib.util
import json
import pathlib
import sysconfig
import types

import jax
import numpy as np
import optax
import pytest

import dew
from dew.data import text
from dew.data.tokenizers import BytesTokenizer
from dew.data.tokenizers._readable import readable_text
from dew.nn.backbones.bidirectional_transformer import BidirectionalTransformer
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective, Samples
from dew.objectives.masked_diffusion import MaskedDiffusionObjective
from dew.tracking import InMemoryTracker, LocalTracker, Trackers, read_journal
from dew.tracking._transcript import BOUNDARY

STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
EXTRAS = {
    name: importlib.util.find_spec(name) is not None for name in ("tensorboard", "mlflow", "wandb")
}
SEQ_LEN, STEPS, EVENTS = 16, 4, [2, 4]
TOKENIZER = BytesTokenizer()


def _lm():
    model = CausalTransformer(
        vocab_size=264,  # padded past the tokenizer's 257 IDs
        emb_features=32,
        num_layers=1,
        num_heads=2,
        mlp_features=64,
        max_seq_len=SEQ_LEN + 8,
        key=jax.random.key(1),
    )
    return LMObjective(model, seq_len=SEQ_LEN, samples=Samples(num_samples=3, max_new_tokens=8))


def _masked():
    model = BidirectionalTransformer(
        vocab_size=257,
        emb_features=32,
        num_layers=1,
        num_heads=2,
        mlp_features=64,
        max_seq_len=SEQ_LEN,
        key=jax.random.key(1),
    )
    return MaskedDiffusionObjective(model, seq_len=SEQ_LEN, sampling_steps=4, preview_count=3)


CASES = {"lm": _lm, "masked_diffusion": _masked}


@pytest.fixture(scope="module", autouse=True)
def quiet_wandb(tmp_path_factory):
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.setenv(name, str(home / name.lower()))
        yield


@pytest.fixture(scope="module", params=sorted(CASES))
def fit(request, tmp_path_factory):
    """One fit of the case reporting to every tracker; `shown` the `Preview` each event
    logged (an `InMemoryTracker` kept it), `expected` each event's rows as text."""
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    data = text(
        [STDLIB / "textwrap.py", STDLIB / "shlex.py", STDLIB / "string.py"],
        tokenizer="bytes",
        seq_len=SEQ_LEN,
        batch=8,
        val_fraction=0.34,
        cache_dir=folder / "cache",
    )
    trackers = {"memory": InMemoryTracker(), "local": LocalTracker(folder / "local")}
    if EXTRAS["tensorboard"]:
        from dew.tracking.tensorboard import TensorBoardTracker

        trackers["tensorboard"] = TensorBoardTracker(folder / "events")
    if EXTRAS["mlflow"]:
        from dew.tracking.mlflow import MLflowTracker

        trackers["mlflow"] = MLflowTracker("text-previews", name, uri=folder / "mlruns")
    if EXTRAS["wandb"]:
        from dew.tracking.wandb import WandbTracker

        trackers["wandb"] = WandbTracker("dew-tests", name, offline=True, dir=folder / "wandb")
    objective = CASES[name]()
    trainer = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0))
    with Trackers(*trackers.values()) as tracker:
        trainer.fit(
            data, steps=STEPS, log_every=2, eval_every=2, tracker=tracker, preview=True,
            progress=False,
        )  # fmt: skip
    shown_as = f"{objective.name}/validation/samples"
    shown = dict(trackers["memory"].artifacts[shown_as])
    expected = {}
    for step, preview in shown.items():
        assert preview.tokenizer is data.tokenizer and isinstance(preview.tokenizer, BytesTokenizer)
        tokens, mask = np.asarray(preview.artifact.tokens), np.asarray(preview.artifact.mask)
        rows = []
        for row, generated in zip(tokens, mask, strict=True):
            start = int(np.argmax(generated))
            prompt = None if start == 0 else readable_text(TOKENIZER, row[:start])
            rows.append({"prompt": prompt, "continuation": readable_text(TOKENIZER, row[start:])})
            for part, ids in ((prompt, row[:start]), (rows[-1]["continuation"], row[start:])):
                if ((ids >= 0) & (ids < 256)).all():  # nothing to mark: the tokenizer's decode
                    assert part == (TOKENIZER.decode(ids) if len(ids) else None)
        expected[step] = rows
    return types.SimpleNamespace(
        name=name, folder=folder, trackers=trackers, shown_as=shown_as, shown=shown,
        expected=expected,
    )  # fmt: skip


def _needs(extra):
    if not EXTRAS[extra]:
        pytest.skip(f"{extra} is not installed")


def _page_rows(page):
    """The rows a `text.md` page shows, each the text between its fences."""
    blocks = page.split("~~~text\n")[1:]
    return [block.split("\n~~~")[0] for block in blocks]


def _shown_as_page(rows):
    """Each row as the page shows it: `prompt⟨|⟩continuation`, or the continuation alone."""
    return [BOUNDARY.join(filter(None, (row["prompt"], row["continuation"]))) for row in rows]


@pytest.mark.slow
def test_local_files_hold_the_ids_and_their_decoded_text(fit):
    folder = fit.folder / "local"
    journal = read_journal(folder).artifacts
    assert [(name, step) for name, step, _ in journal] == [(fit.shown_as, step) for step in EVENTS]
    for _, step, files in journal:
        assert [pathlib.PurePath(file).name for file in files] == ["tokens.json", "text.md"]
        stored = json.loads((folder / files[0]).read_text())
        assert stored["tokens"] == np.asarray(fit.shown[step].artifact.tokens).tolist()
        assert (stored["text"], stored["tokenizer"]) == (fit.expected[step], "bytes")
        page = (folder / files[1]).read_text()
        assert _page_rows(page) == _shown_as_page(fit.expected[step])
        assert (BOUNDARY in page.splitlines()[0]) == (fit.name == "lm")  # prompts: LM only


@pytest.mark.slow
def test_tensorboard_holds_the_page_as_text_read_back_by_its_reader(fit):
    _needs("tensorboard")
    from test_tracking_tensorboard import _accumulator, _texts

    events = _accumulator(fit.folder / "events")
    pages = _texts(events, f"{fit.shown_as}/text")
    assert [step for step, _ in pages] == EVENTS
    for step, page in pages:
        assert _page_rows(page) == _shown_as_page(fit.expected[step])
        local = fit.folder / "local" / "previews" / fit.shown_as / str(step) / "text.md"
        assert page == local.read_text()  # the same page every tracker shows


@pytest.mark.slow
def test_mlflow_holds_the_files_the_local_tracker_wrote(fit, tmp_path, monkeypatch):
    _needs("mlflow")
    from test_tracking_mlflow import _download, _files

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracker = fit.trackers["mlflow"]
    for step in EVENTS:
        folder = f"previews/{fit.shown_as}/{step}"
        assert _files(tracker, folder) == [f"{folder}/text.md", f"{folder}/tokens.json"]
        for name in ("text.md", "tokens.json"):
            downloaded = _download(tracker, f"{folder}/{name}", tmp_path / str(step)).read_bytes()
            assert downloaded == (fit.folder / "local" / folder / name).read_bytes()


@pytest.mark.slow
def test_wandb_holds_a_table_of_each_rows_prompt_and_continuation(fit):
    _needs("wandb")
    from test_tracking_wandb import _media, _read

    read = _read(fit.trackers["wandb"])
    for step in EVENTS:
        table = json.loads(_media(read, read.rows[step][f"{fit.shown_as}/tokens"]))
        assert table["columns"][:4] == ["row", "prompt", "continuation", "tokens"]
        assert [{"prompt": row[1], "continuation": row[2]} for row in table["data"]] == (
            fit.expected[step]
        )
