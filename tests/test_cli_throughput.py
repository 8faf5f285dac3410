"""`dew train` reports the training throughput at its log steps by default (decision 0087):
the rates against their definition, the end-of-run summary's `throughput` line,
`--set trainer.log_throughput=false`, and `trainer.log_throughput` no part of a run's or a
sweep ledger's identity (the field's default and check: tests/test_builtin_configs.py)."""

import json
import time

import pytest
from _builders import write_config

from dew.cli import main
from dew.config import RunConfig, override
from dew.config._identity import comparable
from dew.config._recipe import _check_same_run, _record
from dew.tracking import read_journal

ROWS, SEQ = 8, 8  # write_config's batches: 8 windows of 8 tokens


def test_log_throughput_is_no_part_of_a_sweeps_base_configuration(tmp_path):
    _, config = write_config(tmp_path)
    plain = config.to_dict()
    off = override(config, {"trainer.log_throughput": False}).to_dict()
    assert plain != off and comparable(plain) == comparable(off)
    steps = override(config, {"trainer.steps": 7}).to_dict()
    assert comparable(plain) != comparable(steps)  # a field of the identity still counts


def test_a_run_json_with_another_value_or_none_is_the_same_run(tmp_path):
    _, config = write_config(tmp_path)
    folder = tmp_path / "runs" / "tiny"
    folder.mkdir(parents=True)
    saved = _record(config).to_dict()
    del saved["trainer"]["log_throughput"]  # as a run.json written before the field was
    (folder / "run.json").write_text(json.dumps(saved))
    for value in (True, False):
        _check_same_run(folder, _record(override(config, {"trainer.log_throughput": value})))
    with pytest.raises(ValueError, match=r"sections that differ: trainer\)"):
        _check_same_run(folder, _record(override(config, {"trainer.log_every": 3})))


@pytest.mark.slow  # two in-process `dew train` runs of the tiny LM, about 7 s
def test_dew_train_reports_throughput_and_a_rerun_without_it_resumes(tmp_path, capsys):
    path, _ = write_config(tmp_path, steps=6, log_every=2)
    folder = tmp_path / "runs" / "tiny"
    began = time.perf_counter()
    assert main(["train", str(path), "--quiet"]) == 0
    wall = time.perf_counter() - began
    printed = capsys.readouterr().out.splitlines()
    journal = read_journal(folder)
    tokens = journal.scalars["lm/train/tokens_per_second"]
    examples = dict(journal.scalars["lm/train/examples_per_second"])
    assert [step for step, _ in tokens] == [4, 6]  # the fit's first window compiles: untimed
    for step, rate in tokens:
        # A window's rate is its rows over its seconds: two steps of ROWS rows each, timed
        # inside the command, so no faster than the command's whole time allows.
        assert 2 * ROWS / wall <= examples[step] < float("inf")
        assert rate / examples[step] == pytest.approx(SEQ, rel=1e-12)  # tokens per row
    (line,) = [line for line in printed if line.startswith("  throughput  ")]
    assert f"lm/train/tokens_per_second {tokens[-1][1]:,.1f} (step 6)" in line
    assert "per_second" not in printed[0]  # the final-values line leaves them out
    assert json.loads((folder / "run.json").read_text())["trainer"]["log_throughput"] is True

    # The same run without throughput: the same run (it resumes, run.json kept), and its
    # log steps past the resume report none.
    off = ["--set", "trainer.log_throughput=false", "--steps", "10", "--quiet"]
    assert main(["train", str(path), *off]) == 0
    printed = capsys.readouterr().out.splitlines()
    journal = read_journal(folder)
    assert [step for step, _ in journal.scalars["lm/train/loss"]] == [2, 4, 6, 8, 10]
    assert [step for step, _ in journal.scalars["lm/train/tokens_per_second"]] == [4, 6]
    starts = [(r.start_step, r.steps) for _, _, r in journal.records if r.type == "fit_started"]
    assert starts == [(0, 6), (6, 10)]
    assert json.loads((folder / "run.json").read_text())["trainer"]["log_throughput"] is True
    assert "step 10" in printed[0]


@pytest.mark.slow  # one in-process `dew train` run of the tiny LM, about 5 s
def test_dew_train_with_log_throughput_false_reports_none(tmp_path, capsys):
    path, _ = write_config(tmp_path, steps=6, log_every=2, eval_every=None)
    assert main(["train", str(path), "--set", "trainer.log_throughput=false", "--quiet"]) == 0
    printed = capsys.readouterr().out
    journal = read_journal(tmp_path / "runs" / "tiny")
    assert sorted(journal.scalars) == ["lm/train/loss", "lm/train/token_accuracy"]
    assert "throughput" not in printed
    assert RunConfig.from_run_record(tmp_path / "runs" / "tiny").trainer.log_throughput is False
