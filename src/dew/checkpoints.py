"""Asynchronous checkpoints of a `TrainState` with orbax-checkpoint, and resume.

A `Checkpointer` owns one directory of step-numbered checkpoints. `save` submits a
save and returns once orbax holds its own copy of the arrays; the files are written
in the background and become visible (atomically, under the step's folder) when
complete, so a process killed mid-save leaves the previous checkpoint as the latest.
`wait` blocks until every submitted save is durable.

What a checkpoint holds: every array leaf of the state (the step, the parameters,
the optimizer state, the run key as raw key data, the EMA), plus a JSON side item
with the metric history and the early stopper's state, so a resumed run continues
its curves and its patience where they were.

```python
>>> import tempfile, jax, jax.numpy as jnp, optax
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

import os
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.steps import MetricHistory, TrainState
from dew.telemetry.records import decode_json_value, encode_json_value

__all__ = ["Checkpointer", "history_from_json", "history_to_json"]

STATE_ITEM = "state"
EXTRA_ITEM = "extra"


def _orbax() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import orbax.checkpoint as ocp
    except ImportError as error:  # pragma: no cover - a core dependency
        raise ImportError(
            'checkpoints need orbax-checkpoint: pip install "dew-ml[checkpoint]".'
        ) from error
    return ocp


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


_SHOWN_DIFFERENCES = 6


def _shape_dtype(leaf: Any) -> tuple[tuple[int, ...], str]:
    """A state leaf's shape and dtype as a checkpoint holds it (keys as raw key data)."""
    if _is_key(leaf):
        leaf = jax.random.key_data(leaf)
    return tuple(jnp.shape(leaf)), str(np.dtype(jnp.result_type(leaf)))


def _describe(shape: tuple[int, ...], dtype: str) -> str:
    return f"{dtype}[{', '.join(str(size) for size in shape)}]"


def history_to_json(history: MetricHistory) -> dict[str, Any]:
    """The history as JSON data (non-finite values as `"NaN"`, `"+Inf"`, `"-Inf"`)."""
    return encode_json_value(
        {tag: [list(point) for point in series] for tag, series in history.items()}
    )


def history_from_json(data: Mapping[str, Any]) -> MetricHistory:
    """Inverse of `history_to_json`."""
    decoded = decode_json_value(dict(data))
    return MetricHistory(
        {
            tag: tuple((int(step), value) for step, value in series)
            for tag, series in decoded.items()
        }
    )


def _abstract(leaf: Any) -> jax.ShapeDtypeStruct:
    """What orbax restores a template leaf as: its shape and dtype (keys as raw key data)
    and, for a leaf placed over several devices (a multi-process fit's global arrays),
    its sharding, so every process restores straight into its shards."""
    data = jax.random.key_data(leaf) if _is_key(leaf) else leaf
    sharding = None
    if isinstance(data, jax.Array) and not isinstance(
        data.sharding, jax.sharding.SingleDeviceSharding
    ):
        sharding = data.sharding
    return jax.ShapeDtypeStruct(jnp.shape(data), jnp.result_type(data), sharding=sharding)


class Checkpointer:
    """Step-numbered asynchronous checkpoints of a `TrainState` under `directory`.

    **Arguments:**

    - `directory`: a local path or any URI orbax writes (created if absent).
    - `max_to_keep`: keep only the newest this many checkpoints (`None`: all).

    Under `jax.distributed` every process creates the `Checkpointer` on the same
    directory and calls `save`, `restore` and `close` at the same points (orbax's
    multi-process saving: one copy on disk, the JSON item written by process zero).
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_to_keep: int | None = None):
        ocp = _orbax()
        self.directory = str(directory)
        if "://" not in self.directory:
            self.directory = str(pathlib.Path(self.directory).absolute())
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=True,
            create=True,
            # Under jax.distributed every process takes part in each save and restore (each
            # writes the shards it holds, one copy of each); process zero alone writes the
            # metadata and the JSON item and finalizes the step.
            multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=0),
        )
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            # Registered handlers let `item_metadata` read a checkpoint before restoring it.
            item_handlers={
                STATE_ITEM: ocp.StandardCheckpointHandler(),
                EXTRA_ITEM: ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or `None`."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """The steps of every complete checkpoint, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: TrainState, extra: Mapping[str, Any] | None = None) -> None:
        """Submit a save of `state` (and JSON `extra`) as checkpoint `step`; does not wait.

        The arrays are copied first, so the caller may donate or delete `state`'s
        buffers as soon as this returns.
        """
        leaves = [
            jax.random.key_data(leaf) if _is_key(leaf) else jnp.array(leaf, copy=True)
            for leaf in jax.tree.leaves(state)
        ]
        payload = {
            "history": history_to_json(state.metric_history),
            **encode_json_value(dict(extra or {})),
        }
        ocp = self._ocp
        self._manager.save(
            int(step),
            args=ocp.args.Composite(
                **{
                    STATE_ITEM: ocp.args.StandardSave(leaves),
                    EXTRA_ITEM: ocp.args.JsonSave(payload),
                }
            ),
        )

    def restore(
        self, template: TrainState, step: int | None = None
    ) -> tuple[TrainState, dict[str, Any]]:
        """Checkpoint `step` (default: the latest) restored into `template`'s structure.

        Returns the state (with its saved metric history) and the JSON `extra` saved
        with it. Raises `FileNotFoundError` when there is no such checkpoint.
        """
        if step is None:
            step = self.latest_step()
        if step is None or step not in self._manager.all_steps():
            raise FileNotFoundError(
                f"no checkpoint {'at all' if step is None else f'for step {step}'} under "
                f"{self.directory!r}; its steps are {self.all_steps()}."
            )
        self._check_structure(step, template)
        template_leaves, treedef = jax.tree.flatten(template)
        abstract = [_abstract(leaf) for leaf in template_leaves]
        ocp = self._ocp
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{
                    STATE_ITEM: ocp.args.StandardRestore(abstract),
                    EXTRA_ITEM: ocp.args.JsonRestore(),
                }
            ),
        )
        leaves = [
            jax.random.wrap_key_data(saved, impl=jax.random.key_impl(leaf))
            if _is_key(leaf)
            else jnp.asarray(saved)
            for saved, leaf in zip(restored[STATE_ITEM], template_leaves, strict=True)
        ]
        extra = dict(decode_json_value(dict(restored[EXTRA_ITEM] or {})))
        history = history_from_json(extra.pop("history", {}))
        state = jax.tree.unflatten(treedef, leaves)
        return (
            TrainState(
                state.step, state.params, state.opt_state, state.key, state.ema_params, history
            ),
            extra,
        )

    def _check_structure(self, step: int, template: TrainState) -> None:
        """Raise a short `ValueError` when checkpoint `step`'s saved arrays (read from
        orbax's metadata, without restoring) differ in number, shape or dtype from
        `template`'s: a checkpoint written for another model or optimizer."""
        try:
            saved = [
                (tuple(leaf.shape), str(np.dtype(leaf.dtype)))
                for leaf in self._manager.item_metadata(step)[STATE_ITEM].tree
            ]
        except Exception:
            return
        expected = [
            (jax.tree_util.keystr(path), *_shape_dtype(leaf))
            for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]
        ]
        differing = [
            f"  {path}: saved {_describe(*saved[index])}, expected {_describe(shape, dtype)}"
            if index < len(saved)
            else f"  {path}: not saved, expected {_describe(shape, dtype)}"
            for index, (path, shape, dtype) in enumerate(expected)
            if index >= len(saved) or saved[index] != (shape, dtype)
        ]
        differing += [
            f"  saved array {index} ({_describe(*saved[index])}): not in this state"
            for index in range(len(expected), len(saved))
        ]
        if not differing:
            return
        shown = differing[:_SHOWN_DIFFERENCES]
        if len(differing) > len(shown):
            shown.append(f"  ... and {len(differing) - len(shown)} more")
        lines = "\n".join(shown)
        raise ValueError(
            f"the checkpoint at step {step} under {self.directory!r} was written for another "
            f"model or optimizer: it holds {len(saved)} arrays, this state {len(expected)}, "
            f"and they differ at\n{lines}\nResume with the model and optimizer that wrote "
            "it, or use a new checkpoint directory."
        )

    def wait(self) -> None:
        """Block until every submitted save is durable."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
