"""The sweep's ledger file (decision 0045): JSON lines appended one per event, a torn last line,
hand-edited lines, reading only what was appended, and version-1 ledgers of earlier dew."""

import json
import math
import pathlib
import shutil

import pytest
from _ledgers import ledger_json
from test_sweep import RATES, Recorder, _refused, config

from dew.config.sweep import IntUniform, Uniform, grid_search, random_search, sweep
from dew.config.sweep import _ledger_file as ledger_file
from dew.config.sweep._ledger import read_ledger
from dew.config.sweep._search import Trial
from dew.config.sweep._space import _normalize_space

VERSION_1 = pathlib.Path(__file__).with_name("ledgers") / "version-1.json"
"""A ledger written by dew before decision 0045 (commit 55f0f73), by `sweep(config(), space,
trials=4, search=random_search(seed=5))` whose `train` scored trial 1 NaN and raised at trial 2:
trials 0 and 1 finished, trial 2 running."""
OLD_SPACE = {
    "optim.learning_rate": Uniform(1e-4, 1e-1, log=True),
    "trainer.batch_size": [8, 16, 32],
}


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_version_1_ledger_of_earlier_dew_resumes_and_becomes_version_2(tmp_path):
    ledger = tmp_path / "ledger.json"
    shutil.copyfile(VERSION_1, ledger)
    old = json.loads(VERSION_1.read_text())
    assert old["version"] == 1 and read_ledger(ledger).version == 1
    point = old["running"][0]["overrides"]

    rerun = Recorder()
    trials = sweep(
        config(), OLD_SPACE, train=rerun, trials=4, ledger=ledger, search=random_search(seed=5)
    )
    # Trial 2, cut off mid-training, trains first at its recorded point; 0 and 1 stand.
    assert rerun.names == ["exp/trial-2", "exp/trial-3"]
    assert rerun.runs[0].optim.learning_rate == point["optim.learning_rate"]
    assert [trial.index for trial in trials] == [0, 1, 2, 3]
    assert trials[0] == Trial(0, old["trials"][0]["overrides"], old["trials"][0]["value"])
    assert math.isnan(trials[1].value)

    header, *events = _lines(ledger)
    assert {key: header[key] for key in ("space", "search", "config", "direction", "budget")} == {
        key: old[key] for key in ("space", "search", "config", "direction", "budget")
    }
    assert header["version"] == 2
    assert events[:3] == [  # the old ledger's entries, then this sweep's events
        {"finished": old["trials"][0]},
        {"finished": old["trials"][1]},
        {"running": old["running"][0]},
    ]
    data = ledger_json(ledger)
    assert [entry["index"] for entry in data["trials"]] == [0, 1, 2, 3] and data["running"] == []
    again = Recorder()
    assert (
        sweep(
            config(), OLD_SPACE, train=again, trials=4, ledger=ledger, search=random_search(seed=5)
        )[2:]
        == trials[2:]
    )
    assert again.runs == []


def test_a_version_1_ledger_is_refused_unchanged_for_another_space(tmp_path):
    ledger = tmp_path / "ledger.json"
    shutil.copyfile(VERSION_1, ledger)
    space = {"optim.learning_rate": RATES}
    _refused(tmp_path, ledger, "another space", space=space, search=random_search(seed=5))
    assert ledger.read_bytes() == VERSION_1.read_bytes()


def test_each_event_is_one_appended_line_and_a_load_reads_only_the_new_lines(tmp_path, monkeypatch):
    path = tmp_path / "l.json"
    space = _normalize_space({"optim.learning_rate": RATES})
    reads = []
    original = ledger_file._read_range

    def spy(descriptor, start, stop):
        reads.append((start, stop))
        return original(descriptor, start, stop)

    monkeypatch.setattr(ledger_file, "_read_range", spy)
    base = config().to_dict()
    one = ledger_file._Ledger(path, space, "grid", base, trials=3)
    two = ledger_file._Ledger(path, space, "grid", base, trials=3)
    with one, two:
        with one.locked():
            one.load()
            one.begin()
        header = path.read_bytes()
        one.start(0, {"optim.learning_rate": 0.01})
        assert two.load().running == {0: {"optim.learning_rate": 0.01}}
        written = path.read_bytes()
        assert written.startswith(header) and written.count(b"\n") == 2  # one line more
        two.finish(Trial(0, {"optim.learning_rate": 0.01}, 1.5))
        reads.clear()
        state = one.load()
        assert state.finished == {0: Trial(0, {"optim.learning_rate": 0.01}, 1.5)}
        assert state.running == {} and set(state.taken()) == {0} and 0 in state.taken()
        grown = path.stat().st_size
        assert reads == [(len(written), grown)]  # only the line `two` appended
        assert path.read_bytes().startswith(written)
        reads.clear()
        assert one.load() is state and reads == []  # nothing new: nothing read


@pytest.mark.parametrize(
    ("tail", "trained"),
    [
        ('{"finished": {"index": 2, "overrides": {"optim.learn', ["exp/trial-2"]),
        ('{"running": {"index": 2, "overrides": {"optim.learning_rate": 0.001}}}', ["exp/trial-2"]),
    ],
    ids=["torn", "whole-but-no-newline"],
)
def test_a_last_line_without_its_newline_is_ignored_and_cut_off(tmp_path, tail, trained):
    # A process killed mid-append leaves a line without its newline: never an event. Readers
    # skip it; the next sweep cuts it off (with a warning) before it appends.
    ledger = tmp_path / "l.json"
    space = {"optim.learning_rate": RATES}
    sweep(config(), space, train=Recorder(), trials=2, ledger=ledger, search=grid_search)
    whole = ledger.read_bytes()
    with ledger.open("a") as handle:
        handle.write(tail)
    assert read_ledger(ledger).state.finished.keys() == {0, 1}
    assert ledger_json(ledger) == ledger_json_of(whole, tmp_path)
    rerun = Recorder()
    with pytest.warns(UserWarning, match=r"ended in a torn line .*\(\d+ bytes dropped\)"):
        trials = sweep(config(), space, train=rerun, trials=3, ledger=ledger, search=grid_search)
    assert rerun.names == trained and [trial.index for trial in trials] == [0, 1, 2]
    assert ledger.read_bytes().startswith(whole)
    assert all(line for line in _lines(ledger))  # every line whole JSON again
    assert ledger_json(ledger)["running"] == []


def ledger_json_of(data, folder):
    copy = folder / "copy.json"
    copy.write_bytes(data)
    return ledger_json(copy)


def _edited_line(ledger, number, text):
    lines = ledger.read_text().splitlines()
    lines[number - 1] = text
    ledger.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("number", "line", "match"),
    [
        (3, '{"finished": {"index": 0, "overrides": {"optim.learning_rate": 0.01}, "value": "x"}}',
         r"line 3 \(trial 0\) has value 'x', not a number"),
        (5, '{"finished": {"index": 0, "overrides": {"optim.learning_rate": 0.01}, "value": 1}}',
         "line 5 has finished trial 0, which finished before"),
        (4, '{"running": {"index": 0, "overrides": {"optim.learning_rate": 0.01}}}',
         "line 4 has running trial 0, which finished before"),
        (4, '{"running": {"index": 7, "overrides": {"optim.learning_rate": 0.01}}}',
         r"line 4 has trial index 7, not an integer in \[0, 2\), the trial budget"),
        (4, '{"running": {"index": 1, "overrides": {"optim.learning_rate": 0.5}}}',
         r"line 4 \(trial 1\) has optim.learning_rate = 0.5, not one of the choices"),
        (2, '{"note": "mine"}', r"line 2 is \['note'\], not one key of \['budget', 'running', 'f"),
        (2, '{"budget": 0}', r"line 2 has budget 0, not an integer in \[1, 2\*\*63 - 1\]"),
        (2, '{"running": ', "line 2 is not valid JSON"),
        (1, '{"version": 2, "space": {}}', "it has no 'search', 'config', 'direction', 'budget'"),
    ],
)  # fmt: skip
def test_a_hand_edited_line_is_refused_naming_the_file_the_line_and_the_value(
    tmp_path, number, line, match
):
    ledger = tmp_path / "l.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=2, ledger=ledger)
    _edited_line(ledger, number, line)
    message = _refused(tmp_path, ledger, f"is malformed: (.* )?{match}")
    assert "\n" not in message


def test_a_larger_budget_is_one_line_and_indices_stay_bounded_by_the_largest(tmp_path):
    ledger = tmp_path / "l.json"
    space = {"trainer.steps": IntUniform(1, 50)}
    sweep(config(), space, train=Recorder(), trials=2, ledger=ledger)
    sweep(config(), space, train=Recorder(), trials=3, ledger=ledger)
    sweep(config(), space, train=Recorder(), trials=1, ledger=ledger)  # smaller: no line
    budgets = [event["budget"] for event in _lines(ledger)[1:] if "budget" in event]
    assert _lines(ledger)[0]["budget"] == 2 and budgets == [3]
    assert ledger_json(ledger)["budget"] == 3


def test_a_symbolic_link_at_the_ledger_path_is_refused_and_nothing_trains(tmp_path):
    # A ledger is appended to in place: dew never writes through a link (decision 0031).
    real = tmp_path / "real.json"
    sweep(config(), {"optim.learning_rate": RATES}, train=Recorder(), trials=1, ledger=real)
    before = real.read_bytes()
    link = tmp_path / "l.json"
    link.symlink_to(real)
    train = Recorder()
    with pytest.raises(OSError, match=r"l\.json.*is a symbolic link|is a symbolic link.*l\.json"):
        sweep(config(), {"optim.learning_rate": RATES}, train=train, trials=2, ledger=link)
    assert train.runs == [] and real.read_bytes() == before


def test_of_trials_that_tie_the_launchers_summary_names_the_first(tmp_path, capsys):
    # Workers finish in any order, and two trials Optuna gave the same point score the
    # same: the best is the first of them by index, as `dew runs` shows it, not the first
    # to finish.
    import argparse

    from dew.cli._workers import _summary

    path = tmp_path / "ledger.json"
    space = _normalize_space({"optim.learning_rate": RATES})
    ledger = ledger_file._Ledger(path, space, "optuna", config().to_dict(), trials=3)
    points = {0: 0.003, 1: 0.003, 2: 0.01}
    with ledger:
        with ledger.locked():
            ledger.load()
            ledger.begin()
        for index, value in ((2, 3.0), (1, 1.5), (0, 1.5)):  # the order the workers finished
            ledger.start(index, {"optim.learning_rate": points[index]})
            ledger.finish(Trial(index, {"optim.learning_rate": points[index]}, value))
    assert list(read_ledger(path).state.finished) == [2, 1, 0]
    assert _summary(argparse.Namespace(metric=None), str(path)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[:3]] == ["0", "1", "2"]
    assert lines[-1].startswith("best trial 0  score 1.5000")
