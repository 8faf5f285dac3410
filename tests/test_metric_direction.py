"""A metric knows its direction (decision 0064): each built-in declares it, a fit records its
metrics' directions in `FitStarted`, and the console's best values, `dew runs --sort`, `dew
sweep`'s default direction and the early stopper's default mode read them; runs recorded
before (no `metric_directions`) read by the names, as they always did."""

import argparse
import inspect
import json
import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _builders import tiny_lm_objective
from _checks import rejects

from dew import Trainer, metrics
from dew._directions import check_direction, guessed_direction
from dew._loop import LoopEngine
from dew.artifacts import Artifact, TokenScores
from dew.cli import main
from dew.cli._commands import _sweep_direction
from dew.cli._console import best, end_lines, has_direction, higher_is_better
from dew.config.sweep import optuna_search
from dew.data import Dataset
from dew.metrics import MeanState, Metric
from dew.metrics._classification import (
    AUROC,
    F1,
    Accuracy,
    CrossEntropy,
    ExpectedCalibrationError,
    Precision,
    Recall,
    TopKAccuracy,
)
from dew.metrics._fid import FID
from dew.metrics._images import MAE, MSE, PSNR, SSIM, VideoPSNR, VideoSSIM
from dew.metrics._probes import KNNProbe, LinearProbe
from dew.metrics._regression import RMSE, PointCRPS, RowLoss
from dew.metrics._samples import (
    ClassAccuracy,
    ForegroundColourSpread,
    ForegroundFraction,
    ForegroundParts,
)
from dew.metrics._tokens import MeanLoss, Perplexity, TokenAccuracy
from dew.naming import Split
from dew.steps import EMPTY_HISTORY
from dew.supervised import EarlyStopper
from dew.telemetry.records import FitStarted
from dew.tracking import InMemoryTracker, LocalTracker

BUILT_IN = [  # each built-in metric class and the direction it declares
    (Perplexity, "minimize"),
    (MeanLoss, "minimize"),
    (TokenAccuracy, "maximize"),
    (MSE, "minimize"),
    (MAE, "minimize"),
    (PSNR, "maximize"),
    (SSIM, "maximize"),
    (VideoPSNR, "maximize"),
    (VideoSSIM, "maximize"),
    (LinearProbe, "maximize"),
    (KNNProbe, "maximize"),
    (RowLoss, "minimize"),
    (RMSE, "minimize"),
    (PointCRPS, "minimize"),
    (Accuracy, "maximize"),
    (TopKAccuracy, "maximize"),
    (CrossEntropy, "minimize"),
    (Precision, "maximize"),
    (Recall, "maximize"),
    (F1, "maximize"),
    (ExpectedCalibrationError, "minimize"),
    (AUROC, "maximize"),
    (FID, "minimize"),
    (metrics._clip.CLIPScore, "maximize"),
    (ClassAccuracy, "maximize"),
]


@pytest.mark.parametrize(("kind", "direction"), BUILT_IN, ids=[k.__name__ for k, _ in BUILT_IN])
def test_each_built_in_metric_declares_its_direction(kind, direction):
    assert kind.direction == direction
    # ... the one its default name suggests, so runs recorded before read as they did.
    assert guessed_direction(kind.name) == direction


def test_the_factories_metrics_carry_their_classes_direction():
    built = [
        metrics.perplexity(),
        metrics.token_accuracy(),
        metrics.psnr(),
        metrics.loss(),
        metrics.top_k_accuracy(3),
        metrics.f1(3),
        metrics.expected_calibration_error(),
        metrics.auroc(),
    ]
    assert [metric.direction for metric in built] == [
        "minimize",
        "maximize",
        "maximize",
        "minimize",
        "maximize",
        "maximize",
        "minimize",
        "maximize",
    ]
    per_class = metrics.precision(3, average=None)  # a set: each class's, its own none
    assert per_class.direction is None
    assert per_class.directions == dict.fromkeys(
        ["precision_class_0", "precision_class_1", "precision_class_2"], "maximize"
    )


def test_a_sample_statistic_best_near_the_data_has_no_direction():
    assert ForegroundFraction().direction is None
    assert ForegroundParts().direction is None
    assert ForegroundColourSpread().direction == "minimize"  # 0: one flat colour
    for kind in (ForegroundFraction, ForegroundColourSpread):
        assert kind(population="reference", name="real_x").direction is None


def test_every_metric_class_dew_exports_declares_a_direction_itself():
    # The base class's guess from the name is for users' metrics; dew's own declare theirs.
    exported = [
        kind
        for kind in vars(metrics).values()
        if inspect.isclass(kind)
        and issubclass(kind, Metric)
        and kind not in (Metric, metrics.MetricSet)
    ]
    for kind in exported:
        owner = next(k for k in kind.__mro__ if "direction" in vars(k))
        assert owner is not Metric, kind.__name__


class WinRate(Metric[TokenScores]):
    """The share of counted targets with a loss below 2 nats: better higher, though its name
    holds none of the words the old rule looked for."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    name: str = eqx.field(static=True, default="win_rate")
    direction: ClassVar[str | None] = "maximize"

    def init(self) -> MeanState:
        return MeanState.zero()

    def statistics(self, artifact: TokenScores) -> MeanState:
        return MeanState.of((artifact.losses < 2.0).astype(jnp.float32), artifact.weights)

    def merge(self, accumulated: MeanState, contribution: MeanState) -> MeanState:
        return accumulated.merge(contribution)

    def finalize(self, accumulated: MeanState) -> jax.Array:
        return accumulated.mean()


class Undeclared(WinRate):
    """A user's metric that declares nothing: the guess from its name, as before."""

    name: str = eqx.field(static=True, default="hit_accuracy")
    direction = Metric.direction  # the base's: the name's guess


def test_a_custom_metric_declares_its_direction_or_gets_its_names():
    assert guessed_direction("win_rate") == "minimize"  # what the old rule says
    assert WinRate().direction == "maximize"
    assert Undeclared().direction == "maximize"  # "accuracy" in its name
    assert Undeclared(name="hits").direction == "minimize"


def test_one_vocabulary_with_the_short_forms_read_as_it():
    assert [check_direction(way, "mode") for way in ("min", "max", "minimize", "maximize")] == [
        "minimize",
        "maximize",
        "minimize",
        "maximize",
    ]
    expected = "mode 'up' is not one of 'minimize', 'maximize' (or 'min', 'max')."
    with pytest.raises(ValueError, match=r"^mode 'up'") as caught:
        check_direction("up", "mode")
    assert str(caught.value) == expected
    assert optuna_search(direction="max").direction == "maximize"
    with pytest.raises(ValueError, match="direction 'upward' is not one of 'minimize'"):
        optuna_search(direction="upward")


# -- the console ---------------------------------------------------------------------------


def test_the_console_reads_the_declared_direction_before_the_name():
    declared = {"win_rate": "maximize", "foreground_fraction": None, "odd": None}
    series = [(2, 0.25), (4, 0.75), (6, 0.5)]
    assert best(series, "lm/validation/win_rate", declared) == (4, 0.75)
    assert best(series, "lm/validation/win_rate") == (2, 0.25)  # the old guess: lower
    assert higher_is_better("win_rate", declared) and not higher_is_better("win_rate")
    assert not has_direction("lm/validation/odd", declared) and has_direction("odd")
    history = {"lm/validation/win_rate": series}
    lines = end_lines(history, step=6, trained=6, seconds=1.0, directions=declared)
    assert lines[2].endswith("best 0.7500 (step 4, higher is better)")
    old = end_lines(history, step=6, trained=6, seconds=1.0)
    assert old[2].endswith("best 0.2500 (step 2, lower is better)")


# -- the trainer records the directions, the early stopper reads them --------------------


@pytest.fixture(scope="module")
def objective():
    return tiny_lm_objective(8, seed=3)


def _data():
    rng = np.random.default_rng(7)
    val = rng.integers(0, 8, (8, 9)).astype(np.int32)

    def train(partition):
        while True:
            yield {"text": rng.integers(0, 8, (8, 9)).astype(np.int32)}

    return Dataset(train=train, val=lambda partition: iter([{"text": val}]))


def test_a_fit_records_its_metrics_directions_in_fit_started(objective):
    tracker = InMemoryTracker()
    trainer = Trainer(objective, optax.adam(3e-3), key=jax.random.key(11))
    trainer.fit(
        _data(),
        steps=2,
        log_every=2,
        eval_every=2,
        metrics=(metrics.perplexity(), WinRate()),
        tracker=tracker,
        early_stopper=EarlyStopper(metric="win_rate", patience=5),
        progress=False,
    )
    [(_, started)] = tracker.artifacts["fit_started"]
    assert started.metric_directions == {"perplexity": "minimize", "win_rate": "maximize"}
    assert json.loads(started.to_json())["metric_directions"]["win_rate"] == "maximize"
    assert repr(started) == "FitStarted(stage='lm', start_step=0, steps=2)"  # as before
    assert "metric_directions" not in FitStarted("lm", 0, 2).to_json()  # no metrics: as before


def _engine(stopper, directions=None):
    return LoopEngine(
        stage="s",
        current=lambda: None,
        history=EMPTY_HISTORY,
        early_stopper=stopper,
        metric_directions=directions,
    )


def test_the_early_stoppers_default_mode_is_its_metrics_direction():
    assert EarlyStopper(metric=WinRate()).mode == "maximize"  # the metric itself
    assert EarlyStopper(metric=WinRate()).metric == "win_rate"
    assert EarlyStopper(metric=metrics.perplexity(), patience=2).mode == "minimize"
    assert EarlyStopper(metric=WinRate(), mode="min").mode == "minimize"  # a mode wins
    assert EarlyStopper(metric="loss").mode is None
    assert EarlyStopper(metric="loss").direction == "minimize"  # the name's guess
    assert EarlyStopper(metric="loss", mode="max").mode == "maximize"  # the short forms
    # A bare name: the fit's metric of that name says (Trainer.fit tells the engine).
    engine = _engine(EarlyStopper(metric="win_rate", patience=0), {"win_rate": "maximize"})
    assert engine.early_stopper.mode == "maximize"
    update = engine.update_early_stopping
    assert update(Split.VALIDATION, 1, {"win_rate": 0.2}) is False
    assert update(Split.VALIDATION, 2, {"win_rate": 0.4}) is False  # higher: improved
    assert update(Split.VALIDATION, 3, {"win_rate": 0.3}) is True
    # Undeclared by the fit (or a training metric): the name's guess, as before.
    assert _engine(EarlyStopper(metric="win_rate"), {}).early_stopper.mode is None
    kept = _engine(EarlyStopper(metric="win_rate", mode="min"), {"win_rate": "maximize"})
    assert kept.early_stopper.mode == "minimize"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metric": "loss", "mode": "up"}, r"^mode 'up' is not one of 'minimize', 'maximize'"),
        ({"metric": ForegroundFraction()}, "has no direction .*; pass mode="),
    ],
)
def test_a_stopper_without_a_direction_to_use_raises(kwargs, message):
    with rejects(ValueError, message, parameter=next(reversed(kwargs))):
        EarlyStopper(**kwargs)


# -- dew runs --sort -------------------------------------------------------------------------


def _run(root, name, values, directions):
    """A run folder with `lm/validation/<metric>` values and a `FitStarted` recording
    `directions` (none: the record as written before the field was, without the key)."""
    with LocalTracker(root / name) as tracker:
        tracker.log_artifact("fit_started", FitStarted("lm", 0, 4, directions), step=0)
        tracker.log_metrics({f"lm/validation/{m}": v for m, v in values.items()}, step=4)


def _order(capsys, root, *arguments):
    assert main(["runs", str(root), "--json", *arguments]) == 0
    return [row["run"] for row in json.loads(capsys.readouterr().out)]


def test_runs_sort_reads_the_recorded_direction(tmp_path, capsys):
    declared = {"win_rate": "maximize", "accuracy": "maximize"}
    for name, rate in (("a", 0.2), ("b", 0.8), ("c", 0.5)):
        _run(tmp_path, name, {"win_rate": rate}, declared)
    assert _order(capsys, tmp_path, "--sort", "win_rate") == ["b", "c", "a"]
    assert _order(capsys, tmp_path, "--sort", "win_rate", "--reverse") == ["a", "c", "b"]


def test_runs_recorded_before_directions_sort_by_the_names_as_before(tmp_path, capsys):
    for name, rate, accuracy in (("a", 0.2, 0.9), ("b", 0.8, 0.1), ("c", 0.5, math.nan)):
        _run(tmp_path, name, {"win_rate": rate, "accuracy": accuracy}, {})
    assert "metric_directions" not in (tmp_path / "a" / "records.jsonl").read_text()
    assert _order(capsys, tmp_path, "--sort", "win_rate") == ["a", "c", "b"]  # lower first
    assert _order(capsys, tmp_path, "--sort", "accuracy") == ["a", "b", "c"]  # NaN last


# -- dew sweep's default direction ---------------------------------------------------------


def _ledger(path, direction):
    space = {"optim.learning_rate": {"kind": "choice", "values": [0.1, 0.01]}}
    header = {"version": 1, "space": space, "search": "grid", "config": {}, "trials": []}
    path.write_text(json.dumps({**header, "direction": direction}))
    return str(path)


def test_the_sweeps_default_direction_is_its_scores(tmp_path):
    given = argparse.Namespace(direction=None)
    fresh = str(tmp_path / "none.json")
    scored = (metrics.perplexity(), WinRate())
    assert _sweep_direction(given, "win_rate", scored, fresh) == "maximize"
    assert _sweep_direction(given, "perplexity", scored, fresh) == "minimize"
    assert _sweep_direction(given, "loss", scored, fresh) == "minimize"  # training: its name
    chosen = argparse.Namespace(direction="minimize")
    assert _sweep_direction(chosen, "win_rate", scored, fresh) == "minimize"
    # A rerun without --direction continues as its ledger began.
    ledger = _ledger(tmp_path / "ledger.json", "minimize")
    assert _sweep_direction(given, "win_rate", scored, ledger) == "minimize"
    with pytest.raises(ValueError, match="'foreground_fraction' has no direction"):
        _sweep_direction(given, "foreground_fraction", (ForegroundFraction(),), fresh)


@pytest.mark.slow  # two tiny trials through the command
def test_dew_sweep_maximizes_a_score_that_is_better_higher(tmp_path, capsys):
    from _ledgers import ledger_json

    from dew.config import ModelConfig, OptimConfig, RunConfig, TrainerConfig
    from dew.registry import datasets

    sizes = {"vocab_size": 16, "emb_features": 16, "num_layers": 1, "num_heads": 2}
    config = RunConfig(
        model=ModelConfig("causal_transformer", {**sizes, "mlp_features": 32, "max_seq_len": 16}),
        data=datasets["token_windows"](seq_len=8, num_tokens=2048),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-2),
        trainer=TrainerConfig(
            name="tiny",
            checkpoint_dir=str(tmp_path / "runs"),
            steps=6,
            batch_size=8,
            log_every=3,
            eval_every=6,
            checkpoint_every=None,
        ),
    )
    config.dump_toml(tmp_path / "run.toml")
    (tmp_path / "space.toml").write_text('"optim.learning_rate" = [0.03, 0.0001]\n')
    arguments = ["sweep", str(tmp_path / "run.toml"), str(tmp_path / "space.toml")]
    arguments += ["--trials", "2", "--search", "grid", "--quiet", "--metric", "token_accuracy"]
    assert main(arguments) == 0
    printed = capsys.readouterr().out.splitlines()
    ledger = ledger_json(tmp_path / "runs" / "tiny" / "ledger.json")
    assert ledger["direction"] == "maximize"  # token_accuracy's own, no --direction given
    values = {trial["index"]: trial["value"] for trial in ledger["trials"]}
    top = max(values, key=values.get)
    assert printed[-1].startswith(f"best trial {top}  token_accuracy {values[top]:.4f}")
