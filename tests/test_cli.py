"""The `dew` command."""

import json
import shutil
import subprocess
import sys

import pytest

from dew.cli import main
from dew.naming import parse_metric_tag
from dew.telemetry.records import record_from_dict


def test_dew_train_trains_and_tracks_to_a_local_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--epochs", "40"]) == 0
    printed = capsys.readouterr().out
    assert f"tracking written to {out}" in printed

    scalars = [json.loads(line) for line in (out / "scalars.jsonl").read_text().splitlines()]
    tags = {line["tag"] for line in scalars}
    assert tags == {"supervised/train/loss", "supervised/validation/loss"}
    for tag in tags:
        parse_metric_tag(tag)
        losses = [line["value"] for line in scalars if line["tag"] == tag]
        assert [line["step"] for line in scalars if line["tag"] == tag] == list(range(40))
        assert losses[-1] < 1e-2 * losses[0]

    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    kinds = [record_from_dict(line["record"]).type for line in records]
    assert kinds == ["run_record", "fit_started", "fit_ended"]
    params = json.loads((out / "params.json").read_text())
    assert params["optimizer/learning_rate"] == 0.1


def test_fitted_line_is_close_to_the_truth(tmp_path, capsys):
    main(["train", "--out", str(tmp_path), "--epochs", "60"])
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("fitted"))
    weight, bias = float(line.split()[3]), float(line.split()[6])
    assert abs(weight - 3.0) < 0.1
    assert abs(bias - 2.0) < 0.01


def test_bad_epochs_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["train", "--epochs", "0"])
    assert caught.value.code == 2
    assert "--epochs must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("dew") is None, reason="the console script is not on PATH")
def test_console_script_is_installed(tmp_path):
    result = subprocess.run(
        ["dew", "train", "--out", str(tmp_path / "run"), "--epochs", "5"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "supervised/validation/loss" in result.stdout
    assert sys.executable
