"""Plots of a local journal: one PNG per bare metric (extra `plots`, matplotlib).

Figures are drawn on matplotlib's Agg canvas directly, never through pyplot, so
no display opens and the caller's matplotlib backend is left alone.
"""

import math
import os
import pathlib
import re
from typing import Any

import numpy as np

from dew._files import open_for_writing
from dew._run_folder import PLOTS
from dew.naming import parse_metric_tag
from dew.tracking._journal import read_journal

__all__ = ["journal_figures", "plot_journal"]


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as error:
        raise ImportError(
            "plots need matplotlib: install dew-ml[plots] (pip install 'dew-ml[plots]').",
            name="matplotlib",
        ) from error
    return Figure, FigureCanvasAgg, MaxNLocator


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def journal_figures(path: str | os.PathLike[str], *, run: str | None = None) -> dict[str, Any]:
    """One matplotlib `Figure` (on an Agg canvas) per bare metric of a LocalTracker
    folder's journal, keyed by the metric and sorted; what `plot_journal` saves.

    Each `(stage, split)` that reported the metric is its own series. Each chart is
    titled `<run>: <metric>` (`run` defaults to the folder's name) and its step axis has
    integer ticks. Non-finite values are left out of the line segments (the line breaks
    there) and marked with a labelled marker at the edge of the plot; their exact values
    stay in the journal.
    """
    figure_class, canvas_class, locator = _matplotlib()
    path = pathlib.Path(path)
    run = path.resolve().name if run is None else run
    journal = read_journal(path)
    by_metric: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for tag, series in journal.scalars.items():
        parsed = parse_metric_tag(tag)
        by_metric.setdefault(parsed.metric, {})[parsed.series] = series
    figures = {}
    for metric, series_by_label in sorted(by_metric.items()):
        figure = figure_class(figsize=(6.4, 4.0), dpi=100)
        canvas_class(figure)
        axes = figure.add_subplot()
        non_finite = []
        for label, series in sorted(series_by_label.items()):
            steps = np.array([step for step, _ in series], np.float64)
            values = np.array([value for _, value in series], np.float64)
            finite = np.isfinite(values)
            line = axes.plot(steps, np.where(finite, values, np.nan), marker=".", label=label)[0]
            non_finite.extend(
                (step, value, line.get_color())
                for step, value in zip(steps[~finite], values[~finite], strict=True)
            )
        if non_finite:
            low, high = axes.get_ylim()
            for step, value, colour in non_finite:
                if math.isnan(value):
                    y, text, marker = low, "NaN", "x"
                else:
                    y, text, marker = (high, "+Inf", "^") if value > 0 else (low, "-Inf", "v")
                axes.scatter([step], [y], marker=marker, color=colour, zorder=3, clip_on=False)
                axes.annotate(
                    text,
                    (step, y),
                    textcoords="offset points",
                    xytext=(3, 3),
                    fontsize=7,
                    color=colour,
                )
        axes.set_title(f"{run}: {metric}")
        axes.xaxis.set_major_locator(locator(integer=True))
        low, high = axes.get_xlim()
        if high - low < 2.0:  # a metric of one or two steps: room for integer ticks
            left = max((low + high) / 2.0 - 1.0, -0.5)
            axes.set_xlim(left, left + 2.0)
        axes.set_xlabel("step")
        axes.set_ylabel(metric)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figures[metric] = figure
    return figures


def plot_journal(path: str | os.PathLike[str], *, run: str | None = None) -> list[pathlib.Path]:
    """Render `plots/<metric>.png` for every bare metric in a LocalTracker folder (the
    figures of `journal_figures`, titled `<run>: <metric>`, `run` defaulting to the
    folder's name). Returns the files written, sorted by metric.
    """
    figures = journal_figures(path, run=run)
    out = pathlib.Path(path) / PLOTS
    out.mkdir(exist_ok=True)
    written = []
    for metric, figure in figures.items():
        target = out / f"{_safe(metric)}.png"
        with open_for_writing(target, "wb") as file:  # never through a symbolic link
            figure.savefig(file, format="png")
        written.append(target)
    return written
