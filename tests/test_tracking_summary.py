"""The scalars journal's summary (`summary.json`, decision 0046): `dew runs` and a reopening
`LocalTracker` read it and only the journal's lines past it; a missing, stale, foreign or
lying summary falls back to streaming the journal; the table it gives is the full journal's."""

import contextlib
import json
import pathlib
import tempfile
import tracemalloc
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dew.cli import main
from dew.telemetry.records import FitEnded, FitStarted, encode_json_value
from dew.tracking import LocalTracker, read_journal
from dew.tracking._summary import summarize

TAGS = ["lm/train/loss", "lm/validation/perplexity", "lm/validation/psnr"]


@pytest.fixture(autouse=True)
def _no_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


def _greatest(folder) -> dict[str, tuple[int, float]]:
    """Each tag's value at its greatest step, from the whole journal (`read_journal`)."""
    return {
        tag: max(series, key=lambda point: point[0])
        for tag, series in read_journal(folder).scalars.items()
    }


def _same(left: dict, right: dict) -> bool:
    """Equal, NaN equal to NaN (non-finite values are data)."""
    return json.dumps(left, sort_keys=True) == json.dumps(right, sort_keys=True)


def _listed(capsys, folder, *arguments) -> str:
    status = main(["runs", str(folder), *arguments])
    out = capsys.readouterr().out
    assert status == 0
    return out


values = st.floats(allow_nan=True, allow_infinity=True, width=64)
reports = st.lists(
    st.tuples(
        st.integers(0, 40),  # steps in any order: a resumed fit logs some again
        st.dictionaries(st.sampled_from(TAGS), values, max_size=3),
    ),
    max_size=25,
)
sessions = st.lists(st.tuples(reports, st.booleans()), min_size=1, max_size=3)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sessions=sessions, every=st.integers(1, 6))
def test_the_summary_gives_the_full_journals_table(sessions, every, capsys, monkeypatch):
    """Random metric streams over several sessions (a reopened folder, a resumed fit, a
    session killed before closing), the summary written every `every` lines: `dew runs`
    from the summary prints the table of the full journal, and so does its fallback."""
    monkeypatch.setattr("dew.tracking.local.EVERY", every)
    with tempfile.TemporaryDirectory() as directory:
        folder = pathlib.Path(directory) / "run"
        for session, closed in sessions:
            tracker = LocalTracker(folder)
            tracker.log_artifact("fit_started", FitStarted("lm", 0, 40), step=0)
            for step, logged in session:
                tracker.log_metrics(logged, step=step)
            if closed:
                tracker.close()
            else:  # killed: the summary is whatever the last `every` lines left
                tracker._scalars.close()
                tracker._records.close()
        expected = _greatest(folder)
        assert _same(summarize(folder).metrics(), expected)
        with_summary = _listed(capsys, folder.parent), _listed(capsys, folder.parent, "--json")
        (folder / "summary.json").unlink(missing_ok=True)
        assert _same(summarize(folder).metrics(), expected)
        without = _listed(capsys, folder.parent), _listed(capsys, folder.parent, "--json")
        assert with_summary == without
        metrics = json.loads(without[1])[0]["metrics"]
        assert _same(
            {tag: [cell["step"], cell["value"]] for tag, cell in metrics.items()},
            {tag: [step, encode_json_value(value)] for tag, (step, value) in expected.items()},
        )


def _journal(folder, steps, *, every=None, monkeypatch=None):
    if every is not None:
        monkeypatch.setattr("dew.tracking.local.EVERY", every)
    with LocalTracker(folder) as tracker:
        for step in steps:
            tracker.log_metrics({"lm/train/loss": 1.0 / (step + 1)}, step=step)


def test_a_stale_summary_is_brought_up_to_date_from_the_lines_past_it(tmp_path):
    _journal(tmp_path, range(5))
    stale = (tmp_path / "summary.json").read_text()
    _journal(tmp_path, range(5, 9))
    (tmp_path / "summary.json").write_text(stale)  # the journal is longer than it says
    summary = summarize(tmp_path)
    assert summary.metrics() == {"lm/train/loss": (8, 1.0 / 9)} == _greatest(tmp_path)
    assert summary.size == (tmp_path / "scalars.jsonl").stat().st_size
    assert summary.lines == 9


@pytest.mark.parametrize(
    "lie",
    [
        "missing",
        "not JSON",
        "another format",
        "longer than the journal",
        "another last line",
        "a value that is no number",
    ],
)
def test_a_summary_that_does_not_hold_is_not_read(tmp_path, lie, capsys):
    """A summary that does not describe the journal as it is (the journal rewritten or
    cut, the file edited or of another version) is ignored: the journal is streamed."""
    _journal(tmp_path / "run", range(6))
    target = tmp_path / "run" / "summary.json"
    stored = json.loads(target.read_text())
    if lie == "missing":
        target.unlink()
    elif lie == "not JSON":
        target.write_text('{"format": 1, "bytes"')
    elif lie == "another format":
        target.write_text(json.dumps({**stored, "format": 2, "last": {"lm/train/loss": [5, 9]}}))
    elif lie == "longer than the journal":
        target.write_text(json.dumps({**stored, "bytes": stored["bytes"] + 1}))
    elif lie == "another last line":
        target.write_text(json.dumps({**stored, "last": {"lm/train/loss": [99, 0.0]}}))
        journal = tmp_path / "run" / "scalars.jsonl"
        journal.write_text(journal.read_text().replace('"step": 5', '"step": 4'))
    else:
        target.write_text(json.dumps({**stored, "last": {"lm/train/loss": [5, "0.1"]}}))
    assert summarize(tmp_path / "run").metrics() == _greatest(tmp_path / "run")
    assert "lm/train/loss  \n" not in _listed(capsys, tmp_path)
    assert json.loads(_listed(capsys, tmp_path, "--json"))[0]["step"] == (
        4 if lie == "another last line" else 5
    )


def test_a_run_folder_without_a_summary_lists_and_reopens(tmp_path, capsys):
    """A run folder written before summaries (only its journals, as main's LocalTracker
    wrote them) lists, and a tracker reopening it writes its summary on closing."""
    folder = tmp_path / "old"
    folder.mkdir()
    lines = [{"step": step, "values": {"lm/train/loss": 2.0 - step}} for step in range(4)]
    lines.insert(2, {"step": 1, "values": {}, "resume": True})
    (folder / "scalars.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = [
        {"name": "fit_started", "step": 0, "record": FitStarted("lm", 0, 3).to_dict()},
        {"name": "fit_ended", "step": 3, "record": FitEnded(status="completed", step=3).to_dict()},
    ]
    (folder / "records.jsonl").write_text("".join(json.dumps(line) + "\n" for line in records))
    (folder / "params.json").write_text('{"config/optim/learning_rate": 0.1}\n')
    out = _listed(capsys, tmp_path)
    assert out.splitlines()[1].split() == ["old", "completed", "3", "-1.0000"]
    assert not (folder / "summary.json").exists()  # `dew runs` writes nothing
    with LocalTracker(folder) as tracker:
        tracker.log_metrics({"lm/train/loss": 0.5}, step=4)
    assert summarize(folder).size == (folder / "scalars.jsonl").stat().st_size
    assert json.loads((folder / "summary.json").read_text())["last"] == {"lm/train/loss": [4, 0.5]}


def test_reopening_reads_only_the_lines_past_the_summary(tmp_path):
    """A reopening tracker trusts the summary for the lines it covers (decision 0046): a
    line inside them is not read again (here, one damaged since, which `read_journal`, which
    reads everything, still names)."""
    _journal(tmp_path, range(6))
    journal = tmp_path / "scalars.jsonl"
    text = journal.read_text()
    journal.write_text(text.replace('{"step": 2,', '{"step": 2 '))  # same length, no JSON
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with LocalTracker(tmp_path) as tracker:
            tracker.log_metrics({"lm/train/loss": 0.0}, step=6)
    with pytest.raises(ValueError, match="line 3"):
        read_journal(tmp_path)


def test_a_journal_with_a_malformed_line_past_the_summary_gets_no_new_summary(tmp_path, capsys):
    _journal(tmp_path / "run", range(3))
    with (tmp_path / "run" / "scalars.jsonl").open("a") as journal:
        journal.write("not json\n")
    with pytest.warns(UserWarning, match="line 4"):
        tracker = LocalTracker(tmp_path / "run")
    with tracker:
        tracker.log_metrics({"lm/train/loss": 0.0}, step=3)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["lines"] == 3
    assert main(["runs", str(tmp_path)]) == 1
    assert "line 4" in capsys.readouterr().err


def test_dew_runs_shows_each_metric_at_its_greatest_step(tmp_path, capsys):
    """A fit resumed from a checkpoint between two logged steps logs a step the journal did
    not have (25, below 30): the metric's cell is its value at step 30, the run's last."""
    with LocalTracker(tmp_path / "run") as tracker:
        for step in (10, 20, 30):
            tracker.log_metrics({"lm/train/loss": float(step)}, step=step)
        tracker.log_artifact("fit_started", FitStarted("lm", 15, 40), step=15)
        tracker.log_metrics({"lm/train/loss": 25.0}, step=25)
    (row,) = json.loads(_listed(capsys, tmp_path, "--json"))
    assert row["step"] == 30
    assert row["metrics"]["lm/train/loss"] == {"value": 30.0, "step": 30}


def test_reading_a_journal_holds_one_line_at_a_time(tmp_path):
    """Constant memory beyond the result: 20,000 lines logging step 0 again and again are
    one point per tag, and reading them never holds the file."""
    line = json.dumps({"step": 0, "values": dict.fromkeys(TAGS, 0.123456789)}) + "\n"
    (tmp_path / "scalars.jsonl").write_text(line * 20_000)
    size = (tmp_path / "scalars.jsonl").stat().st_size
    tracemalloc.start()
    with contextlib.ExitStack() as stack:
        stack.callback(tracemalloc.stop)
        journal = read_journal(tmp_path)
        summary = summarize(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    assert journal.scalars == {tag: [(0, 0.123456789)] for tag in TAGS}
    assert summary.metrics() == dict.fromkeys(TAGS, (0, 0.123456789))
    assert peak < size / 10
