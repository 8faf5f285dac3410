"""LocalTracker: journals, torn lines, run.json, previews decoded by Pillow, plots."""

import io
import json
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from dew.artifacts import Clips, Images, Representations, TokenRows, TokenScores
from dew.telemetry.records import FitEnded, RunRecord
from dew.tracking import LocalTracker, read_journal
from dew.tracking._render import _palette_indices, histogram, to_uint8

Image = pytest.importorskip("PIL.Image")


def test_scalars_round_trip_with_non_finite_values_written_as_strings(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 2.0, "lm/validation/psnr": float("inf")}, step=0)
        tracker.log_metrics({"lm/train/loss": float("nan"), "lm/validation/psnr": -np.inf}, step=5)
        tracker.log_metrics({"lm/train/loss": np.float32(0.5), "lm/train/count": 3}, step=10)
    lines = (tmp_path / "scalars.jsonl").read_text().splitlines()
    assert json.loads(lines[1]) == {
        "step": 5,
        "values": {"lm/train/loss": "NaN", "lm/validation/psnr": "-Inf"},
    }
    scalars = read_journal(tmp_path).scalars
    assert scalars["lm/validation/psnr"] == [(0, float("inf")), (5, float("-inf"))]
    loss = scalars["lm/train/loss"]
    assert [step for step, _ in loss] == [0, 5, 10]
    assert np.isnan(loss[1][1])
    assert loss[2][1] == 0.5
    assert scalars["lm/train/count"] == [(10, 3.0)]


def test_every_report_is_flushed_before_log_metrics_returns(tmp_path):
    tracker = LocalTracker(tmp_path)
    tracker.log_metrics({"lm/train/loss": 1.0}, step=1)
    assert read_journal(tmp_path).scalars == {"lm/train/loss": [(1, 1.0)]}
    tracker.log_artifact("fit_ended", FitEnded(status="completed", step=1), step=1)
    assert read_journal(tmp_path).records[0][2] == FitEnded(status="completed", step=1)
    tracker.close()


def test_a_torn_last_line_is_skipped_with_a_warning_and_loses_nothing_before_it(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        for step in range(3):
            tracker.log_metrics({"lm/train/loss": float(step)}, step=step)
    with (tmp_path / "scalars.jsonl").open("a") as journal:
        journal.write('{"step": 3, "values": {"lm/tr')
    with pytest.warns(UserWarning, match="skipped a torn last line"):
        journal = read_journal(tmp_path)
    assert journal.scalars["lm/train/loss"] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_reopening_cuts_a_torn_tail_and_appends(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    with (tmp_path / "scalars.jsonl").open("a") as journal:
        journal.write('{"step": 1, "val')
    with pytest.warns(UserWarning, match="ended in a torn line"), LocalTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 0.5}, step=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_journal(tmp_path).scalars == {"lm/train/loss": [(0, 1.0), (2, 0.5)]}


def test_a_malformed_line_in_the_middle_raises_naming_it(tmp_path):
    (tmp_path / "scalars.jsonl").write_text(
        '{"step": 0, "values": {}}\nnot json\n{"step": 1, "values": {}}\n'
    )
    with pytest.raises(ValueError, match=r"scalars\.jsonl: line 2 is not valid JSON"):
        read_journal(tmp_path)


def test_run_json_is_written_once_and_never_overwritten(tmp_path):
    first = RunRecord(model={"name": "a"}, data={}, optimizer={"learning_rate": 0.1})
    second = RunRecord(model={"name": "b"}, data={}, optimizer={"learning_rate": 0.2})
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("run_record", first)
        tracker.log_artifact("run_record", second)
    assert json.loads((tmp_path / "run.json").read_text())["model"] == {"name": "a"}
    existing = tmp_path / "recipe"
    existing.mkdir()
    (existing / "run.json").write_text('{"written": "by a recipe"}\n')
    with LocalTracker(existing) as tracker:
        tracker.log_artifact("run_record", first)
    assert (existing / "run.json").read_text() == '{"written": "by a recipe"}\n'
    assert [record for _, _, record in read_journal(existing).records] == [first]


def test_params_are_flattened_merged_and_kept_across_reopening(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_params({"optimizer": {"name": "adam", "betas": (0.9, 0.99)}})
        tracker.log_params({"data": {"train": {"batch_size": 8}}, "optimizer": {"name": "sgd"}})
        with pytest.raises(ValueError, match="parameter key 'a/b' may not contain '/'"):
            tracker.log_params({"a/b": 1})
    with LocalTracker(tmp_path) as tracker:
        tracker.log_params({"seed": 0})
    assert read_journal(tmp_path).params == {
        "optimizer/name": "sgd",
        "optimizer/betas": [0.9, 0.99],
        "data/train/batch_size": 8,
        "seed": 0,
    }


def test_image_previews_are_pngs_of_each_generated_row(tmp_path):
    rng = np.random.default_rng(0)
    generated = rng.random((3, 6, 5, 3)).astype(np.float32)
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("samples", Images(jnp.asarray(generated)), step=7)
    ((name, step, files),) = read_journal(tmp_path).artifacts
    assert (name, step) == ("samples", 7)
    assert files == [f"previews/samples/7/{i}.png" for i in range(3)]
    for index, file in enumerate(files):
        decoded = np.asarray(Image.open(tmp_path / file))
        np.testing.assert_array_equal(decoded, to_uint8(generated[index]))


def test_clip_previews_are_animated_gifs_with_every_frame(tmp_path):
    rng = np.random.default_rng(1)
    videos = rng.random((2, 4, 9, 7, 3)).astype(np.float32)
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("clips", Clips(jnp.asarray(videos)), step=1)
    files = read_journal(tmp_path).artifacts[0][2]
    assert files == ["previews/clips/1/0.gif", "previews/clips/1/1.gif"]
    for index, file in enumerate(files):
        gif = Image.open(tmp_path / file)
        assert gif.n_frames == 4
        indices, palette = _palette_indices(to_uint8(videos[index]))
        colours = np.frombuffer(palette, np.uint8).reshape(-1, 3)
        for frame in range(4):
            gif.seek(frame)
            np.testing.assert_array_equal(np.asarray(gif.convert("RGB")), colours[indices[frame]])


def test_token_rows_and_representation_previews_are_json(tmp_path):
    tokens = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    features = np.random.default_rng(2).standard_normal((10, 4)).astype(np.float32)
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("text", TokenRows(jnp.asarray(tokens)), step=2)
        tracker.log_artifact("features", Representations(jnp.asarray(features)), step=2)
    files = {name: files for name, _, files in read_journal(tmp_path).artifacts}
    rows = json.loads((tmp_path / files["text"][0]).read_text())
    assert rows == {"tokens": tokens.tolist()}
    spread = json.loads((tmp_path / files["features"][0]).read_text())
    counts, edges = np.histogram(np.std(features.astype(np.float64), axis=0), bins=30)
    assert spread["counts"] == counts.tolist()
    np.testing.assert_allclose(spread["edges"], edges)
    assert histogram(features)["dimensions"] == 4


def test_token_scores_have_no_preview_form(tmp_path):
    scores = TokenScores(jnp.ones((1, 2)), jnp.ones((1, 2)))
    with LocalTracker(tmp_path) as tracker, pytest.raises(TypeError, match="TokenScores has no"):
        tracker.log_artifact("scores", scores, step=0)


def test_plain_values_are_journalled_and_unjsonable_ones_raise(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("notes", {"text": "three epochs", "score": float("nan")})
        with pytest.raises(TypeError, match="cannot journal artifact 'bad': object is not"):
            tracker.log_artifact("bad", object())
    ((name, step, value),) = read_journal(tmp_path).artifacts
    assert (name, step, value["text"]) == ("notes", None, "three epochs")
    assert np.isnan(value["score"])


def test_a_closed_tracker_refuses_reports(tmp_path):
    tracker = LocalTracker(tmp_path)
    tracker.close()
    tracker.close()  # closing twice is harmless
    with pytest.raises(RuntimeError, match="is closed; it records nothing more"):
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)


def test_plots_render_on_close_only_one_png_per_bare_metric(tmp_path):
    pytest.importorskip("matplotlib")
    tracker = LocalTracker(tmp_path, plots=True)
    for step in range(4):
        tracker.log_metrics(
            {
                "lm/train/loss": 1.0 / (step + 1),
                "lm/validation/loss": float("nan") if step == 2 else 2.0 / (step + 1),
                "dpo/train/loss": 0.7,
                "lm/validation/psnr": float("inf") if step == 1 else 20.0,
            },
            step=step,
        )
    assert not (tmp_path / "plots").exists()  # nothing is drawn during log steps
    tracker.close()
    plots = sorted(path.name for path in (tmp_path / "plots").iterdir())
    assert plots == ["loss.png", "psnr.png"]
    for name in plots:
        image = Image.open(tmp_path / "plots" / name)
        assert image.format == "PNG"
        assert image.size == (640, 400)


def test_plot_on_demand(tmp_path):
    pytest.importorskip("matplotlib")
    with LocalTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
        written = tracker.plot()
    assert [path.name for path in written] == ["loss.png"]
    assert Image.open(io.BytesIO(written[0].read_bytes())).format == "PNG"
