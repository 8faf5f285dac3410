"""`dew._run_folder`: where a run folder's files are (`RunFolder`, `run_folder`) and what
reading them tells: its record, its fits, the extensions of its step budget and the latest
step it reached, from whole, torn, missing and old files; and `dew.load_run` on a trained
run read through it."""

import json
import pathlib
import types

import pytest

from dew._run_folder import Extension, Fit, RunFolder, run_folder
from dew.telemetry.records import FitEnded, FitStarted, RunRecord
from dew.tracking import LocalTracker

LAYOUT = {
    "run_record": "run.json",
    "lock": "run.lock",
    "data_record": "data.json",
    "checkpoints": "checkpoints",
    "scalars": "scalars.jsonl",
    "records": "records.jsonl",
    "params": "params.json",
    "summary": "summary.json",
    "previews": "previews",
    "plots": "plots",
    "exports": "exports.json",
    "data_cache": "data-cache",
}


RECORD = RunRecord(model={"name": "mlp"}, data={"name": "shapes"}, optim={}, trainer={})


def _record(**sections):
    """run.json's mapping, with `sections` in place of the record's."""
    return {**RECORD.to_dict(), **sections}


def _write_run(folder, *, scalars=(), records=(), artifacts=()):
    """A run folder as a `LocalTracker` leaves it: run.json, metrics at `scalars` (step,
    loss), `records` ((name, step, record)) and `artifacts` ((name, step, value))."""
    with LocalTracker(folder) as tracker:
        tracker.log_artifact("run_record", RECORD)
        for step, loss in scalars:
            tracker.log_metrics({"train/train/loss": loss}, step=step)
        for name, step, value in [*records, *artifacts]:
            tracker.log_artifact(name, value, step=step)
    return RunFolder(folder)


def test_a_run_folder_names_each_of_its_files(tmp_path):
    run = RunFolder(tmp_path / "never-trained")  # nothing is read: the folder need not exist
    for attribute, name in LAYOUT.items():
        assert getattr(run, attribute) == tmp_path / "never-trained" / name, attribute
    assert run.tokenizer_copy("huggingface").name == "tokenizer.json"
    assert run.tokenizer_copy("sentencepiece").name == "tokenizer.model"
    assert run.previous(run.run_record).name == "run.json.previous"
    assert run.previous(run.params).name == "params.json.previous"
    assert run == RunFolder(str(tmp_path / "never-trained")) and len({run, RunFolder(run)}) == 1
    assert not run.is_run() and not run.has_journal()


def test_a_run_is_located_under_its_checkpoint_dir_or_its_store(tmp_path):
    def config(root):
        return types.SimpleNamespace(trainer=types.SimpleNamespace(checkpoint_dir=root))

    local = run_folder(config(str(tmp_path)), "sweep/trial-0")
    assert local == (
        str(tmp_path / "sweep" / "trial-0" / "checkpoints"),
        tmp_path / "sweep/trial-0",
    )
    assert run_folder(config(f"file://{tmp_path}"), "a") == (
        str(tmp_path / "a" / "checkpoints"),
        tmp_path / "a",
    )
    for root in ("gs://bucket/runs", "gs://bucket/runs/"):
        assert run_folder(config(root), "a/b") == (
            "gs://bucket/runs/a/b/checkpoints",
            pathlib.Path("runs") / "a" / "b",
        )


def test_a_run_folder_is_found_from_the_folder_or_its_run_json(tmp_path):
    run = _write_run(tmp_path / "run")
    assert RunFolder.of(tmp_path / "run") == run == RunFolder.of(tmp_path / "run" / "run.json")
    with pytest.raises(FileNotFoundError, match=r"^no run folder at .*missing\.$"):
        RunFolder.of(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"is a file, not a run folder \(one with run.json"):
        RunFolder.of(run.scalars)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"is not a run folder: it has no run\.json"):
        RunFolder.of(tmp_path / "empty")


def test_the_record_is_run_json_checked_and_read_under_run_configs_names(tmp_path):
    run = _write_run(tmp_path)
    assert run.is_run() and run.record()["model"] == {"name": "mlp"}
    old = _record()
    old["optimizer"] = old.pop("optim")  # written before `optimizer` became `optim`
    run.run_record.write_text(json.dumps(old))
    assert "optimizer" not in run.record() and run.record()["optim"] == {}
    run.run_record.write_text(json.dumps({"type": "fit_ended", "status": "completed"}))
    with pytest.raises(ValueError, match="holds a 'fit_ended' record, not a run_record"):
        run.record()
    run.run_record.write_text(json.dumps({"type": "run_record", "model": {}}))
    with pytest.raises(ValueError, match="not a whole run_record: it lacks data, optim, trainer"):
        run.record()


FIRST = FitStarted("train", 0, 4, metric_directions={"accuracy": "maximize"})
SECOND = FitStarted("train", 2, 6)
THIRD = FitStarted("train", 6, 8)


def test_fits_are_read_in_journal_order_each_with_its_end(tmp_path):
    run = _write_run(
        tmp_path,
        records=[
            ("fit_started", 0, FIRST),
            ("fit_ended", 2, FitEnded("interrupted", 2)),
            ("fit_started", 2, SECOND),
            ("fit_ended", 6, FitEnded("completed", 6)),
            ("fit_started", 6, THIRD),  # running, or killed
        ],
    )
    assert run.fit_started() == [FIRST, SECOND, THIRD]
    assert run.fits() == [
        Fit(FIRST, FitEnded("interrupted", 2)),
        Fit(SECOND, FitEnded("completed", 6)),
        Fit(THIRD, None),
    ]
    assert run.latest_fit() == THIRD
    assert run.fit_started()[0].metric_directions == {"accuracy": "maximize"}


def test_an_end_without_its_start_is_a_fit_of_its_own(tmp_path):
    ended = FitEnded("completed", 3)
    run = _write_run(tmp_path, records=[("fit_ended", 3, ended)])
    assert run.fits() == [Fit(None, ended)] and run.fit_started() == []
    assert run.latest_fit() is None and run.latest_step() == 3


def test_the_extension_history_is_each_step_budget_note(tmp_path):
    notes = [
        {"from_step": 4, "steps": 6, "previous_steps": 4},
        {"from_step": 6, "steps": 10, "previous_steps": 6},
    ]
    run = _write_run(
        tmp_path,
        records=[("fit_started", 0, FIRST)],
        artifacts=[("step_budget", note["from_step"], note) for note in notes],
    )
    assert run.extensions() == [Extension(4, 6, 4), Extension(6, 10, 6)]
    assert [extension._asdict() for extension in run.extensions()] == notes  # as the recipe logs
    history = run.history()  # one read, asked several things
    assert history.extensions() == run.extensions() and history.fit_started() == [FIRST]
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("step_budget", {"steps": 12}, step=10)
    with pytest.raises(ValueError, match=r"records\.jsonl: a 'step_budget' note holds"):
        run.extensions()


def test_the_latest_step_is_the_last_logged_or_the_last_fits_end(tmp_path):
    assert RunFolder(tmp_path / "missing").latest_step() is None
    assert _write_run(tmp_path / "empty").latest_step() is None
    logged = _write_run(tmp_path / "logged", scalars=[(0, 2.0), (5, 1.0), (3, 1.5)])
    assert logged.latest_step() == 5
    ended = _write_run(
        tmp_path / "ended",
        scalars=[(0, 2.0), (4, 1.0)],
        records=[("fit_started", 0, FIRST), ("fit_ended", 6, FitEnded("completed", 6))],
    )
    assert ended.latest_step() == 6  # the fit ended past its last logged step
    resumed = _write_run(
        tmp_path / "resumed",
        scalars=[(0, 2.0), (4, 1.0)],
        records=[
            ("fit_started", 0, FIRST),
            ("fit_ended", 6, FitEnded("completed", 6)),
            ("fit_started", 6, THIRD),
        ],
    )
    assert resumed.latest_step() == 4  # the running fit's end is not known yet


def test_the_latest_step_reads_past_torn_and_stale_files(tmp_path):
    run = _write_run(
        tmp_path,
        scalars=[(0, 2.0), (4, 1.0)],
        records=[("fit_started", 0, FIRST), ("fit_ended", 4, FitEnded("completed", 4))],
    )
    assert run.summary.is_file() and run.latest_step() == 4
    with open(run.scalars, "a") as journal:  # past the summary: read, not the summary alone
        journal.write(json.dumps({"step": 7, "values": {"train/train/loss": 0.5}}) + "\n")
    assert run.latest_step() == 7
    with open(run.scalars, "a") as journal:  # a crash mid-write
        journal.write('{"step": 9, "values": {"train/tr')
    with pytest.warns(UserWarning, match="skipped a torn last line"):
        assert run.latest_step() == 7
    with open(run.records, "a") as journal:
        journal.write('{"name": "fit_ended", "step": 12, "rec')
    with pytest.warns(UserWarning, match="skipped a torn last line"):
        assert run.fits()[-1].ended == FitEnded("completed", 4)
    run.summary.write_text("{not json")  # a damaged summary: the journal is read whole
    with pytest.warns(UserWarning, match="torn last line"):
        assert run.latest_step() == 7
    run.summary.unlink()
    with pytest.warns(UserWarning, match="torn last line"):
        assert run.latest_step() == 7


def test_a_malformed_journal_line_raises_but_latest_fit_falls_back(tmp_path):
    run = _write_run(tmp_path, records=[("fit_started", 0, FIRST)])
    run.records.write_text("not json\n" + run.records.read_text())
    with pytest.raises(ValueError, match=r"records\.jsonl: line 1"):
        run.fit_started()
    assert run.latest_fit() is None  # readers then keep run.json's values


def test_an_old_run_folder_reads_without_its_newer_files(tmp_path):
    """A run folder from before records.jsonl, summary.json, data.json and `optim`: run.json
    and a scalars journal."""
    from dew.config import RunConfig

    old = _record(trainer={"steps": 3})
    old["optimizer"] = old.pop("optim")
    tmp_path.joinpath("run.json").write_text(json.dumps(old))
    lines = [{"step": step, "values": {"train/train/loss": 1.0 / (step + 1)}} for step in range(3)]
    tmp_path.joinpath("scalars.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = RunFolder.of(tmp_path)
    assert run.is_run() and run.has_journal() and not run.records.exists()
    assert (run.fits(), run.fit_started(), run.extensions()) == ([], [], [])
    assert run.latest_fit() is None and run.latest_step() == 2
    assert RunConfig.from_run_record(tmp_path).trainer.steps == 3  # run.json's total stands


@pytest.mark.slow
def test_a_trained_run_reads_back_and_loads_its_params(tmp_path):
    """A real run's folder through RunFolder, extended once; `dew.load_run` returns the
    params the fit returned (the round trip)."""
    import jax
    import numpy as np
    from _trained_runs import trained

    import dew
    from dew.config import RunConfig, override

    folder, state = trained("tiny_classifier", tmp_path)
    run = RunFolder.of(folder)
    for present in ("run_record", "lock", "data_record", "scalars", "records", "params"):
        assert getattr(run, present).exists(), present
    assert sorted(path.name for path in run.checkpoints.iterdir()) == ["1", "2"]
    assert [
        (fit.started.start_step, fit.started.steps, fit.ended.status) for fit in run.fits()
    ] == [(0, 2, "completed")]
    assert run.latest_step() == 2 and run.extensions() == []
    loaded = dew.load_run(folder)
    assert loaded.folder == run.path and loaded.step == 2
    pairs = zip(jax.tree.leaves(loaded.params), jax.tree.leaves(state.params), strict=True)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    config = override(RunConfig.from_run_record(folder), {"trainer.steps": 3})
    config.train(progress=False)
    assert run.extensions() == [Extension(from_step=2, steps=3, previous_steps=2)]
    assert [started.start_step for started in run.fit_started()] == [0, 2]
    assert run.latest_step() == 3 and RunConfig.from_run_record(folder).trainer.steps == 3
