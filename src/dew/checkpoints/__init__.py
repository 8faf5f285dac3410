"""Asynchronous checkpoints of a `TrainState` with orbax-checkpoint, and resume.

A `Checkpointer` owns one directory of step-numbered checkpoints: a local folder, a
`file://` URI naming one, or a `gs://` bucket. `save` submits a save and returns once
orbax holds its own copy of the arrays; the files are written in the background and
become visible (atomically, under the step's folder) when complete, so a process killed
mid-save leaves the previous checkpoint as the latest. `wait` blocks until every
submitted save is durable, and raises when one failed.

What a checkpoint holds: every array leaf of the state (the step, the parameters,
the optimizer state, the run key as raw key data, the EMA), plus a JSON side item
with the metric history and the early stopper's state, so a resumed run continues
its curves and its patience where they were. `restore` restores the newest intact
checkpoint: a damaged newer one is passed over, with a `DamagedCheckpointWarning`.

```python
>>> import tempfile, jax, jax.numpy as jnp, optax
>>> from dew.checkpoints import Checkpointer
>>> from dew.nn.backbones.causal_transformer import CausalTransformer
>>> from dew.objectives.lm import LMObjective
>>> from dew.steps import TrainState
>>> model = CausalTransformer(4, 16, 1, 2, 32, 16, key=jax.random.key(0))
>>> objective = LMObjective(model, seq_len=8)
>>> state = TrainState.create(objective, optax.adam(1e-2), key=jax.random.key(0))
>>> with Checkpointer(tempfile.mkdtemp()) as checkpoints:
...     checkpoints.save(0, state)
...     checkpoints.wait()
...     restored, extra = checkpoints.restore(state)
>>> same = jax.tree.map(lambda a, b: bool(jnp.all(a == b)), restored.params, state.params)
>>> checkpoints.latest_step(), all(jax.tree.leaves(same))
(0, True)

```
"""

from typing import TYPE_CHECKING

from dew._lazy import lazy_names

if TYPE_CHECKING:  # the names as type checkers, IDEs and the reference site see them
    from dew.checkpoints._checkpointer import Checkpointer as Checkpointer
    from dew.checkpoints._damage import DamagedCheckpointWarning as DamagedCheckpointWarning
    from dew.checkpoints._layout import history_from_json as history_from_json
    from dew.checkpoints._layout import history_to_json as history_to_json

__all__ = ["Checkpointer", "DamagedCheckpointWarning", "history_from_json", "history_to_json"]

# Each public name and the module it comes from, imported when the name is first used: a
# configuration checks its checkpoint_dir with `dew.checkpoints._location` without orbax.
_HOMES = {
    "Checkpointer": "dew.checkpoints._checkpointer",
    "DamagedCheckpointWarning": "dew.checkpoints._damage",
    "history_from_json": "dew.checkpoints._layout",
    "history_to_json": "dew.checkpoints._layout",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
