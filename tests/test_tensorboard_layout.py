"""TensorBoardTracker's custom_scalars layout, read back by TensorBoard's own plugin.

The layout draws every split of a stage's metric on one multiline chart; the test reads
it as the Custom Scalars dashboard does (`CustomScalarsPlugin.layout_impl` over an
`EventMultiplexer`) and checks each chart's regex against the tags written.
"""

import json
import re

import pytest

pytest.importorskip("tensorboard")

from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin

from dew.tracking import TensorBoardTracker
from dew.tracking.tensorboard import scalars_layout


def _dashboard(logdir):
    """The layout the Custom Scalars dashboard shows for `logdir`, and the scalar tags of
    each run, both read by TensorBoard."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    plugin = CustomScalarsPlugin(
        base_plugin.TBContext(
            logdir=str(logdir),
            data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)),
            plugin_name_to_instance={},
        )
    )
    layout = json.loads(plugin.layout_impl(context.RequestContext(), ""))
    scalars = {
        run: set(tags) for run, tags in multiplexer.PluginRunToTagToContent("scalars").items()
    }
    return layout, scalars


def _charts(layout):
    """(category title, chart title) -> the chart's tag regexes."""
    return {
        (category["title"], chart["title"]): chart["multiline"]["tag"]
        for category in layout.get("category", [])
        for chart in category["chart"]
    }


def _matched(regexes, tags):
    return {tag for tag in tags if any(re.search(regex, tag) for regex in regexes)}


def test_train_and_validation_of_one_metric_share_one_chart(tmp_path):
    with TensorBoardTracker(tmp_path) as tracker:
        for step in range(3):
            tracker.log_metrics({"lm/train/loss": 2.0 - step, "lm/train/lr": 0.1}, step=step)
        tracker.log_metrics({"lm/validation/loss": 1.5, "lm/validation/perplexity": 4.5}, step=2)
    layout, scalars = _dashboard(tmp_path)
    charts = _charts(layout)
    assert charts == {
        ("lm", "loss"): ["^lm/(train|validation)/loss$"],
        ("lm", "lr"): ["^lm/(train)/lr$"],
        ("lm", "perplexity"): ["^lm/(validation)/perplexity$"],
    }
    (written,) = scalars.values()
    assert _matched(charts["lm", "loss"], written) == {"lm/train/loss", "lm/validation/loss"}
    assert _matched(charts["lm", "lr"], written) == {"lm/train/lr"}
    assert _matched(charts["lm", "perplexity"], written) == {"lm/validation/perplexity"}


def test_the_layout_is_rewritten_when_a_new_metric_appears_and_tensorboard_reads_the_latest(
    tmp_path,
):
    tracker = TensorBoardTracker(tmp_path)
    tracker.log_metrics({"lm/train/loss": 2.0}, step=1)
    assert _charts(_dashboard(tmp_path)[0]) == {("lm", "loss"): ["^lm/(train)/loss$"]}
    tracker.log_metrics({"lm/train/loss": 1.0}, step=2)  # nothing new: no new layout
    tracker.log_metrics({"lm/validation/loss": 1.2}, step=2)
    tracker.log_metrics({"dpo/train/loss": 0.7}, step=3)  # a second stage, its own category
    tracker.close()
    layout, _ = _dashboard(tmp_path)
    assert [category["title"] for category in layout["category"]] == ["dpo", "lm"]
    assert _charts(layout) == {
        ("dpo", "loss"): ["^dpo/(train)/loss$"],
        ("lm", "loss"): ["^lm/(train|validation)/loss$"],
    }
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [event.step for event in events.Tensors("custom_scalars__config__")] == [1, 2, 3]


def test_names_are_escaped_so_each_regex_matches_exactly_its_tags(tmp_path):
    tags = ["a.b/train/x+y", "aXb/train/x+y", "a.b/validation/x+y", "a.b/train/x+yy"]
    with TensorBoardTracker(tmp_path) as tracker:
        tracker.log_metrics(dict.fromkeys(tags, 1.0), step=0)
        tracker.log_metrics({"bare": 1.0, "a/b/c/d": 2.0}, step=1)  # not metric tags: no chart
    layout, scalars = _dashboard(tmp_path)
    charts = _charts(layout)
    assert set(charts) == {("a.b", "x+y"), ("a.b", "x+yy"), ("aXb", "x+y")}
    (written,) = scalars.values()
    assert _matched(charts["a.b", "x+y"], written) == {"a.b/train/x+y", "a.b/validation/x+y"}
    assert _matched(charts["aXb", "x+y"], written) == {"aXb/train/x+y"}
    assert _matched(charts["a.b", "x+yy"], written) == {"a.b/train/x+yy"}
    every = set().union(*(_matched(regexes, written) for regexes in charts.values()))
    assert every == set(tags)


def test_runs_of_a_sweep_merge_into_one_layout(tmp_path):
    for trial in range(2):
        with TensorBoardTracker(tmp_path / f"trial-{trial}") as tracker:
            tracker.log_metrics({"lm/train/loss": 1.0, "lm/validation/loss": 2.0}, step=0)
    layout, scalars = _dashboard(tmp_path)
    assert sorted(scalars) == ["trial-0", "trial-1"]
    assert _charts(layout) == {("lm", "loss"): ["^lm/(train|validation)/loss$"]}


def test_scalars_layout_skips_what_is_not_a_metric_tag():
    assert list(scalars_layout(["loss", "a/b", 3]).category) == []
