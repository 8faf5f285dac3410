"""LocalTracker: journals, torn lines, run.json, previews decoded by Pillow, plots."""

import io
import json
import re
import tempfile
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from _grids import check_gif_grid, check_png_grid, uint8
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.artifacts import Clips, Images, Representations, TokenRows, TokenScores
from dew.data.tokenizers import BytesTokenizer
from dew.naming import Split, preview_name
from dew.telemetry.records import FitEnded, FitStarted, RunRecord, encode_json_value
from dew.tracking import LocalTracker, Preview, read_journal
from dew.tracking._render import histogram

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


@pytest.mark.parametrize("last", [False, True], ids=["inside", "last-line"])
def test_a_line_nested_100000_deep_raises_naming_it_even_as_the_last(tmp_path, last):
    deep = '{"step": 1, "values": ' + "[" * 100_000 + "\n"
    lines = ['{"step": 0, "values": {}}\n', deep] + (
        [] if last else ['{"step": 2, "values": {}}\n']
    )
    (tmp_path / "scalars.jsonl").write_text("".join(lines))
    # Not a torn line to skip: a whole line nested past what dew reads.
    with pytest.raises(ValueError, match=r"scalars\.jsonl: line 2 is not valid JSON: it nests"):
        read_journal(tmp_path)
    (tmp_path / "params.json").write_text("[" * 100_000)
    (tmp_path / "scalars.jsonl").write_text(lines[0])
    with pytest.raises(ValueError, match=r"params\.json is not valid params\.json .*: it nests"):
        read_journal(tmp_path)


def test_run_json_is_written_once_and_never_overwritten(tmp_path):
    first = RunRecord(model={"name": "a"}, data={}, optim={"learning_rate": 0.1})
    second = RunRecord(model={"name": "b"}, data={}, optim={"learning_rate": 0.2})
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


def test_an_image_preview_is_one_labelled_grid_png_beside_the_real_rows(tmp_path):
    rng = np.random.default_rng(0)
    generated, real = rng.random((2, 3, 6, 5, 3)).astype(np.float32)
    images = Images(jnp.asarray(generated), jnp.asarray(real), labels=jnp.asarray([1, 0, 1]))
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("lm/validation/samples", Preview(images, classes=("a", "b")), step=7)
    ((name, step, files),) = read_journal(tmp_path).artifacts
    assert (name, step, files) == (
        "lm/validation/samples",
        7,
        ["previews/lm/validation/samples/7/grid.png"],
    )
    lines = [("generated", uint8(generated)), ("real", uint8(real))]
    check_png_grid((tmp_path / files[0]).read_bytes(), lines, ["b", "a", "b"])


def test_a_clip_preview_is_one_animated_grid_gif_with_every_frame(tmp_path):
    rng = np.random.default_rng(1)
    videos = rng.random((2, 4, 9, 7, 3)).astype(np.float32)
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("lm/validation/clips", Clips(jnp.asarray(videos)), step=1)
    files = read_journal(tmp_path).artifacts[0][2]
    assert files == ["previews/lm/validation/clips/1/grid.gif"]
    content = (tmp_path / files[0]).read_bytes()
    assert check_gif_grid(content, [("generated", uint8(videos))], None) == 4


def test_token_rows_preview_as_their_ids_and_text_and_representations_as_json(tmp_path):
    tokens = np.array([[104, 105, 33], [111, 104, 256]], np.int32)
    mask = np.array([[False, True, True]] * 2)
    features = np.random.default_rng(2).standard_normal((10, 4)).astype(np.float32)
    shown = Preview(TokenRows(jnp.asarray(tokens), jnp.asarray(mask)), tokenizer=BytesTokenizer())
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("lm/validation/text", shown, step=2)
        features_name = "jepa/validation/features"
        tracker.log_artifact(features_name, Representations(jnp.asarray(features)), step=2)
    files = {name: files for name, _, files in read_journal(tmp_path).artifacts}
    folder = "previews/lm/validation/text/2"
    assert files["lm/validation/text"] == [f"{folder}/tokens.json", f"{folder}/text.md"]
    rows = json.loads((tmp_path / folder / "tokens.json").read_text())
    assert rows == {
        "tokens": tokens.tolist(),
        "mask": mask.tolist(),
        "text": [{"prompt": "h", "continuation": "i!"}, {"prompt": "o", "continuation": "h<eos>"}],
        "tokenizer": "bytes",
    }
    assert "~~~text\nh⟨|⟩i!\n~~~" in (tmp_path / folder / "text.md").read_text()
    spread = json.loads((tmp_path / files[features_name][0]).read_text())
    counts, edges = np.histogram(np.std(features.astype(np.float64), axis=0), bins=30)
    assert spread["counts"] == counts.tolist()
    np.testing.assert_allclose(spread["edges"], edges)
    assert histogram(features)["dimensions"] == 4


def test_two_stages_previews_keep_their_own_files_and_journal_lines(tmp_path):
    rng = np.random.default_rng(3)
    shown = {stage: rng.random((2, 4, 4, 3)).astype(np.float32) for stage in ("pre", "tune")}
    with LocalTracker(tmp_path) as tracker:
        for stage, generated in shown.items():  # both at step 5, as two fits' own steps are
            name = preview_name(stage, Split.VALIDATION, "samples")
            tracker.log_artifact(name, Images(jnp.asarray(generated)), step=5)
    journal = read_journal(tmp_path).artifacts
    assert [(name, step) for name, step, _ in journal] == [
        ("pre/validation/samples", 5),
        ("tune/validation/samples", 5),
    ]
    for (_, _, files), (stage, generated) in zip(journal, shown.items(), strict=True):
        assert files == [f"previews/{stage}/validation/samples/5/grid.png"]
        # neither stage's grid replaced the other's
        check_png_grid((tmp_path / files[0]).read_bytes(), [("generated", uint8(generated))], None)


def test_a_preview_under_a_bare_name_is_refused_before_anything_is_written(tmp_path):
    with LocalTracker(tmp_path) as tracker, pytest.raises(ValueError, match="stage/split/name"):
        tracker.log_artifact("samples", Images(jnp.ones((1, 2, 2, 1))), step=1)
    assert not (tmp_path / "previews").exists()
    assert read_journal(tmp_path).artifacts == []


def test_a_run_folder_of_the_old_preview_layout_still_reads_back(tmp_path):
    """Folders written before previews carried their stage: `previews/<name>/<step>/`."""
    (tmp_path / "previews" / "samples" / "4").mkdir(parents=True)
    (tmp_path / "previews" / "samples" / "4" / "0.png").write_bytes(b"png")
    line = {"name": "samples", "step": 4, "files": ["previews/samples/4/0.png"]}
    (tmp_path / "records.jsonl").write_text(json.dumps(line) + "\n")
    assert read_journal(tmp_path).artifacts == [("samples", 4, ["previews/samples/4/0.png"])]
    with LocalTracker(tmp_path) as tracker:  # reopened: new previews go beside the old ones
        tracker.log_artifact("lm/validation/samples", Images(jnp.ones((1, 2, 2, 1))), step=4)
    artifacts = read_journal(tmp_path).artifacts
    assert artifacts[1] == (
        "lm/validation/samples",
        4,
        ["previews/lm/validation/samples/4/grid.png"],
    )
    assert (tmp_path / artifacts[0][2][0]).read_bytes() == b"png"


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


# -- journals a crash or a hand left damaged ----------------------------------------------


def _journal(tmp_path, text: bytes, name="scalars.jsonl"):
    (tmp_path / name).write_bytes(text)
    return tmp_path / name


GOOD = b'{"step": 0, "values": {"lm/train/loss": 1.0}}\n'


def test_a_whole_last_line_without_its_newline_is_kept_by_the_reader_and_the_tracker(tmp_path):
    _journal(tmp_path, GOOD + b'{"step": 1, "values": {"lm/train/loss": 0.5}}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_journal(tmp_path).scalars == {"lm/train/loss": [(0, 1.0), (1, 0.5)]}
        with LocalTracker(tmp_path) as tracker:
            tracker.log_metrics({"lm/train/loss": 0.25}, step=2)
        expected = [(0, 1.0), (1, 0.5), (2, 0.25)]
        assert read_journal(tmp_path).scalars == {"lm/train/loss": expected}
    assert (tmp_path / "scalars.jsonl").read_bytes().count(b"\n") == 3


def test_a_tail_that_is_not_utf8_is_a_torn_line_to_the_reader_and_the_tracker(tmp_path):
    _journal(tmp_path, GOOD + b'{"step": 1, "values": {"lm/train/lo\xe2\x82')
    with pytest.warns(UserWarning, match=r"scalars\.jsonl: skipped a torn last line"):
        assert read_journal(tmp_path).scalars == {"lm/train/loss": [(0, 1.0)]}
    with pytest.warns(UserWarning, match="ended in a torn line"):
        LocalTracker(tmp_path).close()
    assert (tmp_path / "scalars.jsonl").read_bytes() == GOOD


def test_a_complete_line_that_is_not_utf8_raises_naming_the_file_and_line(tmp_path):
    _journal(tmp_path, GOOD + b'{"step": 1, "values": {"\xff": 1.0}}\n' + GOOD)
    with pytest.raises(
        ValueError, match=r"scalars\.jsonl: line 2 is not valid JSON: it is not UTF-8"
    ):
        read_journal(tmp_path)


@pytest.mark.parametrize(
    ("name", "line", "problem"),
    [
        ("scalars.jsonl", b'{"step": 1}', "its values are None"),
        ("scalars.jsonl", b'{"values": {}}', "its step is None"),
        ("scalars.jsonl", b'{"step": "1", "values": {}}', "its step is '1'"),
        ("scalars.jsonl", b'{"step": 1, "values": {"a/train/b": [1]}}', "'a/train/b' is [1]"),
        ("scalars.jsonl", b"[1, 2]", "it is not"),
        ("records.jsonl", b'{"name": "x", "step": null}', "exactly one of"),
        ("records.jsonl", b'{"name": "x", "step": 1, "record": 3}', "its record is 3"),
        ("records.jsonl", b'{"name": "x", "step": 1, "record": {"type": "nope"}}', "no record"),
    ],
)
def test_a_json_line_of_the_wrong_shape_raises_naming_the_file_and_line(
    tmp_path, name, line, problem
):
    good = GOOD if name == "scalars.jsonl" else b'{"name": "n", "step": null, "value": 1}\n'
    _journal(tmp_path, good + line + b"\n", name)
    match = rf"{re.escape(name)}: line 2 .*{re.escape(problem)}"
    with pytest.raises(ValueError, match=match):
        read_journal(tmp_path)
    _journal(tmp_path, good + line, name)  # as the last line, without its newline, too
    with pytest.raises(ValueError, match=match):
        read_journal(tmp_path)


def test_reopening_a_journal_with_a_malformed_line_warns_naming_it_and_appends(tmp_path):
    _journal(tmp_path, GOOD + b"not json\n" + GOOD)
    with pytest.warns(UserWarning, match=r"scalars\.jsonl: line 2 is not valid JSON.*appends"):
        tracker = LocalTracker(tmp_path)
    with tracker:
        tracker.log_metrics({"lm/train/loss": 0.5}, step=3)
    lines = (tmp_path / "scalars.jsonl").read_bytes().splitlines()
    assert lines[:3] == [GOOD.strip(), b"not json", GOOD.strip()] and len(lines) == 4


def test_dew_runs_lists_the_healthy_runs_and_flags_an_unreadable_one(tmp_path, capsys):
    from dew.cli import main

    with LocalTracker(tmp_path / "good") as tracker:
        tracker.log_artifact("fit_started", FitStarted("lm", 0, 4), step=0)
        tracker.log_metrics({"lm/train/loss": 0.5}, step=4)
        tracker.log_artifact("fit_ended", FitEnded("completed", 4), step=4)
    (tmp_path / "bad").mkdir()
    _journal(tmp_path / "bad", GOOD + b'{"step": 1, "vals": {}}\n')
    assert main(["runs", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert rows["good"][:2] == ["completed", "4"] and rows["bad"][0] == "unreadable"
    assert "bad: " in err and "scalars.jsonl: line 2" in err


def test_dew_runs_shows_a_resumed_fit_as_running_and_its_last_step(tmp_path, capsys):
    from dew.cli import main

    with LocalTracker(tmp_path / "run") as tracker:
        tracker.log_artifact("fit_started", FitStarted("lm", 0, 9), step=0)
        tracker.log_metrics({"lm/train/loss": 0.5}, step=6)
        tracker.log_artifact("fit_ended", FitEnded("failed", 6, error="x"), step=6)
        tracker.log_artifact("fit_started", FitStarted("lm", 4, 9), step=4)
        tracker.log_metrics({"lm/train/loss": 0.4}, step=6)
        tracker.log_metrics({"lm/train/loss": 0.3}, step=8)
    assert main(["runs", str(tmp_path)]) == 0
    header, row = (line.split() for line in capsys.readouterr().out.splitlines())
    assert header == ["run", "status", "step", "lm/train/loss"]  # one column per metric
    assert row == ["run", "running", "or", "killed", "8", "0.3000"]


# -- resume boundaries --------------------------------------------------------------------


def test_a_resumed_fit_marks_a_boundary_and_the_reader_keeps_the_last_value_per_step(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("fit_started", FitStarted("lm", 0, 9), step=0)
        for step in (3, 6):
            tracker.log_metrics({"lm/train/loss": 1.0 / step, "lm/train/n": step}, step=step)
    with LocalTracker(tmp_path) as tracker:  # resumed from a checkpoint at step 4
        tracker.log_artifact("fit_started", FitStarted("lm", 4, 9), step=4)
        for step in (6, 9):
            tracker.log_metrics({"lm/train/loss": 2.0 / step}, step=step)
    lines = [json.loads(line) for line in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    assert lines[2] == {"step": 4, "values": {}, "resume": True}
    journal = read_journal(tmp_path)
    assert journal.scalars == {
        "lm/train/loss": [(3, 1 / 3), (6, 2 / 6), (9, 2 / 9)],
        "lm/train/n": [(3, 3.0), (6, 6.0)],
    }
    assert journal.resumes == [4]


def test_a_fit_that_continues_past_the_journal_marks_no_boundary(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=4)
        tracker.log_artifact("fit_started", FitStarted("dpo", 4, 9), step=4)
        tracker.log_metrics({"dpo/train/loss": 1.0}, step=5)
    assert len((tmp_path / "scalars.jsonl").read_text().splitlines()) == 2
    assert read_journal(tmp_path).resumes == []


@pytest.mark.slow  # about 6 s; CI runs it with the slow tests
def test_a_real_resume_replays_its_steps_once_in_the_journal(tmp_path):
    import jax
    import optax

    from dew import Trainer
    from dew.data import Dataset
    from dew.nn.backbones.causal_transformer import CausalTransformer
    from dew.objectives.lm import LMObjective

    def batches(fail_at):
        rng = np.random.default_rng(7)
        for step in range(1, 100):
            if step == fail_at:
                raise RuntimeError(f"the loader broke at step {step}")
            yield {"text": rng.integers(0, 8, (4, 9)).astype(np.int32)}

    model = CausalTransformer(8, 16, 1, 2, 32, 16, key=jax.random.key(3))
    objective = LMObjective(model, seq_len=8)

    def fit(fail_at=None):
        data = Dataset(train=lambda partition: batches(fail_at))
        trainer = Trainer(
            objective, optax.adam(3e-3), key=jax.random.key(1), checkpoint_dir=tmp_path / "ckpt"
        )
        with LocalTracker(tmp_path / "journal") as tracker:
            return trainer.fit(
                data, steps=9, log_every=3, checkpoint_every=4, tracker=tracker, progress=False
            )

    with pytest.raises(RuntimeError, match="loader broke at step 8"):
        fit(fail_at=8)
    resumed = fit()
    journal = read_journal(tmp_path / "journal")
    assert journal.resumes == [4]
    loss = journal.scalars["lm/train/loss"]
    assert [step for step, _ in loss] == [3, 6, 9]
    assert loss == [(step, float(value)) for step, value in resumed.metric_history["lm/train/loss"]]
    statuses = [record.status for _, _, record in journal.records if record.type == "fit_ended"]
    assert statuses == ["failed", "completed"]


# -- values ---------------------------------------------------------------------------------


def test_numpy_and_jax_scalars_are_journalled_as_numbers(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_params(
            {"lr": np.float32(0.001), "scale": jnp.asarray(0.5), "bad": np.float32("nan")}
        )
        tracker.log_params({"n": np.int64(3), "flag": np.bool_(True), "w": np.array([1.0, np.inf])})
        tracker.log_artifact("notes", {"score": np.float32(0.25), "n": np.int64(3)}, step=1)
    params = json.loads((tmp_path / "params.json").read_text())
    assert params == {
        "lr": float(np.float32(0.001)),
        "scale": 0.5,
        "bad": "NaN",
        "n": 3,
        "flag": True,
        "w": [1.0, "+Inf"],
    }
    journal = read_journal(tmp_path)
    assert np.isnan(journal.params["bad"])
    assert journal.artifacts == [("notes", 1, {"score": 0.25, "n": 3})]


def test_metric_tags_and_values_are_checked_before_the_line_is_written(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        for values, error, match in [
            ({"loss": 1.0}, ValueError, "tag 'loss' must have three segments"),
            ({"a/train/b/c": 1.0}, ValueError, "three segments"),
            ({"a/test/b": 1.0}, ValueError, "split 'test' is not one of"),
            ({"lm/train/loss": 1.0, "lm//x": 2.0}, ValueError, "three segments|empty"),
            ({"lm/train/loss": "low"}, TypeError, "metric 'lm/train/loss' must be a real"),
        ]:
            with pytest.raises(error, match=match):
                tracker.log_metrics(values, step=1)
    assert (tmp_path / "scalars.jsonl").read_text() == ""


# -- run.json and params.json ---------------------------------------------------------------


def test_a_run_json_cut_short_by_a_full_disk_is_never_left_torn(tmp_path):
    import resource
    import signal

    record = RunRecord(model={"name": "a" * 400}, data={}, optim={})
    tracker = LocalTracker(tmp_path)
    previous_signal = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    previous = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, previous[1]))
    try:
        with pytest.raises(OSError, match="File too large"):
            tracker.log_artifact("run_record", record)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, previous)
        signal.signal(signal.SIGXFSZ, previous_signal)
    assert not (tmp_path / "run.json").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["records.jsonl", "scalars.jsonl"]
    tracker.log_artifact("run_record", record)
    tracker.close()
    assert json.loads((tmp_path / "run.json").read_text())["model"] == {"name": "a" * 400}


def test_a_torn_run_json_is_named_by_the_recipe_and_by_from_run_record(tmp_path):
    from dew.config import RunConfig
    from dew.config._recipe import _check_same_run

    (tmp_path / "run.json").write_text('{\n  "data": {},\n  "model": {"name": ')
    record = RunRecord(model={"name": "a"}, data={}, optim={})
    for call in (
        lambda: _check_same_run(tmp_path, record),
        lambda: RunConfig.from_run_record(tmp_path),
    ):
        with pytest.raises(ValueError, match=r"run\.json is not valid run\.json .*line 3"):
            call()


def test_a_truncated_params_json_is_set_aside_and_the_folder_reopens(tmp_path):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_params({"seed": 1})
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    (tmp_path / "params.json").write_text('{\n  "seed": ')
    with pytest.raises(ValueError, match=r"params\.json is not valid params\.json"):
        read_journal(tmp_path)
    with pytest.warns(UserWarning, match=r"params\.json is not valid .*params\.json\.unreadable"):
        tracker = LocalTracker(tmp_path)
    with tracker:
        tracker.log_params({"seed": 2})
    assert (tmp_path / "params.json.unreadable").read_text() == '{\n  "seed": '
    journal = read_journal(tmp_path)
    assert journal.params == {"seed": 2} and journal.scalars == {"lm/train/loss": [(0, 1.0)]}


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.tuples(
            st.integers(0, 30),
            st.dictionaries(
                st.sampled_from(["lm/train/loss", "lm/validation/psnr"]),
                st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 5),
                max_size=2,
            ),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_read_journal_keeps_the_last_value_per_step_in_first_logged_order(lines):
    """Any order of steps, repeated steps, resume boundaries, non-finite values: the series
    `read_journal` streams are a plain reducer's (a dict per tag, keyed by step)."""
    expected: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        with open(f"{folder}/scalars.jsonl", "w") as journal:
            for step, values, boundary in lines:
                if boundary:
                    journal.write(json.dumps({"step": step, "values": {}, "resume": True}) + "\n")
                encoded = {tag: encode_json_value(float(value)) for tag, value in values.items()}
                journal.write(json.dumps({"step": step, "values": encoded}) + "\n")
                for tag, value in values.items():
                    expected.setdefault(tag, {})[step] = float(value)
        journal = read_journal(folder)
    assert repr(journal.scalars) == repr({tag: list(s.items()) for tag, s in expected.items()})
    assert journal.resumes == [step for step, _, boundary in lines if boundary]
