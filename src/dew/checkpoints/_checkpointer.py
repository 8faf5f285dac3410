"""`Checkpointer`: step-numbered asynchronous checkpoints of a `TrainState` in one
directory, on orbax-checkpoint."""

import contextlib
import errno
import os
import pathlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from dew._processes import agree_process_phase, is_multiprocess, is_process_zero
from dew.checkpoints._damage import (
    DamagedCheckpointWarning,
    damage,
    misplaced_steps,
    reason,
    set_aside,
)
from dew.checkpoints._layout import (
    LAYOUT,
    abstract,
    history_from_json,
    history_to_json,
    is_key,
    layout,
    params_positions,
    recorded_arrays,
    saved_leaves,
    structure_differences,
)
from dew.checkpoints._location import checkpoint_location, is_remote
from dew.checkpoints._orbax import disk_error, orbax, quiet_orbax, reading
from dew.steps import TrainState
from dew.telemetry.records import decode_json_value, encode_json_value

__all__ = ["Checkpointer"]

STATE_ITEM = "state"
EXTRA_ITEM = "extra"
ITEMS = (STATE_ITEM, EXTRA_ITEM)

_Restored = TypeVar("_Restored")


class _DamagedStepError(ValueError):
    """A checkpoint step whose files are damaged."""

    def __init__(self, message: str, step: int, why: str) -> None:
        super().__init__(message)
        self.step = step
        self.why = why


class Checkpointer:
    """Step-numbered asynchronous checkpoints of a `TrainState` under `directory`.

    **Arguments:**

    - `directory`: a local folder (created if absent), a `file:///absolute/path` URI
      naming one, or a `gs://bucket/folder` URI (Google Cloud Storage, the remote store
      orbax-checkpoint writes to).
    - `max_to_keep`: keep only the newest this many checkpoints (`None`: all).

    **Raises:**

    `ValueError` for a URI of another scheme; `NotADirectoryError` when `directory` is a
    file. Both before anything is written.

    A save that fails (a full or read-only disk) raises from the next `save`, `wait` or
    `close` as an `OSError` naming the directory, with a note naming the step that was
    not saved; the checkpoints saved before it are untouched.

    Under `jax.distributed` every process creates the `Checkpointer` on the same
    directory and calls `save`, `restore` and `close` at the same points (orbax's
    multi-process saving: one copy on disk, the JSON item written by process zero).
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_to_keep: int | None = None):
        self.directory = checkpoint_location(os.fspath(directory), "checkpoint directory")
        if not is_remote(self.directory):
            folder = pathlib.Path(self.directory).absolute()
            self.directory = str(folder)
            if folder.exists() and not folder.is_dir():  # orbax's save threads would hang
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
        ocp = orbax()
        quiet_orbax()
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
        self._pending: int | None = None  # the step of the save in flight
        with reading():  # orbax reads every step's metadata, a damaged step's too
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=options,
                # Registered handlers let `item_metadata` read a checkpoint before restoring.
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

    def holds_checkpoints(self) -> bool:
        """Whether the directory holds any checkpoint step, complete or damaged (a file
        where a step's folder should be counts)."""
        return bool(self.all_steps() or misplaced_steps(self._path()))

    def _path(self) -> Any:
        from etils import epath

        return epath.Path(self.directory)

    @contextlib.contextmanager
    def _saving(self, step: int | None) -> Iterator[None]:
        """A failed save surfacing here: the operating system's error as an `OSError`
        naming the directory, with a note naming the step that was not saved."""
        try:
            yield
        except Exception as error:
            self._pending = None
            notes = [] if step is None else [self._not_saved(step)]
            found = disk_error(error, self.directory)
            if found is None:
                for note in notes:
                    error.add_note(note)
                raise
            for note in notes:
                found.add_note(note)
            raise found from error

    def _not_saved(self, step: int) -> str:
        latest = self._manager.latest_step()
        if latest is None:
            return f"Checkpoint step {step} was not saved; no checkpoint is complete yet."
        return f"Checkpoint step {step} was not saved; the latest complete one is step {latest}."

    def save(self, step: int, state: TrainState, extra: Mapping[str, Any] | None = None) -> None:
        """Submit a save of `state` (and JSON `extra`) as checkpoint `step`; does not wait.

        orbax copies the arrays to host memory before this returns (no copy on the device
        first), so the caller may donate or delete `state`'s buffers as soon as it has
        returned. An earlier save that failed raises here.
        """
        leaves = saved_leaves(state)
        payload = {
            "history": history_to_json(state.metric_history),
            LAYOUT: layout(state),
            **encode_json_value(dict(extra or {})),
        }
        ocp = self._ocp
        self.wait()
        with self._saving(int(step)):
            self._check_writable()
            self._manager.save(
                int(step),
                args=ocp.args.Composite(
                    **{
                        STATE_ITEM: ocp.args.StandardSave(leaves),
                        EXTRA_ITEM: ocp.args.JsonSave(payload),
                    }
                ),
            )
        self._pending = int(step)

    def _check_writable(self) -> None:
        """A local directory this process cannot write to (a read-only disk, a folder
        without write permission) raises here: orbax would fail in its threads, leaving
        coroutines never awaited to warn at exit."""
        if is_remote(self.directory) or os.access(self.directory, os.W_OK):
            return
        read_only = os.statvfs(self.directory).f_flag & os.ST_RDONLY
        code = errno.EROFS if read_only else errno.EACCES
        raise OSError(code, os.strerror(code), self.directory)

    def restore(
        self, template: TrainState, step: int | None = None
    ) -> tuple[TrainState, dict[str, Any]]:
        """Checkpoint `step` restored into `template`'s structure; by default the newest
        intact one.

        Returns the state (with its saved metric history) and the JSON `extra` saved
        with it. A step is intact when orbax lists it as complete and it restores: a step
        whose files are damaged (a missing item or file, a file cut short), or a file
        standing where a step's folder should be, is passed over for the one before it
        with a `DamagedCheckpointWarning` naming it and why, and renamed `<step>.damaged`
        so a later save of that step finds its place free (nothing is deleted). A run of
        several processes does not pass over a damaged step: it raises on every process.

        **Raises:**

        `FileNotFoundError` when there is no such checkpoint (or none at all);
        `ValueError` naming the directory when no step is intact, when `step` is given
        and damaged, and when the checkpoint was written for another model or optimizer;
        `OSError` naming the directory when it cannot be read (permissions, a store out
        of reach): that is no damage, and no step is passed over for it.
        """
        return self._restore_intact(step, lambda found: self._restore(found, template))

    def restore_params(
        self, params: Any, step: int | None = None, *, ema: bool = False
    ) -> tuple[int, Any]:
        """Only the params of checkpoint `step` (with `ema`, its EMA params), restored into
        `params`' structure (`objective.init_params()`); by default from the newest intact
        step, passing over damaged ones as `restore` does. No other array is read: neither
        the optimizer state nor, with `ema`, the live params.

        Returns `(step, params)`.

        **Raises:** as `restore`; a checkpoint without EMA params asked for them, or whose
        params differ from `params`' (another model), is a `ValueError` naming the step, the
        directory and, for another model, the first leaf that differs.
        """
        return self._restore_intact(
            step, lambda found: (found, self._restore_params(found, params, ema))
        )

    def _restore_intact(self, step: int | None, restore: Callable[[int], _Restored]) -> _Restored:
        """`restore(step)`, or with no `step` `restore` of the newest intact step: the
        damaged ones after it renamed aside, one warning each."""
        if step is not None:
            if step not in self._manager.all_steps():
                raise FileNotFoundError(
                    f"no checkpoint for step {step} under {self.directory!r}; its steps are "
                    f"{self.all_steps()}."
                )
            return restore(step)
        misplaced = misplaced_steps(self._path())
        skipped: dict[int, str] = {}
        restored = None
        for candidate in reversed(self.all_steps()):
            try:
                restored = restore(candidate)
            except _DamagedStepError as damaged:
                skipped[candidate] = damaged.why
                continue
            step = candidate
            break
        skipped |= {found: why for found, why in misplaced.items() if step is None or found > step}
        if restored is None:
            if not skipped:
                raise FileNotFoundError(f"no checkpoint at all under {self.directory!r}.")
            listed = "; ".join(f"step {found}: {why}" for found, why in sorted(skipped.items()))
            raise ValueError(
                f"no intact checkpoint under {self.directory!r} ({listed}): move those "
                "folders aside to start the run over, or use a new checkpoint directory."
            )
        for found, why in sorted(skipped.items(), reverse=True):
            self._set_aside(found, why, step)
        if skipped:
            with reading():
                self._manager.reload()
        return restored

    def _set_aside(self, found: int, why: str, restored: int | None) -> None:
        """Rename the damaged step `found` out of orbax's way and warn, naming it."""
        kept = "left in place"
        if is_process_zero():
            try:
                kept = f"renamed {set_aside(self._path() / str(found)).name}"
            except OSError as error:
                kept = f"left in place (renaming it failed: {error.strerror or error})"
        warnings.warn(
            f"checkpoint step {found} under {self.directory} is damaged ({why}): restored "
            f"step {restored} instead; the damaged step is {kept}.",
            DamagedCheckpointWarning,
            stacklevel=4,
        )

    def _restore(self, step: int, template: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """Checkpoint `step` into `template`; `_DamagedStepError` when its files are damaged."""
        extra = self._check_structure(step, template)
        return self._attempt(step, lambda: self._read(step, template, extra))

    def _restore_params(self, step: int, params: Any, ema: bool) -> Any:
        """Checkpoint `step`'s params (or EMA params) into `params`' structure."""
        try:
            with reading():
                saved, recorded, _ = self._saved_arrays(step)
        except Exception:  # damaged metadata: the read below says what is wrong
            positions = None
        else:
            try:
                positions = params_positions(saved, recorded, params, ema=ema)
            except ValueError as error:
                raise ValueError(
                    f"checkpoint step {step} under {self.directory!r}: {error}."
                ) from None
        return self._attempt(step, lambda: self._read_params(step, params, ema, positions))

    def _saved_arrays(
        self, step: int
    ) -> tuple[list[tuple[tuple[int, ...], str]], dict[str, Any] | None, Any]:
        """Checkpoint `step`'s saved arrays' shapes and dtypes, the layout its JSON item
        records (`None` when it records none) and that JSON item as read; no array is
        restored. The shapes and dtypes
        are the layout's record of them, or, for a checkpoint that records none, orbax's
        metadata of each array."""
        ocp = self._ocp
        extra = self._manager.restore(step, args=ocp.args.Composite(extra=ocp.args.JsonRestore()))
        recorded = extra[EXTRA_ITEM].get(LAYOUT) if isinstance(extra[EXTRA_ITEM], dict) else None
        saved = recorded_arrays(recorded)
        if saved is None:
            saved = [
                (tuple(leaf.shape), str(np.dtype(leaf.dtype)))
                for leaf in self._manager.item_metadata(step)[STATE_ITEM].tree
            ]
        return saved, recorded, extra[EXTRA_ITEM]

    def _read_params(self, step: int, params: Any, ema: bool, positions: list[int] | None) -> Any:
        """Read only the arrays at `positions` of checkpoint `step` (orbax's placeholders
        stand for every other array, which it leaves unread)."""
        if positions is None:  # the metadata could not be read: reading it again says why
            saved, recorded, _ = self._saved_arrays(step)
            positions = params_positions(saved, recorded, params, ema=ema)
        ocp = self._ocp
        leaves, treedef = jax.tree.flatten(params)
        count = len(self._manager.item_metadata(step)[STATE_ITEM].tree)
        item: list[Any] = [ocp.PLACEHOLDER] * count
        arguments: list[Any] = [ocp.PLACEHOLDER] * count
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this process's
        for position, leaf in zip(positions, leaves, strict=True):
            item[position] = abstract(leaf)
            arguments[position] = ocp.ArrayRestoreArgs(
                sharding=device, global_shape=jnp.shape(leaf), dtype=jnp.result_type(leaf)
            )
        handler = ocp.PyTreeCheckpointHandler()
        try:
            restored = handler.restore(
                self._path() / str(step) / STATE_ITEM,
                args=ocp.args.PyTreeRestore(item=item, restore_args=arguments),
            )
        finally:
            handler.close()
        return jax.tree.unflatten(treedef, [restored[position] for position in positions])

    def _attempt(self, step: int, read: Callable[[], _Restored]) -> _Restored:
        """`read()` of checkpoint `step`; `_DamagedStepError` when its files are damaged."""
        phase = f"restoring checkpoint step {step}"
        try:
            with reading():
                restored = read()
        except Exception as error:
            if damage(error):
                why = reason(self._path() / str(step), ITEMS, error)
                failure: BaseException = _DamagedStepError(
                    f"checkpoint step {step} under {self.directory!r} is damaged: {why}.",
                    step,
                    why,
                )
            else:  # the store unreachable or unreadable: not the step's fault, no fallback
                failure = disk_error(error, self.directory) or error
            if is_multiprocess():  # every process raises when any failed (damaged or not)
                agree_process_phase(phase, failure)
            if failure is error:
                raise
            raise failure from error
        if is_multiprocess():
            agree_process_phase(phase, True)
        return restored

    def _read(
        self, step: int, template: TrainState, extra: Any = None
    ) -> tuple[TrainState, dict[str, Any]]:
        """Checkpoint `step`'s arrays into `template`, with its JSON item: `extra` when the
        structure check already read it (one read of the item, not two), else read here."""
        template_leaves, treedef = jax.tree.flatten(template)
        ocp = self._ocp
        items: dict[str, Any] = {
            STATE_ITEM: ocp.args.StandardRestore([abstract(leaf) for leaf in template_leaves])
        }
        if extra is None:
            items[EXTRA_ITEM] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        if extra is None:
            extra = restored[EXTRA_ITEM]
        leaves = [  # orbax's arrays as they are: already in the template's place and dtype
            jax.random.wrap_key_data(saved, impl=jax.random.key_impl(leaf))
            if is_key(leaf)
            else saved
            if isinstance(saved, jax.Array)
            else jnp.asarray(saved)
            for saved, leaf in zip(restored[STATE_ITEM], template_leaves, strict=True)
        ]
        if not isinstance(extra, dict):
            raise ValueError(f"its extra item holds {type(extra).__name__}, not a JSON object")
        extra = dict(decode_json_value(extra))
        history = history_from_json(extra.pop("history", {}))
        extra.pop(LAYOUT, None)
        state = jax.tree.unflatten(treedef, leaves)
        return (
            TrainState(
                state.step, state.params, state.opt_state, state.key, state.ema_params, history
            ),
            extra,
        )

    def _check_structure(self, step: int, template: TrainState) -> Any:
        """Raise a short `ValueError` when checkpoint `step`'s saved arrays (`_saved_arrays`:
        nothing restored) differ in number, shape or dtype from `template`'s: a checkpoint
        written for another model or optimizer. Returns the step's JSON item as read, which
        the restore then does not read again (`None` when it could not be read)."""
        try:
            with reading():
                saved, _, extra = self._saved_arrays(step)
        except Exception:  # damaged metadata: the restore says what is wrong
            return None
        differing = structure_differences(saved, template)
        if differing is None:
            return extra
        count = len(jax.tree.leaves(template))
        raise ValueError(
            f"the checkpoint at step {step} under {self.directory!r} was written for another "
            f"model or optimizer: it holds {len(saved)} arrays, this state {count}, "
            f"and they differ at\n{differing}\nResume with the model and optimizer that "
            "wrote it, or use a new checkpoint directory."
        )

    def wait(self) -> None:
        """Block until every submitted save is durable; a failed one raises here."""
        with self._saving(self._pending):
            self._manager.wait_until_finished()
        self._pending = None

    def close(self) -> None:
        """Wait for pending saves and release the manager."""
        self.wait()
        with self._saving(None):  # orbax writes the last metadata as it closes
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
