"""What `dew train` prints: the configuration, the model summary, the bar's postfix, the
end-of-run summary naming each value's step, and the evaluation counts only when asked."""

import math
import os
import subprocess
import sys

import equinox as eqx
import jax
import pytest
from _builders import TINY

from dew._loop import LoopEngine, telling, verbose_console
from dew._throughput import THROUGHPUT
from dew.cli import main
from dew.cli._console import (
    best,
    config_lines,
    end_lines,
    has_direction,
    higher_is_better,
    model_lines,
    parameter_counts,
    summary,
)
from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig, builtin
from dew.naming import Split
from dew.registry import datasets
from dew.steps import EMPTY_HISTORY
from dew.tracking import read_journal


def _config(tmp_path, **trainer):
    return RunConfig(
        model=ModelConfig("causal_transformer", TINY),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            **{
                "name": "tiny",
                "checkpoint_dir": str(tmp_path / "runs"),
                "steps": 5,
                "batch_size": 8,
                "log_every": 2,
                "eval_every": 2,
                "checkpoint_every": None,
                **trainer,
            }
        ),
    )


def test_the_summary_names_the_step_of_each_value_logged_before_the_last():
    history = {"lm/train/loss": [(2, 3.0), (6, 2.5)], "lm/validation/loss": [(4, 2.75)]}
    assert summary(history, 6) == "lm/train/loss 2.5000  lm/validation/loss 2.7500 (step 4)"
    assert summary(history) == summary(history, 6)  # the latest step by default


def test_a_metric_direction_and_its_best_value():
    assert higher_is_better("token_accuracy") and higher_is_better("lm/validation/psnr")
    assert not higher_is_better("perplexity") and not higher_is_better("vision/validation/fid")
    series = [(1, 3.0), (2, math.nan), (3, 1.0), (4, 1.0), (5, 2.0)]
    assert best(series, "loss") == (3, 1.0)  # the earliest of ties; NaN never wins
    assert best(series, "accuracy") == (1, 3.0)
    assert best([(1, math.nan)], "loss") is None


def test_a_statistic_to_compare_with_the_data_has_no_best_value():
    # A sample's foreground share is better near the real rows' share, not higher or lower.
    assert has_direction("diffusion/validation/class_accuracy") and has_direction("fid")
    assert has_direction("foreground_colour_spread")  # 0 for one flat colour: lower is better
    for metric in ("foreground_fraction", "diffusion/validation/foreground_parts", "real_x"):
        assert not has_direction(metric)
    history = {
        "diffusion/validation/class_accuracy": [(5, 0.5), (10, 0.75)],
        "diffusion/validation/foreground_fraction": [(5, 0.4), (10, 0.2)],
    }
    lines = end_lines(history, step=10, trained=10, seconds=1.0)
    assert lines[2].endswith("last 0.7500 (step 10)  best 0.7500 (step 10, higher is better)")
    assert lines[3].endswith("diffusion/validation/foreground_fraction  last 0.2000 (step 10)")


def test_the_summary_shows_only_the_throughput_this_command_measured():
    """A rerun that turned `trainer.log_throughput` off (or had nothing to train) shows no
    earlier command's speed beside its own steps/s."""
    history = {
        "lm/train/loss": [(6, 2.0), (12, 1.5)],
        "lm/train/tokens_per_second": [(4, 900.0), (6, 1000.0)],
    }
    measured = end_lines(history, step=6, trained=6, seconds=1.0)
    assert measured[2] == "  throughput  lm/train/tokens_per_second 1,000.0 (step 6)"
    for trained in (6, 0):  # steps 7-12 without the rates; a rerun with nothing to train
        lines = end_lines(history, step=12, trained=trained, seconds=1.0)
        assert not any("throughput" in line for line in lines), lines
        assert "tokens_per_second" not in lines[0]


def test_the_end_of_run_summary_gives_speed_and_each_validation_metrics_last_and_best():
    history = {
        "lm/train/loss": [(10, 2.0)],
        "lm/validation/perplexity": [(4, 9.0), (8, 7.0), (10, 7.5)],
        "lm/validation/token_accuracy": [(4, 0.2), (8, 0.4), (10, 0.3)],
    }
    lines = end_lines(history, step=10, trained=6, seconds=2.0)
    assert lines[0] == f"step 10  {summary(history, 10)}"
    assert lines[1] == "  6 steps in 2.0 s (3.00 steps/s)"
    again = end_lines(history, step=10, trained=0, seconds=0.5)[1]
    assert again == "  nothing to train: the run was at step 10 (0.5 s)"
    perplexity, accuracy = lines[2].split(), lines[3].split()
    assert perplexity[:4] == ["lm/validation/perplexity", "last", "7.5000", "(step"]
    assert perplexity[5:8] == ["best", "7.0000", "(step"] and "lower" in lines[2]
    assert accuracy[5:7] == ["best", "0.4000"] and "higher" in lines[3]


def test_the_model_summary_counts_each_top_level_modules_parameters():
    model = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0))
    arrays = jax.tree.leaves(eqx.filter(model, eqx.is_array))
    total = sum(leaf.size for leaf in arrays)
    assert parameter_counts(model) == [("layers", total)]
    assert model_lines(model)[0] == f"model MLP: {total:,} parameters"
    # On shapes (what the command builds: no parameter initialised), a wrapper's fields.
    config = builtin("tiny_lm")
    shaped = eqx.filter_eval_shape(config.model.build, key=jax.random.key(0))
    counts = dict(parameter_counts(shaped))
    assert "stack.token_embedding" in counts and "stack.blocks" in counts
    real = config.model.build(key=jax.random.key(0))
    leaves = jax.tree.leaves(eqx.filter(real, eqx.is_array))
    assert sum(counts.values()) == sum(leaf.size for leaf in leaves)
    assert model_lines(shaped)[0] == f"model CausalTransformer: {sum(counts.values()):,} parameters"


def test_the_configuration_prints_one_line_per_section(tmp_path):
    lines = config_lines(_config(tmp_path))
    assert lines[0] == "config"
    sections = [line.split()[0] for line in lines[1:]]
    assert sections == ["model", "data", "optim", "trainer", "objective"]
    assert lines[1].split()[1:3] == ["causal_transformer", "vocab_size=16"]
    assert "learning_rate=0.01" in lines[3] and "name=tiny" in lines[4]


def test_the_bars_postfix_holds_the_loss_and_the_latest_validation_values():
    engine = LoopEngine(stage="lm", current=lambda: None, history=EMPTY_HISTORY)
    engine.report("step_end", Split.TRAIN, 2, {"loss": 2.5})
    engine.report("validation_end", Split.VALIDATION, 2, {"loss": 2.75, "perplexity": 9.0})
    engine.report("step_end", Split.TRAIN, 4, {"loss": 2.25})
    assert engine.postfix == {"loss": "2.2500", "val_loss": "2.7500", "val_perplexity": "9.0000"}
    engine.bar.close()


def test_the_counts_line_says_something_or_is_asked_for():
    assert not telling(False)  # one process, even shards
    assert telling(True)
    with verbose_console():
        assert telling(False)
    assert not telling(False)


def test_the_trainers_counts_note_is_empty_unless_it_says_something():
    engine = LoopEngine(stage="lm", current=lambda: None, history=EMPTY_HISTORY)
    assert engine.counts_note(6, 164, False, "ab12") == ""
    assert engine.counts_note(6, 164, True, "ab12").startswith("\n  evaluation/coordinated")
    with verbose_console():
        assert "evaluation/uneven_shards False  event key ab12" in engine.counts_note(
            6, 164, False, "ab12"
        )
    engine.bar.close()


def test_the_counts_note_fetches_the_event_key_only_when_it_is_shown():
    # Before, every validation event fetched its key from the device for a note nobody saw.
    engine = LoopEngine(stage="lm", current=lambda: None, history=EMPTY_HISTORY)
    made: list[int] = []

    def text() -> str:
        made.append(1)
        return "ab12"

    assert engine.counts_note(6, 164, False, text) == "" and not made
    assert "event key ab12" in engine.counts_note(6, 164, True, text) and made == [1]
    engine.bar.close()


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_quiet_and_verbose_together_are_refused(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)  # tiny_lm's runs/ would be here
    space = tmp_path / "space.toml"
    space.write_text('"optim.learning_rate" = [0.1]\n')
    arguments = [command, "tiny_lm", *([str(space), "--trials", "1"] * (command == "sweep"))]
    assert main([*arguments, "--quiet", "--verbose"]) == 2
    assert "--quiet prints no evaluation lines for --verbose" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_dew_train_prints_the_config_model_and_summary_and_hides_the_counts(tmp_path):
    path = tmp_path / "run.toml"
    _config(tmp_path).dump_toml(path)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-m", "dew.cli", "train", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout
    lines = printed.splitlines()
    assert lines[0] == "config" and lines[6].startswith("model CausalTransformer: ")
    assert "evaluation/coordinated_batches" not in printed and "event key" not in printed
    journal = read_journal(tmp_path / "runs" / "tiny")
    # The last "step 5" line is the summary (the final evaluation's own line comes before it).
    final = [line for line in lines if line.startswith("step 5  ")][-1]
    # dew train reports the training speed by default (decision 0087), on its own line
    (speeds,) = [line for line in lines if line.startswith("  throughput  ")]
    for tag, series in journal.scalars.items():  # each value with its step, when older
        at, value = series[-1]
        if tag.split("/")[-1] in THROUGHPUT:
            assert f"{tag} {value:,.1f} (step {at})" in speeds and tag not in final
        else:
            assert f"{tag} {value:.4f}" + (f" (step {at})" if at != 5 else "") in final
    assert "lm/train/tokens_per_second" in journal.scalars
    assert any(line.startswith("  5 steps in ") and "steps/s" in line for line in lines)
    validation = [tag for tag in journal.scalars if "/validation/" in tag]
    assert validation
    for tag in validation:
        (row,) = [line for line in lines if line.split()[:2] == [tag, "last"]]
        values = [value for _, value in journal.scalars[tag]]
        top = max(values) if higher_is_better(tag) else min(values)
        assert f"best {top:.4f}" in row
