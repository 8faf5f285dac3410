"""The `dew` command and its built-in quick-start run."""

import json
import shutil
import subprocess

import numpy as np
import pytest

from dew._quickstart import entropy_rate, markov_chain, sample_rows
from dew.cli import main
from dew.tracking import read_journal


@pytest.mark.slow
def test_dew_train_trains_evaluates_and_tracks_the_small_lm(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "200"]) == 0
    printed = capsys.readouterr().out
    assert f"tracking written to {out / 'tracking'}" in printed
    journal = read_journal(out / "tracking")
    assert [step for step, _ in journal.scalars["lm/train/loss"]] == [50, 100, 150, 200]
    assert [step for step, _ in journal.scalars["lm/validation/perplexity"]] == [100, 200]
    perplexities = [value for _, value in journal.scalars["lm/validation/perplexity"]]
    floor = float(np.exp(entropy_rate(markov_chain(0))))
    # Learned the chain: near its entropy rate (a held-out sample may land a little below).
    assert 0.9 * floor < perplexities[-1] < 1.2 * floor
    kinds = [record.type for _, _, record in journal.records]
    assert kinds == ["run_record", "fit_started", "fit_ended"]
    assert json.loads((out / "tracking" / "run.json").read_text())["data"]["name"] == "markov_chain"
    assert journal.params["optimizer/learning_rate"] == 0.003
    assert [name for name, _, _ in journal.artifacts] == ["samples", "samples"]


def test_the_synthetic_chain_rows_are_valid_token_rows():
    transitions = markov_chain(0)
    np.testing.assert_allclose(transitions.sum(axis=1), 1.0)
    rows = sample_rows(transitions, 64, np.random.default_rng(0))
    assert rows.shape == (64, 33)
    assert rows.min() >= 0
    assert rows.max() < 16
    assert 0 < entropy_rate(transitions) < np.log(16)


def test_bad_steps_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["train", "--steps", "0"])
    assert caught.value.code == 2
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("dew") is None, reason="the console script is not on PATH")
def test_console_script_is_installed(tmp_path):
    result = subprocess.run(
        ["dew", "train", "--out", str(tmp_path / "run"), "--steps", "10"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "step 10  lm/train/loss" in result.stdout
    assert "validation perplexity" in result.stdout
