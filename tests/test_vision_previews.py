"""The vision objectives' previews from real fits, read back by each tracker's own reader.

One tiny fit per artifact (diffusion on images, diffusion on clips, JEPA) reports to
every tracker at once through `Trackers`; each tracker's test reads its own output back
with that tracker's reader (Pillow for the local PNG and GIF files, TensorBoard's
`EventAccumulator`, `MlflowClient`, W&B's offline transaction log) and checks it against
the samples the fit drew, recomputed from the fit's own params. The readers of the
tracker tests (`test_tracking_tensorboard`, `test_tracking_mlflow`, `test_tracking_wandb`)
are reused; each is imported only when its extra is installed.
"""

import importlib.util
import io
import json
import types

import jax
import numpy as np
import optax
import pytest
from _grids import check_gif_grid, check_png_grid, uint8

import dew
from dew import metrics
from dew._domains import evaluation_key, preview_key
from dew.artifacts import Clips, Images, Representations
from dew.data import Partition
from dew.naming import Split, preview_name
from dew.nn.backbones.dit import DiT
from dew.nn.backbones.vit import ViT
from dew.objectives.diffusion import PREVIEW_ROWS, DiffusionObjective, Sampling
from dew.objectives.jepa import BlockMasks, JEPAObjective
from dew.registry import SHAPE_KINDS, moving_shapes, shapes
from dew.steps import generation_params
from dew.tracking import InMemoryTracker, LocalTracker, Trackers, read_journal
from dew.tracking._render import histogram

Image = pytest.importorskip("PIL.Image")

STEPS, EVAL_EVERY = 4, 2
EVENTS = [2, 4]  # the evaluation events of a fit: one preview each
WIDTH = 32  # the backbones' width: a JEPA representation's dimensions
KEY = jax.random.key(0)
OPTIMIZER = optax.adam(1e-3)  # one object, so the fits of a case share their compiled step
EXTRAS = {
    name: importlib.util.find_spec(name) is not None for name in ("tensorboard", "mlflow", "wandb")
}


def _dit(frames=None):
    return DiT(
        16,
        4,
        3,
        width=WIDTH,
        depth=1,
        heads=2,
        frames=frames,
        num_classes=3,
        key=jax.random.key(1),
    )


def _images():
    objective = DiffusionObjective(_dit(), sampling=Sampling(steps=2), ema_decay=0.5)
    return objective, shapes(rows=40, val_fraction=0.2, batch_size=8, seed=0), [metrics.psnr()]


def _clips():
    objective = DiffusionObjective(_dit(frames=4), sampling=Sampling(steps=2), ema_decay=0.5)
    data = moving_shapes(rows=40, val_fraction=0.2, batch_size=8, seed=0)
    return objective, data, [metrics.video_psnr()]


def _jepa():
    encoder = ViT(16, 4, 3, width=WIDTH, depth=1, heads=2, key=jax.random.key(1))
    predictor = ViT(16, 4, 3, width=WIDTH, depth=1, heads=2, key=jax.random.key(2))
    masks = BlockMasks(targets=2, height=2, width=2)
    objective = JEPAObjective(encoder, predictor, ema_decay=0.99, masks=masks, probe_classes=3)
    data = shapes(rows=40, val_fraction=0.2, batch_size=8, seed=0)
    return objective, data, list(objective.default_metrics())


CASES = {"images": _images, "clips": _clips, "jepa": _jepa}
KINDS = {"images": Images, "clips": Clips, "jepa": Representations}


def _trackers(folder, name):
    """The trackers a fit reports to: in memory (the artifacts as logged), local, and
    TensorBoard, MLflow (a file store) and W&B (offline) where installed."""
    found = {"memory": InMemoryTracker(), "local": LocalTracker(folder / "local")}
    if EXTRAS["tensorboard"]:
        from dew.tracking.tensorboard import TensorBoardTracker

        found["tensorboard"] = TensorBoardTracker(folder / "events")
    if EXTRAS["mlflow"]:
        from dew.tracking.mlflow import MLflowTracker

        found["mlflow"] = MLflowTracker("vision-previews", name, uri=folder / "mlruns")
    if EXTRAS["wandb"]:
        from dew.tracking.wandb import WandbTracker

        found["wandb"] = WandbTracker("dew-tests", name, offline=True, dir=folder / "wandb")
    return found


@pytest.fixture(scope="module", autouse=True)
def quiet_wandb(tmp_path_factory):
    """W&B offline and silent, its folders under a temporary one."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.setenv(name, str(home / name.lower()))
        yield


@pytest.fixture(scope="module", params=sorted(CASES))
def fit(request, tmp_path_factory):
    """One case's fits and what its previews must show (seconds: the first test of each
    case pays for them, so the tests reading them are marked slow).

    - `watched`: the fit reporting to every tracker with `preview=True`;
    - `alone`: the same fit without a tracker; `quiet`: with a tracker, no previews
      (`quiet_tracker` kept what it was told);
    - `shown`: per evaluation event, the preview the trackers were given (a
      `dew.tracking.Preview`: an `InMemoryTracker` among them kept it), its artifact what
      each tracker's files must decode to;
    - `expected`: per evaluation event, the preview recomputed from the params the
      event read (the fit's EMA params at that step) and its first validation batch.
    """
    name = request.param
    objective, data, scored_by = CASES[name]()
    folder = tmp_path_factory.mktemp(name)
    trainer = dew.Trainer(objective, OPTIMIZER, KEY)

    def run(steps=STEPS, **kwargs):
        return trainer.fit(
            data,
            steps=steps,
            log_every=EVAL_EVERY,
            eval_every=EVAL_EVERY,
            metrics=scored_by,
            progress=False,
            **kwargs,
        )

    shown_as = preview_name(objective.name, Split.VALIDATION, "samples")  # as the trainer does
    trackers = _trackers(folder, name)
    with Trackers(*trackers.values()) as tracker:
        watched = run(tracker=tracker, preview=True)
    alone = run()
    quiet_tracker = InMemoryTracker()
    with Trackers(quiet_tracker, LocalTracker(folder / "quiet")) as tracker:
        quiet = run(tracker=tracker)
    batch = next(iter(data.val(Partition())))
    expected = {}
    for step in EVENTS:
        state = watched if step == STEPS else run(steps=step)
        key = preview_key(evaluation_key(KEY, step))
        params = generation_params(objective, state)
        expected[step] = objective.preview(params, batch, key)
    return types.SimpleNamespace(
        name=name,
        objective=objective,
        folder=folder,
        trackers=trackers,
        watched=watched,
        alone=alone,
        quiet=quiet,
        quiet_tracker=quiet_tracker,
        batch=batch,
        shown_as=shown_as,
        shown={step: preview.artifact for step, preview in trackers["memory"].artifacts[shown_as]},
        previews=dict(trackers["memory"].artifacts[shown_as]),
        expected=expected,
    )


def _needs(extra):
    if not EXTRAS[extra]:
        pytest.skip(f"{extra} is not installed")


# -- what the previews hold ---------------------------------------------------------------


@pytest.mark.slow
def test_one_preview_per_evaluation_event_holding_the_fits_samples(fit):
    shown = fit.trackers["memory"].artifacts[fit.shown_as]
    assert [step for step, _ in shown] == EVENTS
    for step, preview in shown:
        # Logged with what names the rows: the data's class names (shapes sets them).
        assert (preview.classes, preview.tokenizer) == (SHAPE_KINDS, None)
        artifact, expected = preview.artifact, fit.expected[step]
        assert type(artifact) is KINDS[fit.name]
        if fit.name == "jepa":  # the scoring artifact of the first batch: one row each
            rows = fit.batch["images"].shape[0]
            assert artifact.features.shape == (rows, WIDTH)
            np.testing.assert_allclose(artifact.features, expected.features, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(artifact.labels, fit.batch["labels"])
            continue
        # At most four samples, from the first rows of the first validation batch.
        real = fit.batch[fit.objective.field]
        rows = min(PREVIEW_ROWS, real.shape[0])
        assert real.shape[0] > rows == 4
        assert artifact.generated.shape == real[:rows].shape
        np.testing.assert_array_equal(artifact.reference, real[:rows])
        np.testing.assert_array_equal(artifact.labels, fit.batch["labels"][:rows])
        np.testing.assert_array_equal(artifact.generated, expected.generated)
    # Each event previews its own params: the samples change between the events.
    if fit.name != "jepa":
        first, last = (preview.artifact.generated for _, preview in shown)
        assert not np.array_equal(first, last)


@pytest.mark.slow
def test_a_fit_without_preview_true_previews_nothing(fit):
    assert fit.shown_as not in fit.quiet_tracker.artifacts
    assert read_journal(fit.folder / "quiet").artifacts == []
    assert not (fit.folder / "quiet" / "previews").exists()
    # The fit did evaluate: its scores reached the tracker.
    tags = fit.quiet_tracker.scalars
    assert any(tag.startswith(f"{fit.objective.name}/validation/") for tag in tags)


@pytest.mark.slow
def test_a_tracker_with_previews_changes_no_draw(fit):
    for state in (fit.watched, fit.quiet):
        for got, want in zip(
            jax.tree.leaves((state.params, state.ema_params)),
            jax.tree.leaves((fit.alone.params, fit.alone.ema_params)),
            strict=True,
        ):
            np.testing.assert_array_equal(got, want)
        assert state.metric_history == fit.alone.metric_history
    scores = [tag for tag in fit.alone.metric_history if "/validation/" in tag]
    assert scores and all(len(fit.alone.metric_history[tag]) == len(EVENTS) for tag in scores)


# -- decoding -----------------------------------------------------------------------------


def _check_media(fit, step, contents):
    """`contents`: the encoded files of one event's preview: one grid, the generated rows
    above the real ones, each captioned with its class name."""
    (content,) = contents
    artifact = fit.shown[step]
    lines = [("generated", uint8(artifact.generated)), ("real", uint8(artifact.reference))]
    captions = [SHAPE_KINDS[label] for label in np.asarray(artifact.labels)]
    if fit.name == "images":
        check_png_grid(content, lines, captions)
    else:
        assert check_gif_grid(content, lines, captions) == artifact.generated.shape[1]


def _check_spread(fit, step, counts, edges):
    """`counts` and bin `edges` of one event's histogram (TensorBoard keeps the upper
    edges only: `edges` may lack the first)."""
    expected = histogram(fit.shown[step].features)
    assert sum(counts) == expected["dimensions"] == WIDTH
    assert list(counts) == expected["counts"]
    np.testing.assert_allclose(edges, expected["edges"][-len(edges) :], rtol=1e-5)
    assert len(edges) >= len(counts)


def _parts(fit):
    """The last segments of one event's preview tags and files: the grid's, or the
    histogram's."""
    if fit.name == "jepa":
        return ["spread"], ["histogram.json"]
    return ["grid"], ["grid.png" if fit.name == "images" else "grid.gif"]


# -- each tracker's own reader ------------------------------------------------------------


@pytest.mark.slow
def test_local_previews_are_png_gif_and_json_files_pillow_decodes(fit):
    folder = fit.folder / "local"
    found = [(step, files) for name, step, files in read_journal(folder).artifacts]
    assert [step for step, _ in found] == EVENTS
    assert all(name == fit.shown_as for name, _, _ in read_journal(folder).artifacts)
    for step, files in found:
        if fit.name == "jepa":
            assert files == [f"previews/{fit.shown_as}/{step}/histogram.json"]
            summary = json.loads((folder / files[0]).read_text())
            assert summary == histogram(fit.shown[step].features)
            _check_spread(fit, step, summary["counts"], summary["edges"])
            continue
        assert files == [f"previews/{fit.shown_as}/{step}/{name}" for name in _parts(fit)[1]]
        _check_media(fit, step, [(folder / file).read_bytes() for file in files])


@pytest.mark.slow
def test_tensorboard_previews_are_image_summaries_and_a_histogram(fit):
    _needs("tensorboard")
    from test_tracking_tensorboard import _accumulator

    events = _accumulator(fit.folder / "events")
    if fit.name == "jepa":
        assert events.Tags()["images"] == []
        assert events.Tags()["histograms"] == [f"{fit.shown_as}/spread"]
        histograms = events.Histograms(f"{fit.shown_as}/spread")
        assert [event.step for event in histograms] == EVENTS
        for event in histograms:
            histo = event.histogram_value
            _check_spread(fit, event.step, histo.bucket, histo.bucket_limit)
        return
    tags = [f"{fit.shown_as}/{part}" for part in _parts(fit)[0]]
    assert sorted(events.Tags()["images"]) == tags
    by_step = {step: [] for step in EVENTS}
    for tag in tags:
        images = events.Images(tag)
        assert [image.step for image in images] == EVENTS
        for image in images:
            size = Image.open(io.BytesIO(image.encoded_image_string)).size
            assert (image.width, image.height) == size
            by_step[image.step].append(image.encoded_image_string)
    for step, contents in by_step.items():
        _check_media(fit, step, contents)


@pytest.mark.slow
def test_mlflow_previews_are_the_files_its_client_downloads(fit, tmp_path, monkeypatch):
    _needs("mlflow")
    from test_tracking_mlflow import _download, _files

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the client reads a file store
    tracker = fit.trackers["mlflow"]
    stored = _files(tracker, "previews")
    names = _parts(fit)[1]
    folder = f"previews/{fit.shown_as}"
    assert stored == sorted(f"{folder}/{step}/{name}" for step in EVENTS for name in names)
    for step in EVENTS:
        paths = [f"{folder}/{step}/{name}" for name in names]
        contents = [_download(tracker, path, tmp_path / str(step)).read_bytes() for path in paths]
        if fit.name == "jepa":
            summary = json.loads(contents[0])
            _check_spread(fit, step, summary["counts"], summary["edges"])
        else:
            _check_media(fit, step, contents)


@pytest.mark.slow
def test_wandb_previews_are_media_files_and_a_histogram_in_the_offline_run(fit):
    _needs("wandb")
    from test_tracking_wandb import _media, _read

    read = _read(fit.trackers["wandb"])
    keys = [f"{fit.shown_as}/{part}" for part in _parts(fit)[0]]
    assert sorted(step for step, row in read.rows.items() if keys[0] in row) == EVENTS
    for step in EVENTS:
        items = [read.rows[step][key] for key in keys]
        if fit.name == "jepa":
            (spread,) = items
            assert spread["_type"] == "histogram"
            _check_spread(fit, step, spread["values"], spread["bins"])
            continue
        kind = "image-file" if fit.name == "images" else "video-file"
        assert all(item["_type"] == kind for item in items)
        _check_media(fit, step, [_media(read, item) for item in items])


# -- channels a preview shows -------------------------------------------------------------


@pytest.mark.slow
def test_an_rgba_clip_models_previews_reach_the_trackers_as_gifs_of_their_colours(tmp_path):
    """A `DiT` over 4-channel (RGBA) clips trains like any other, and its previews reach
    the trackers as an animated grid of their RGB. Before the GIF encoder dropped the alpha
    channel, the first evaluation event of a fit with `preview=True` raised in every tracker
    ("a GIF needs frames shaped (frames, height, width, 1|3)") and ended the fit. The
    preview is the objective's own, logged as the trainer logs it (a fit would add seconds
    of compiling and nothing the cases above do not check)."""
    model = DiT(16, 4, 4, width=WIDTH, depth=1, heads=2, frames=2, key=jax.random.key(1))
    objective = DiffusionObjective(model, sampling=Sampling(steps=1))
    batch = {"clips": np.random.default_rng(0).random((4, 2, 16, 16, 4)).astype(np.float32)}
    shown = objective.preview(objective.init_params(), batch, KEY)
    trackers = [LocalTracker(tmp_path / "local")]
    if EXTRAS["tensorboard"]:
        from dew.tracking.tensorboard import TensorBoardTracker

        trackers.append(TensorBoardTracker(tmp_path / "events"))
    with Trackers(*trackers) as tracker:
        tracker.log_artifact("diffusion/validation/samples", shown, step=1)
    assert isinstance(shown, Clips) and shown.generated.shape == (4, 2, 16, 16, 4)
    assert shown.labels is None  # an unconditional model: no captions
    lines = [("generated", uint8(shown.generated)), ("real", uint8(shown.reference))]
    ((_, _, files),) = read_journal(tmp_path / "local").artifacts
    assert files == ["previews/diffusion/validation/samples/1/grid.gif"]
    check_gif_grid((tmp_path / "local" / files[0]).read_bytes(), lines, None)
    if EXTRAS["tensorboard"]:
        from test_tracking_tensorboard import _accumulator

        events = _accumulator(tmp_path / "events")
        (image,) = events.Images("diffusion/validation/samples/grid")
        check_gif_grid(image.encoded_image_string, lines, None)
