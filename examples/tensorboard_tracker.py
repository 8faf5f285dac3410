"""A TensorBoard tracker in a handful of lines: the file to copy into your own project.

Any class with these four methods is a `dew.tracking.Tracker`, and
`dew.events.TrackerEventSink` feeds it a run's metrics under their
`stage/split/metric` tags. It needs `tensorboard` only, not TensorFlow. (dew
also ships `dew.tracking.tensorboard.TensorBoardTracker`, which adds images,
clips, histograms and HParams.)

    python examples/tensorboard_tracker.py runs/example && tensorboard --logdir runs/example
"""

import sys
import time

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from dew.naming import flatten_parameters


class TensorBoardTracker:
    """Writes parameters, scalars and notes to one TensorBoard event file."""

    def __init__(self, logdir):
        self.writer = EventFileWriter(str(logdir))

    def _write(self, summary, step):
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
        self.writer.flush()  # the report is in the file when the call returns

    def log_params(self, values):
        rows = [f"| {path} | {value} |" for path, value in flatten_parameters(values).items()]
        table = "\n".join(["| parameter | value |", "| --- | --- |", *rows])
        self._write(text_pb("params", table), step=0)

    def log_metrics(self, values, *, step):
        scalars = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()]
        self._write(Summary(value=scalars), step)

    def log_artifact(self, name, value, *, step=None):
        self._write(text_pb(f"artifacts/{name}", str(value)), step or 0)

    def close(self):
        self.writer.close()


def main(logdir="runs/tensorboard_example"):
    """Three epochs of a small regression, reported through `TrackerEventSink`."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dew.events import TrackerEventSink, TrainingEvent
    from dew.naming import Split

    inputs = jnp.linspace(-1.0, 1.0, 32).reshape(-1, 1)
    held_out = jnp.linspace(-0.9, 0.9, 8).reshape(-1, 1)
    model = eqx.nn.Linear(1, 1, key=jax.random.key(0))
    optimizer = optax.sgd(learning_rate=0.1)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    def squared_error(model, x):
        return jnp.mean(jnp.square(jax.vmap(model)(x) - (3.0 * x + 2.0)))

    @eqx.filter_jit
    def train_step(model, opt_state):
        loss, grads = eqx.filter_value_and_grad(squared_error)(model, inputs)
        updates, opt_state = optimizer.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state, loss

    tracker = TensorBoardTracker(logdir)
    sink = TrackerEventSink(tracker)
    try:
        tracker.log_params({"optimizer": {"name": "sgd", "learning_rate": 0.1}})
        for epoch in range(3):
            model, opt_state, loss = train_step(model, opt_state)
            train = {"loss": loss}
            sink.on_event(
                TrainingEvent("epoch_end", "supervised", Split.TRAIN, epoch, metrics=train)
            )
            held = {"loss": squared_error(model, held_out)}
            sink.on_event(
                TrainingEvent("validation_end", "supervised", Split.VALIDATION, epoch, metrics=held)
            )
        tracker.log_artifact("notes", "three epochs of SGD")
    finally:
        tracker.close()

    events = EventAccumulator(str(logdir))
    events.Reload()
    print(sorted(events.Tags()["scalars"]))
    print(f"written to {logdir}; view with: tensorboard --logdir {logdir}")


if __name__ == "__main__":
    main(*sys.argv[1:])
