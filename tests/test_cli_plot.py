"""`dew plot RUN_DIR`: the local plots of a run, titled with its name, integer step ticks."""

import os
import subprocess
import sys

import pytest

from dew.cli import main
from dew.telemetry.records import RunRecord
from dew.tracking import LocalTracker

pytest.importorskip("matplotlib")

from dew.tracking.plots import journal_figures


def _journal(folder, name="my-run"):
    """A run folder as `dew train` leaves it: run.json and a journal of three steps."""
    with LocalTracker(folder) as tracker:
        record = RunRecord(model={}, data={}, optim={}, trainer={"name": name})
        tracker.log_artifact("run_record", record)
        for step, loss in enumerate([2.0, 1.5, float("nan")]):
            tracker.log_metrics({"lm/train/loss": loss}, step=step)
        tracker.log_metrics({"lm/validation/loss": 1.7, "lm/validation/perplexity": 5.5}, step=2)
    return folder


@pytest.mark.slow  # about 4 s; CI runs it with the slow tests
def test_dew_plot_renders_each_metric_and_says_where(tmp_path):
    folder = _journal(tmp_path / "runs" / "my-run")
    result = subprocess.run(
        [sys.executable, "-m", "dew.cli", "plot", str(folder)],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"2 plots in {folder / 'plots'}: loss.png, perplexity.png\n"
    for name in ("loss.png", "perplexity.png"):
        assert (folder / "plots" / name).read_bytes().startswith(b"\x89PNG")


def test_each_chart_is_titled_with_the_run_name_and_has_integer_step_ticks(tmp_path):
    figures = journal_figures(_journal(tmp_path / "folder", name="my-run"), run="my-run")
    assert list(figures) == ["loss", "perplexity"]
    for metric, figure in figures.items():
        (axes,) = figure.axes
        assert axes.get_title() == f"my-run: {metric}"
        ticks = axes.get_xticks()
        assert len(ticks) >= 2 and all(float(tick).is_integer() for tick in ticks), ticks
    assert [text.get_text() for text in figures["loss"].axes[0].get_legend().get_texts()] == [
        "lm/train",
        "lm/validation",
    ]


def test_the_title_names_the_run_from_run_json_else_the_folder(tmp_path, monkeypatch):
    titles = []
    import dew.tracking.plots as plots

    real = plots.journal_figures
    monkeypatch.setattr(
        plots, "journal_figures", lambda path, run: titles.append(run) or real(path, run=run)
    )
    assert main(["plot", str(_journal(tmp_path / "a", name="from-run-json"))]) == 0
    bare = tmp_path / "bare-folder"
    with LocalTracker(bare) as tracker:
        tracker.log_metrics({"lm/train/loss": 1.0}, step=0)
    assert main(["plot", str(bare)]) == 0
    assert titles == ["from-run-json", "bare-folder"]


def test_a_folder_without_a_journal_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    assert main(["plot", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert error == (
        f"dew plot: {str(tmp_path / 'runs')!r} has no journal (scalars.jsonl): give a run "
        "folder, one that dew train wrote (dew runs lists them).\n"
    )
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"dew plot: no run folder {str(tmp_path / 'missing')!r}.\n"
    assert not (tmp_path / "runs" / "plots").exists()


def test_an_empty_journal_says_there_is_nothing_to_plot(tmp_path, capsys):
    with LocalTracker(tmp_path) as tracker:
        tracker.log_params({"seed": 0})
    assert main(["plot", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("nothing to plot: ")


def test_without_matplotlib_the_error_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert main(["plot", str(_journal(tmp_path / "run"))]) == 2
    assert "install dew-ml[plots]" in capsys.readouterr().err
