"""The built-in quick-start run behind `dew train` with no arguments.

It fits a one-feature linear regression with an Equinox `Linear` and optax SGD,
reports every epoch as `TrainingEvent`s through `TrackerEventSink`, and writes
what the tracker received to a local run folder.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from dew.events import TrackerEventSink, TrainingEvent
from dew.naming import Split
from dew.telemetry.records import FitEnded, FitStarted, RunRecord, encode_json_value
from dew.tracking import InMemoryTracker

STAGE = "supervised"


def _squared_error(model: eqx.nn.Linear, inputs: jax.Array, targets: jax.Array) -> jax.Array:
    predictions = jax.vmap(model)(inputs)
    return jnp.mean(jnp.square(predictions - targets))


def run_quickstart(
    out: str | pathlib.Path = "runs/quickstart",
    *,
    epochs: int = 60,
    learning_rate: float = 0.1,
    seed: int = 0,
    echo: Callable[[str], None] = print,
) -> InMemoryTracker:
    """Train the quick-start regression, write its tracking to `out` and return the tracker."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = jnp.linspace(-1.0, 1.0, 32).reshape(-1, 1)
    targets = 3.0 * inputs + 2.0
    validation_inputs = jnp.linspace(-0.95, 0.95, 16).reshape(-1, 1)
    validation_targets = 3.0 * validation_inputs + 2.0

    model = eqx.nn.Linear(1, 1, key=jax.random.key(seed))
    optimizer = optax.sgd(learning_rate)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def train_step(model, opt_state):
        loss, grads = eqx.filter_value_and_grad(_squared_error)(model, inputs, targets)
        updates, opt_state = optimizer.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state, loss

    tracker = InMemoryTracker()
    sink = TrackerEventSink(tracker)
    tracker.log_params(
        {
            "model": {"name": "linear", "in_features": 1, "out_features": 1},
            "optimizer": {"name": "sgd", "learning_rate": learning_rate},
            "trainer": {"epochs": epochs, "seed": seed},
        }
    )
    tracker.log_artifact(
        "run_record",
        RunRecord(
            model={"name": "linear", "in_features": 1, "out_features": 1},
            data={"train": {"samples": 32}, "validation": {"samples": 16}},
            optimizer={"name": "sgd", "learning_rate": learning_rate},
            trainer={"epochs": epochs, "seed": seed},
        ),
    )
    tracker.log_artifact("fit_started", FitStarted(stage=STAGE, start_step=0, steps=epochs), step=0)
    for epoch in range(epochs):
        model, opt_state, loss = train_step(model, opt_state)
        validation_loss = _squared_error(model, validation_inputs, validation_targets)
        sink.on_event(
            TrainingEvent("epoch_end", STAGE, Split.TRAIN, epoch, model, {"loss": float(loss)})
        )
        sink.on_event(
            TrainingEvent(
                "validation_end",
                STAGE,
                Split.VALIDATION,
                epoch,
                model,
                {"loss": float(validation_loss)},
            )
        )
        if epoch % 5 == 4 or epoch == epochs - 1:
            echo(
                f"epoch {epoch:3d}  {STAGE}/train/loss {float(loss):.6f}  "
                f"{STAGE}/validation/loss {float(validation_loss):.6f}"
            )
    tracker.log_artifact("fit_ended", FitEnded(status="completed", step=epochs), step=epochs)
    tracker.close()

    weight, bias = float(model.weight[0, 0]), float(model.bias[0])
    echo(f"fitted y = {weight:.4f} x + {bias:.4f} (true: y = 3 x + 2)")
    (out / "params.json").write_text(json.dumps(tracker.params, indent=2, sort_keys=True) + "\n")
    with (out / "scalars.jsonl").open("w") as journal:
        for tag, series in tracker.scalars.items():
            for step, value in series:
                line = {"tag": tag, "step": step, "value": encode_json_value(value)}
                journal.write(json.dumps(line, allow_nan=False) + "\n")
    with (out / "records.jsonl").open("w") as journal:
        for series in tracker.artifacts.values():
            for step, record in series:
                journal.write(json.dumps({"step": step, "record": record.to_dict()}) + "\n")
    echo(f"tracking written to {out}")
    return tracker
