"""TensorBoardTracker: every kind of report read back with TensorBoard's own readers."""

import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from _grids import check_gif_grid, check_png_grid, uint8

from dew.artifacts import Artifact, Clips, Images, Representations, TokenRows, TokenScores
from dew.data.tokenizers import BytesTokenizer
from dew.naming import Split, preview_name
from dew.telemetry.records import (
    FitEnded,
    FitStarted,
    RunRecord,
    TrialFinished,
    record_from_json,
)
from dew.tracking import LocalTracker, Preview, Trackers, read_journal
from dew.tracking._render import histogram
from dew.tracking.tensorboard import TensorBoardTracker

pytest.importorskip("tensorboard")
Image = pytest.importorskip("PIL.Image")

from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import (  # noqa: E402
    LegacyEventFileLoader,
)
from tensorboard.plugins.hparams import metadata as hparams_metadata  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402


def _accumulator(logdir):
    events = event_accumulator.EventAccumulator(
        str(logdir), size_guidance=event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE
    )
    events.Reload()
    return events


def _event_file(logdir):
    (path,) = logdir.iterdir()
    assert path.name.startswith("events.out.tfevents."), path.name
    return path


def _summary_events(logdir):
    """The summary events of the one event file, as written (not migrated)."""
    loader = LegacyEventFileLoader(str(_event_file(logdir)))
    return [event for event in loader.Load() if event.HasField("summary")]


def _texts(events, tag):
    """(step, text or array of texts) of every text summary under `tag`."""
    texts = []
    for event in events.Tensors(tag):
        array = tensor_util.make_ndarray(event.tensor_proto)
        decoded = array.item().decode() if array.shape == () else [v.decode() for v in array]
        texts.append((event.step, decoded))
    return texts


def test_scalars_round_trip_with_steps_and_non_finite_values(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 2.0, "lm/validation/psnr": float("inf")}, step=0)
        tracker.log_metrics({"lm/train/loss": float("nan"), "lm/validation/psnr": -np.inf}, step=5)
        tracker.log_metrics(
            {"lm/train/loss": np.float32(0.25), "lm/train/count": 3, "lm/train/ok": jnp.array(1.5)},
            step=10,
        )
    events = _accumulator(tmp_path)
    assert sorted(events.Tags()["scalars"]) == [
        "lm/train/count",
        "lm/train/loss",
        "lm/train/ok",
        "lm/validation/psnr",
    ]
    loss = [(e.step, e.value) for e in events.Scalars("lm/train/loss")]
    assert [step for step, _ in loss] == [0, 5, 10]
    assert loss[0][1] == 2.0
    assert math.isnan(loss[1][1])
    assert loss[2][1] == 0.25
    psnr = [(e.step, e.value) for e in events.Scalars("lm/validation/psnr")]
    assert psnr == [(0, math.inf), (5, -math.inf)]
    assert [(e.step, e.value) for e in events.Scalars("lm/train/count")] == [(10, 3.0)]
    assert [(e.step, e.value) for e in events.Scalars("lm/train/ok")] == [(10, 1.5)]
    assert set(events.PluginTagToContent("scalars")) == set(events.Tags()["scalars"])


def test_scalars_are_float32_as_tensorboard_stores_them(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 0.1}, step=1)
    (event,) = _accumulator(tmp_path).Scalars("lm/train/loss")
    assert event.value == pytest.approx(0.1, rel=1e-7)
    assert np.float32(event.value) == np.float32(0.1)


def test_one_event_per_report_and_plugin_metadata_only_on_a_tags_first_value(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        for step in range(3):
            tracker.log_metrics({"lm/train/loss": 1.0, "lm/train/accuracy": 0.5}, step=step)
    events = _summary_events(tmp_path)
    assert [event.step for event in events] == [0, 1, 2]
    for index, event in enumerate(events):
        layout = ["custom_scalars__config__"] if index == 0 else []  # new tags: a new layout
        assert [value.tag for value in event.summary.value] == [
            "lm/train/loss",
            "lm/train/accuracy",
            *layout,
        ]
        plugins = {value.metadata.plugin_data.plugin_name for value in event.summary.value}
        assert plugins == ({"scalars", "custom_scalars"} if index == 0 else {""})


def test_params_become_a_markdown_table_and_hparams_with_unstorable_values_as_strings(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_params(
            {
                "optimizer": {"name": "adam", "learning_rate": 1e-3, "betas": (0.9, 0.99)},
                "data": {"train": {"batch_size": np.int64(32), "shuffle": True}},
            }
        )
        tracker.log_params({"seed": 0, "schedule": None, "layers": [64, 32]})
        tracker.log_metrics({"supervised/train/loss": 1.0}, step=0)
        tracker.log_params({"late": "only in the table"})
    events = _accumulator(tmp_path)
    texts = _texts(events, "params")
    assert [step for step, _ in texts] == [0, 0, 0]
    last = texts[-1][1].splitlines()
    assert last[:2] == ["| parameter | value |", "| --- | --- |"]
    assert last[2:] == [
        "| optimizer/name | adam |",
        "| optimizer/learning_rate | 0.001 |",
        "| optimizer/betas | (0.9, 0.99) |",
        "| data/train/batch_size | 32 |",
        "| data/train/shuffle | True |",
        "| seed | 0 |",
        "| schedule | None |",
        "| layers | [64, 32] |",
        "| late | only in the table |",
    ]
    content = events.PluginTagToContent("hparams")[hparams_metadata.SESSION_START_INFO_TAG]
    info = hparams_metadata.parse_session_start_info_plugin_data(content)
    hparams = {name: value.WhichOneof("kind") for name, value in info.hparams.items()}
    assert hparams == {
        "optimizer/name": "string_value",
        "optimizer/learning_rate": "number_value",
        "optimizer/betas": "string_value",
        "data/train/batch_size": "number_value",
        "data/train/shuffle": "bool_value",
        "seed": "number_value",
        "schedule": "string_value",
        "layers": "string_value",
    }
    assert info.hparams["optimizer/name"].string_value == "adam"
    assert info.hparams["optimizer/learning_rate"].number_value == 1e-3
    assert info.hparams["optimizer/betas"].string_value == "(0.9, 0.99)"
    assert info.hparams["data/train/batch_size"].number_value == 32
    assert info.hparams["data/train/shuffle"].bool_value is True
    assert info.hparams["schedule"].string_value == "None"
    assert info.hparams["layers"].string_value == "[64, 32]"
    assert info.group_name  # TensorBoard's own hash of the hyperparameters


def test_hparams_are_written_at_close_when_nothing_else_was_reported(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_params({"optimizer": {"name": "sgd"}})
    content = _accumulator(tmp_path).PluginTagToContent("hparams")
    info = hparams_metadata.parse_session_start_info_plugin_data(
        content[hparams_metadata.SESSION_START_INFO_TAG]
    )
    assert info.hparams["optimizer/name"].string_value == "sgd"


def test_markdown_table_cells_escape_pipes_and_newlines(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_params({"note": "a|b\nc"})
    ((_, table),) = _texts(_accumulator(tmp_path), "params")
    assert table.splitlines()[-1] == "| note | a\\|b c |"


def test_bad_parameter_keys_raise_before_anything_is_written(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        with pytest.raises(ValueError, match="parameter key 'a/b' may not contain '/'"):
            tracker.log_params({"a/b": 1})
        with pytest.raises(ValueError, match="may not be empty"):
            tracker.log_params({"optimizer": {"": 1}})
    events = _accumulator(tmp_path)
    assert events.Tags()["tensors"] == []


def test_records_are_text_summaries_under_reporting_type_holding_their_json(tmp_path):
    run = RunRecord(model={"name": "mlp", "widths": [64, 32]}, data={}, optim={"lr": 0.1})
    started = FitStarted(stage="lm", start_step=0, steps=20)
    trials = [
        TrialFinished(trial=0, overrides={"optim.lr": 0.01}, value=float("inf")),
        TrialFinished(trial=1, overrides={"optim.lr": 0.1}, value=0.5),
    ]
    ended = FitEnded(status="failed", step=20, error="ValueError: boom")
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_artifact("run_record", run)
        tracker.log_artifact("fit_started", started, step=0)
        tracker.log_artifact("trial", trials[0], step=1)
        tracker.log_artifact("trial", trials[1], step=2)
        tracker.log_artifact("fit_ended", ended, step=20)
    events = _accumulator(tmp_path)
    assert sorted(events.PluginTagToContent("text")) == [
        "reporting/fit_ended",
        "reporting/fit_started",
        "reporting/run_record",
        "reporting/trial_finished",
    ]
    read = {
        tag: [(step, record_from_json(text)) for step, text in _texts(events, tag)]
        for tag in events.PluginTagToContent("text")
    }
    assert read["reporting/run_record"] == [(0, run)]
    assert read["reporting/fit_started"] == [(0, started)]
    assert read["reporting/trial_finished"] == [(1, trials[0]), (2, trials[1])]
    assert read["reporting/fit_ended"] == [(20, ended)]
    assert _texts(events, "reporting/fit_ended")[0][1] == ended.to_json()


def test_images_are_one_labelled_grid_png_per_event(tmp_path):
    rng = np.random.default_rng(0)
    rgb, real = rng.random((2, 3, 6, 5, 3)).astype(np.float32)
    gray = rng.random((2, 4, 7, 1)).astype(np.float32)
    labelled = Images(jnp.asarray(rgb), jnp.asarray(real), labels=jnp.asarray([2, 0, 1]))
    with TensorBoardTracker(tmp_path) as tracker:
        shown = Preview(labelled, classes=("square", "disc", "bar"))
        tracker.log_artifact("diffusion/validation/samples", shown, step=7)
        tracker.log_artifact("diffusion/validation/samples", Images(jnp.asarray(gray)), step=9)
    events = _accumulator(tmp_path)
    assert events.Tags()["images"] == ["diffusion/validation/samples/grid"]
    first, second = events.Images("diffusion/validation/samples/grid")
    assert (first.step, second.step) == (7, 9)
    lines = [("generated", uint8(rgb)), ("real", uint8(real))]
    pixels = check_png_grid(first.encoded_image_string, lines, ["bar", "square", "disc"])
    assert (first.height, first.width) == pixels.shape[:2]
    pixels = check_png_grid(second.encoded_image_string, [("generated", uint8(gray))], None)
    assert (second.height, second.width) == pixels.shape[:2]
    assert set(events.PluginTagToContent("images")) == set(events.Tags()["images"])


def test_clips_are_one_animated_grid_gif_with_every_frame(tmp_path):
    rng = np.random.default_rng(1)
    videos = rng.random((2, 4, 9, 7, 3)).astype(np.float32)
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_artifact("diffusion/validation/clips", Clips(jnp.asarray(videos)), step=3)
    events = _accumulator(tmp_path)
    assert events.Tags()["images"] == ["diffusion/validation/clips/grid"]
    (image,) = events.Images("diffusion/validation/clips/grid")
    assert image.step == 3
    assert check_gif_grid(image.encoded_image_string, [("generated", uint8(videos))], None) == 4


def test_representations_become_a_histogram_of_their_per_dimension_spread(tmp_path):
    features = np.random.default_rng(2).standard_normal((50, 24)).astype(np.float32)
    features *= np.linspace(0.1, 3.0, 24, dtype=np.float32)
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_artifact(
            "jepa/validation/features", Representations(jnp.asarray(features)), step=4
        )
    events = _accumulator(tmp_path)
    assert events.Tags()["histograms"] == ["jepa/validation/features/spread"]
    (event,) = events.Histograms("jepa/validation/features/spread")
    histo = event.histogram_value
    expected = histogram(features)
    assert event.step == 4
    assert sum(histo.bucket) == 24 == histo.num
    assert histo.bucket == expected["counts"]
    np.testing.assert_allclose(histo.bucket_limit, expected["edges"][1:])
    spread = np.std(features.astype(np.float64), axis=0)
    assert histo.min == pytest.approx(spread.min())
    assert histo.max == pytest.approx(spread.max())
    assert histo.sum == pytest.approx(spread.sum())
    assert list(events.PluginTagToContent("histograms")) == ["jepa/validation/features/spread"]


def test_token_rows_become_a_text_table_of_generated_tokens_and_their_text(tmp_path):
    tokens = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    mask = np.array([[True, True, False], [False, True, True]])
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_artifact("lm/validation/text", TokenRows(jnp.asarray(tokens)), step=2)
        tracker.log_artifact(
            "lm/validation/text", TokenRows(jnp.asarray(tokens), jnp.asarray(mask)), step=3
        )
    events = _accumulator(tmp_path)
    texts = _texts(events, "lm/validation/text/tokens")
    assert texts == [(2, ["1 2 3", "4 5 6"]), (3, ["1 2", "5 6"])]
    pages = _texts(events, "lm/validation/text/text")
    assert [step for step, _ in pages] == [2, 3]
    assert "~~~text\n4 ⟨|⟩ 5 6\n~~~" in pages[1][1]  # the row's prompt, then what was generated


def test_decoded_text_reads_back_as_the_tokenizers_decode_of_the_ids(tmp_path):
    tokenizer = BytesTokenizer()
    texts = ["Once upon a time", "In a hole in the"]
    tokens = np.array([tokenizer.encode(text) for text in texts], np.int32)
    mask = np.broadcast_to(np.arange(tokens.shape[1]) >= 5, tokens.shape)
    shown = Preview(TokenRows(jnp.asarray(tokens), jnp.asarray(mask)), tokenizer=tokenizer)
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_artifact("lm/validation/samples", shown, step=4)
    ((step, page),) = _texts(_accumulator(tmp_path), "lm/validation/samples/text")
    assert step == 4
    for row in tokens:
        prompt, continuation = tokenizer.decode(row[:5]), tokenizer.decode(row[5:])
        assert f"~~~text\n{prompt}⟨|⟩{continuation}\n~~~" in page


def test_token_scores_have_no_summary_form(tmp_path):
    scores = TokenScores(jnp.ones((1, 2)), jnp.ones((1, 2)))
    with TensorBoardTracker(tmp_path) as tracker, pytest.raises(TypeError, match="TokenScores has"):
        tracker.log_artifact("scores", scores, step=0)
    assert _summary_events(tmp_path) == []


def test_an_artifact_type_without_a_summary_form_raises_naming_it(tmp_path):
    class Masks(Artifact):
        values: jax.Array

    masks = Masks(jnp.ones((2, 3)))
    message = "no summary form for Masks artifact 'masks'"
    with TensorBoardTracker(tmp_path) as tracker, pytest.raises(TypeError, match=message):
        tracker.log_artifact("masks", masks, step=0)


def test_plain_values_are_text_under_artifacts_name(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_artifact("notes", "three epochs of SGD")
        tracker.log_artifact("summary", {"score": float("nan"), "rows": (1, 2)}, step=4)
        tracker.log_artifact("thing", object(), step=5)
    events = _accumulator(tmp_path)
    assert _texts(events, "artifacts/notes") == [(0, "three epochs of SGD")]
    ((step, text),) = _texts(events, "artifacts/summary")
    assert step == 4
    assert json.loads(text) == {"rows": [1, 2], "score": "NaN"}
    ((_, text),) = _texts(events, "artifacts/thing")
    assert text.startswith("<object object at")


def test_two_stages_previews_keep_their_own_tags(tmp_path):
    rng = np.random.default_rng(5)
    shown = {stage: rng.random((2, 4, 4, 3)).astype(np.float32) for stage in ("pre", "tune")}
    with TensorBoardTracker(tmp_path) as tracker:
        for stage, generated in shown.items():  # both at step 5, as two fits' own steps are
            name = preview_name(stage, Split.VALIDATION, "samples")
            tracker.log_artifact(name, Images(jnp.asarray(generated)), step=5)
    events = _accumulator(tmp_path)
    assert sorted(events.Tags()["images"]) == [
        f"{stage}/validation/samples/grid" for stage in ("pre", "tune")
    ]
    for stage, generated in shown.items():
        (image,) = events.Images(f"{stage}/validation/samples/grid")
        check_png_grid(image.encoded_image_string, [("generated", uint8(generated))], None)


def test_a_preview_under_a_bare_name_is_refused_before_anything_is_written(tmp_path):
    message = "a preview's name is stage/split/name, got 'x'"
    with TensorBoardTracker(tmp_path) as tracker, pytest.raises(ValueError, match=message):
        tracker.log_artifact("x", Images(jnp.ones((1, 2, 2, 1))), step=1)
    assert _summary_events(tmp_path) == []


def test_artifact_names_must_be_tag_segments(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        with pytest.raises(ValueError, match="artifact name 'a/b' may not contain '/'"):
            tracker.log_artifact("a/b", "text")
        with pytest.raises(ValueError, match="artifact name may not be empty"):
            tracker.log_artifact("", FitEnded(status="completed", step=1))
        with rejects(TypeError, "artifact name must be a string", parameter="name"):
            tracker.log_artifact(3, "text")
    assert _summary_events(tmp_path) == []


def test_bad_steps_and_metric_values_raise_clearly(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        with pytest.raises(ValueError, match="step must be an integer >= 0, got -1"):
            tracker.log_metrics({"lm/train/loss": 1.0}, step=-1)
        with rejects(TypeError, "step must be an integer", parameter="step"):
            tracker.log_metrics({"lm/train/loss": 1.0}, step=1.5)
        with rejects(TypeError, "step must be an integer", parameter="step"):
            tracker.log_artifact("notes", "x", step="3")
        with pytest.raises(TypeError, match="metric 'lm/train/loss' must be a real scalar"):
            tracker.log_metrics({"lm/train/loss": np.ones(3)}, step=0)
        with pytest.raises(TypeError, match="metric 'lm/train/loss' must be a real scalar"):
            tracker.log_metrics({"lm/train/loss": "1.0"}, step=0)
        with pytest.raises(ValueError, match="metric tags must be non-empty strings"):
            tracker.log_metrics({"": 1.0}, step=0)
    assert _summary_events(tmp_path) == []


def test_every_kind_goes_to_one_event_file_flushed_before_each_call_returns(tmp_path):
    tracker = TensorBoardTracker(tmp_path)
    tracker.log_params({"seed": 0})
    tracker.log_metrics({"lm/train/loss": 1.0}, step=1)
    assert [e.value for e in _accumulator(tmp_path).Scalars("lm/train/loss")] == [1.0]
    tracker.log_artifact("fit_ended", FitEnded(status="completed", step=1), step=1)
    tracker.log_artifact("diffusion/validation/samples", Images(jnp.ones((2, 3, 3, 3))), step=1)
    tracker.log_artifact("diffusion/validation/clips", Clips(jnp.ones((1, 2, 3, 3, 1))), step=2)
    tracker.log_artifact("jepa/validation/features", Representations(jnp.ones((4, 3))), step=1)
    tracker.log_artifact("lm/validation/text", TokenRows(jnp.ones((1, 2), jnp.int32)), step=1)
    tracker.log_artifact("notes", "done")
    tags = _accumulator(tmp_path).Tags()
    assert sorted(tags["tensors"]) == [
        "_hparams_/session_start_info",
        "artifacts/notes",
        "custom_scalars__config__",
        "lm/validation/text/text",
        "lm/validation/text/tokens",
        "params",
        "reporting/fit_ended",
    ]
    assert sorted(tags["images"]) == [
        "diffusion/validation/clips/grid",
        "diffusion/validation/samples/grid",
    ]
    assert tags["histograms"] == ["jepa/validation/features/spread"]
    tracker.close()
    assert len(list(tmp_path.iterdir())) == 1
    _event_file(tmp_path)


def test_a_closed_tracker_refuses_reports_and_closing_twice_is_harmless(tmp_path):
    tracker = TensorBoardTracker(tmp_path)
    tracker.close()
    tracker.close()
    assert tracker.closed
    with pytest.raises(RuntimeError, match="is closed; it records nothing more"):
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    with pytest.raises(RuntimeError, match="is closed"):
        tracker.log_params({"seed": 0})
    with pytest.raises(RuntimeError, match="is closed"):
        tracker.log_artifact("notes", "x")


def test_the_context_manager_closes_the_writer(tmp_path, monkeypatch):
    with TensorBoardTracker(tmp_path) as tracker:
        closes = []
        close = tracker._writer.close
        monkeypatch.setattr(tracker._writer, "close", lambda: closes.append(close()))
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    assert tracker.closed
    assert closes == [None]


def test_an_exception_in_flight_is_not_hidden_by_a_failing_close(tmp_path, monkeypatch):
    def broken_close():
        raise OSError("disk gone")

    tracker = TensorBoardTracker(tmp_path)
    close = tracker._writer.close
    with pytest.raises(ValueError, match="boom") as caught, tracker:  # noqa: PT012
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
        monkeypatch.setattr(tracker._writer, "close", broken_close)
        raise ValueError("boom")
    close()
    assert any("closing TensorBoardTracker also failed" in note for note in caught.value.__notes__)
    assert [e.value for e in _accumulator(tmp_path).Scalars("lm/train/loss")] == [1.0]


def test_an_exception_in_flight_propagates_and_the_reports_before_it_are_kept(tmp_path):
    with pytest.raises(KeyError, match="missing"), TensorBoardTracker(tmp_path) as tracker:  # noqa: PT012
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
        raise KeyError("missing")
    assert tracker.closed
    assert [e.value for e in _accumulator(tmp_path).Scalars("lm/train/loss")] == [1.0]


def test_trackers_fan_out_to_a_local_and_a_tensorboard_tracker(tmp_path):
    local, events = tmp_path / "tracking", tmp_path / "events"
    with Trackers(LocalTracker(local), TensorBoardTracker(events)) as tracker:
        tracker.log_metrics({"supervised/validation/loss": 0.5}, step=3)
    assert read_journal(local).scalars == {"supervised/validation/loss": [(3, 0.5)]}
    scalars = _accumulator(events).Scalars("supervised/validation/loss")
    assert [(e.step, e.value) for e in scalars] == [(3, 0.5)]


def test_importing_dew_imports_no_tensorboard_and_writing_imports_no_tensorflow(tmp_path):
    code = (
        "import sys, dew, dew.tracking, dew.tracking.tensorboard\n"
        "names = ('tensorboard', 'tensorflow', 'tensorboardX')\n"
        "print([name for name in names if name in sys.modules])\n"
        f"with dew.tracking.tensorboard.TensorBoardTracker({str(tmp_path)!r}) as tracker:\n"
        "    tracker.log_metrics({'lm/train/loss': 1.0}, step=0)\n"
        "print('tensorboard' in sys.modules, 'tensorflow' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "True False"]


def test_without_tensorboard_the_error_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['tensorboard'] = None\n"
        "from dew.tracking.tensorboard import TensorBoardTracker\n"
        "try:\n"
        "    TensorBoardTracker('unused')\n"
        "except ImportError as error:\n"
        "    print(error.name, '|', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("tensorboard | ")
    assert "install dew-ml[tensorboard]" in result.stdout
