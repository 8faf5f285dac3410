"""Pure training and evaluation steps over an immutable `TrainState`.

```python
>>> import jax, jax.numpy as jnp, optax
>>> from dew.nn.backbones.causal_transformer import CausalTransformer
>>> from dew.objectives.lm import LMObjective
>>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1, num_heads=2,
...                           mlp_features=32, max_seq_len=16, key=jax.random.key(0))
>>> objective, optimizer = LMObjective(model, seq_len=8), optax.adam(1e-2)
>>> state = TrainState.create(objective, optimizer, key=jax.random.key(0))
>>> step = jax.jit(lambda s, b, k: train_step(objective, optimizer, s, b, k), donate_argnums=0)
>>> batch = {"text": jnp.tile(jnp.arange(9, dtype=jnp.int32) % 4, (8, 1))}
>>> state, metrics = step(state, batch, jax.random.key(1))
>>> int(state.step), sorted(metrics)
(1, ['loss', 'token_accuracy'])

```
"""

import functools
import math
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from dew._accumulate import accumulated_gradients, check_accumulate
from dew._precision import check_precision, computing_in, in_compute, with_precision
from dew.artifacts import Artifact
from dew.objectives.base import Objective, ReadsEMAParams, WeighsLoss

__all__ = [
    "OPTIMIZER_METRICS",
    "LearningRate",
    "MetricHistory",
    "TrainState",
    "ema_update",
    "eval_step",
    "generation_params",
    "train_step",
]


class _Series:
    """One tag's points in a growable list shared by every history that holds a prefix of
    it, with the hashes of its prefixes (computed when first asked for)."""

    __slots__ = ("hashes", "points")

    def __init__(self, points: list[tuple[int, float]], hashes: list[int] | None = None):
        self.points = points
        self.hashes = hashes if hashes is not None else []

    def prefix_hash(self, length: int) -> int:
        """The hash of the first `length` points (steps as ints, NaN equal to NaN); each
        prefix is hashed once, so hashing after every append costs O(1) a point."""
        hashes = self.hashes
        if len(hashes) < length:
            digest = hashes[-1] if hashes else 0
            for step, value in self.points[len(hashes) : length]:
                digest = hash((digest, int(step), _comparable(value)))
                hashes.append(digest)
        return hashes[length - 1] if length else 0


# One lock for every series: an append checks that its series ends where its history does,
# then appends, and two threads appending to one history must not both pass the check.
_APPENDING = threading.Lock()


class MetricHistory(Mapping[str, tuple[tuple[int, float], ...]]):
    """An immutable record of metric values keyed by metric tag: `tag -> ((step, value), ...)`.

    Keys are the tags a tracker receives (`stage/split/metric`). `with_values`
    returns a new history in O(1) amortised time per value, however long the series:
    a history holds its series as prefixes of growable lists that the histories built
    from one another share, and an append copies a series only when another history
    has already appended to the same one (two appends to one history). Two histories
    are equal when they hold the same series (a NaN equals a NaN: non-finite values are
    data); the hash grows with each series' prefix hashes, so hashing a history after
    each append costs O(1) a point, and a history kept as a static field costs one
    comparison per jit call (the Trainer hands its compiled step the empty history only).

    ```python
    >>> MetricHistory({"lm/train/loss": ((1, 2.0),)}) == MetricHistory().with_values(
    ...     {"lm/train/loss": 2.0}, step=1)
    True

    ```
    """

    __slots__ = ("_entries", "_hash", "_tuples")

    def __init__(self, series: Mapping[str, tuple[tuple[int, float], ...]] | None = None):
        if isinstance(series, MetricHistory):
            entries = dict(series._entries)
        else:
            entries = {
                tag: (_Series(list(points)), len(points)) for tag, points in (series or {}).items()
            }
        self._entries: dict[str, tuple[_Series, int]] = entries
        self._hash: int | None = None
        self._tuples: dict[str, tuple[tuple[int, float], ...]] = {}

    @classmethod
    def _of(cls, entries: dict[str, tuple[_Series, int]]) -> "MetricHistory":
        history = cls.__new__(cls)
        history._entries, history._hash, history._tuples = entries, None, {}
        return history

    def __getitem__(self, tag: str) -> tuple[tuple[int, float], ...]:
        found = self._tuples.get(tag)
        if found is None:
            series, length = self._entries[tag]
            points = series.points
            found = tuple(points) if len(points) == length else tuple(points[:length])
            self._tuples[tag] = found
        return found

    def __contains__(self, tag: object) -> bool:
        return tag in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, MetricHistory):
            return NotImplemented
        if self._entries.keys() != other._entries.keys():
            return False
        for tag, (series, length) in self._entries.items():
            theirs, their_length = other._entries[tag]
            if length != their_length:
                return False
            if series is theirs:  # one shares the other's points
                continue
            with _APPENDING:
                if series.prefix_hash(length) != theirs.prefix_hash(length):
                    return False
            pairs = zip(series.points[:length], theirs.points[:length], strict=True)
            if not all(_point(mine) == _point(other) for mine, other in pairs):
                return False
        return True

    def __hash__(self) -> int:
        if self._hash is None:
            with _APPENDING:
                self._hash = hash(
                    frozenset(
                        (tag, length, series.prefix_hash(length))
                        for tag, (series, length) in self._entries.items()
                    )
                )
        return self._hash

    def __repr__(self) -> str:
        return f"MetricHistory({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (MetricHistory, (dict(self.items()),))

    def with_values(self, values: Mapping[str, float], step: int) -> "MetricHistory":
        """A new history with `values` (tag to value) appended at `step`; this one is
        unchanged."""
        entries = dict(self._entries)
        step = int(step)
        with _APPENDING:
            for tag, value in values.items():
                series, length = entries.get(tag, (None, 0))
                if series is None:
                    series = _Series([])
                elif len(series.points) != length:  # another history appended here first
                    series = _Series(series.points[:length], series.hashes[:length])
                series.points.append((step, value))
                entries[tag] = (series, length + 1)
        return MetricHistory._of(entries)


def _point(point: tuple[int, float]) -> tuple[int, Any]:
    step, value = point
    return int(step), _comparable(value)


def _comparable(value: float) -> Any:
    """`value` as a key in which NaN equals NaN (as `"NaN"`) and -0.0 equals 0.0."""
    value = float(value)
    return "NaN" if math.isnan(value) else value


EMPTY_HISTORY = MetricHistory()


class TrainState(eqx.Module):
    """The whole state of a training run, as an immutable pytree.

    - `step`: the number of optimizer steps taken (an int32 array, so a new step
      never recompiles).
    - `params`: the objective's trainable arrays.
    - `opt_state`: the optimizer's state.
    - `key`: the run key; per-step keys derive from it.
    - `ema_params`: an exponential moving average of `params`, or `None`.
    - `metric_history`: the values reported so far, keyed by metric tag (static).
    """

    step: Int[Array, ""]
    params: PyTree
    opt_state: PyTree
    key: PRNGKeyArray
    ema_params: PyTree | None = None
    metric_history: MetricHistory = eqx.field(static=True, default=EMPTY_HISTORY)

    @classmethod
    def create(
        cls,
        objective: Objective,
        optimizer: optax.GradientTransformation,
        *,
        key: PRNGKeyArray,
        ema: bool = False,
    ) -> "TrainState":
        """The state before the first step: copies of the objective's initial trainable
        arrays (so donating the state to a jitted step never invalidates the objective's
        own arrays, the caller's key, or the EMA's separate buffers).

        The copies, the optimizer's initial state and the step counter come from one
        compiled program (one XLA compilation, where eager calls compiled a copy and a
        `zeros_like` for every parameter shape; decision 0048), with the values the eager
        calls give. An optimizer whose `init` cannot be traced (or cannot be hashed) is
        initialised eagerly."""
        params = objective.init_params()
        try:
            arrays = _fresh_arrays(params, key, optimizer, ema)
        except (TypeError, *_UNTRACEABLE):  # a real error raises again, eagerly
            arrays = _initial_arrays(params, key, optimizer, ema)
        step, params, opt_state, key, ema_params = arrays
        return cls(step=step, params=params, opt_state=opt_state, key=key, ema_params=ema_params)


_UNTRACEABLE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
)


def _initial_arrays(
    params: PyTree, key: PRNGKeyArray, optimizer: optax.GradientTransformation, ema: bool
) -> tuple[Any, ...]:
    """`TrainState.create`'s arrays: the step counter, copies of `params` and `key`, the
    optimizer's initial state, and a second copy of `params` for the EMA (`None`
    without)."""
    params = _copy(params)
    ema_params = _copy(params) if ema else None
    return jnp.zeros((), jnp.int32), params, optimizer.init(params), _copy(key), ema_params


_fresh_arrays = eqx.filter_jit(_initial_arrays)


def _copy(tree: PyTree) -> PyTree:
    return jax.tree.map(
        lambda leaf: jnp.array(leaf, copy=True) if eqx.is_array(leaf) else leaf, tree
    )


def ema_update(ema_params: PyTree, params: PyTree, decay: float | Float[Array, ""]) -> PyTree:
    """`decay * ema + (1 - decay) * params`, leaf by leaf (non-array leaves kept)."""

    def update(average: Any, value: Any) -> Any:
        if not eqx.is_inexact_array(value):
            return average
        return (decay * average + (1.0 - decay) * value).astype(value.dtype)

    return jax.tree.map(update, ema_params, params)


def generation_params(objective: Objective, state: TrainState) -> PyTree:
    """The params `objective` scores and previews with: `state.ema_params` when the
    objective declares an `ema_decay`, else the live `state.params`."""
    if getattr(objective, "ema_decay", None) is None:
        return state.params
    if state.ema_params is None:
        raise ValueError(
            f"{type(objective).__name__} generates with EMA params (ema_decay="
            f"{objective.ema_decay}), but the state has none; create it with "
            "TrainState.create(..., ema=True)."
        )
    return state.ema_params


def _ema_loss(objective: Any, ema_params: PyTree, params: PyTree, batch: Any, key: Any) -> Any:
    return objective.ema_loss(params, ema_params, batch, key)


LearningRate = float | optax.Schedule
"""A learning rate as the optimizer was built with it: a constant or an optax schedule of
the update count."""

OPTIMIZER_METRICS: tuple[str, ...] = ("learning_rate", "grad_norm", "update_norm")
"""The training metrics `train_step(..., log_optimizer=True)` adds."""


def find_learning_rate(opt_state: PyTree, learning_rate: LearningRate | None) -> Any:
    """The learning rate an optimizer state holds (`optax.inject_hyperparams`), or `None`
    when `learning_rate` is given or the state holds none; several is a `ValueError`."""
    if learning_rate is not None:
        return None
    try:  # the value, not a stateful schedule's state of the same name
        return optax.tree_utils.tree_get(opt_state, "learning_rate", filtering=_is_value)
    except KeyError:
        raise ValueError(
            "the optimizer state holds several learning rates (several "
            "optax.inject_hyperparams); pass the one to log as learning_rate=... (a float or "
            "an optax schedule)."
        ) from None


def _is_value(path: Any, value: Any) -> bool:
    return eqx.is_array(value) or isinstance(value, jax.ShapeDtypeStruct)


def no_learning_rate_error(where: str) -> ValueError:
    """The error of `log_optimizer=True` with no learning rate to log, saying how to give one."""
    return ValueError(
        f"log_optimizer=True logs the learning rate, but {where} has none to read: build the "
        "optimizer with optax.inject_hyperparams (optax.inject_hyperparams(optax.adam)("
        "learning_rate=schedule)), or pass the rate or schedule the optimizer was built with "
        "as learning_rate=... (Trainer(..., learning_rate=...), train_step(..., "
        "learning_rate=...))."
    )


def _optimizer_metrics(
    grads: PyTree,
    updates: PyTree,
    state: TrainState,
    opt_state: PyTree,
    learning_rate: LearningRate | None,
    aux: Mapping[str, Any],
) -> dict[str, Float[Array, ""]]:
    taken = sorted(set(aux) & set(OPTIMIZER_METRICS))
    if taken:
        raise ValueError(
            f"log_optimizer=True adds the training metrics {', '.join(OPTIMIZER_METRICS)}, "
            f"but the objective's aux already names {', '.join(taken)}: rename the aux "
            "value, or fit without log_optimizer."
        )
    if learning_rate is None:  # what inject_hyperparams applied in this update
        rate = find_learning_rate(opt_state, None)
        if rate is None:
            raise no_learning_rate_error("the optimizer state")
    elif callable(learning_rate):  # optax's count before the update is the steps taken
        rate = learning_rate(state.step)
    else:
        rate = learning_rate
    return {
        "learning_rate": jnp.asarray(rate, jnp.float32).reshape(()),
        "grad_norm": jnp.asarray(optax.tree.norm(grads), jnp.float32),
        "update_norm": jnp.asarray(optax.tree.norm(updates), jnp.float32),
    }


def train_step(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    batch: Mapping[str, Any],
    key: PRNGKeyArray,
    *,
    ema_decay: float | None = None,
    log_optimizer: bool = False,
    learning_rate: LearningRate | None = None,
    accumulate: int = 1,
    precision: str = "float32",
) -> tuple[TrainState, dict[str, Float[Array, ""]]]:
    """One optimizer step on `batch`: returns the next state and `{"loss": ..., **aux}`.

    Pure: jit it with `donate_argnums` on the state to update buffers in place.
    With `ema_decay`, `state.ema_params` is updated as well, and an objective whose loss
    reads its EMA params (`dew.objectives.base.ReadsEMAParams`, JEPA's target encoder)
    is differentiated through `ema_loss(params, state.ema_params, batch, key)`; such an
    objective with an `ema_decay` of its own refuses a step without one.

    With `log_optimizer=True` the outputs add `learning_rate` (the rate this update
    applied: `learning_rate(state.step)` for a schedule, the constant for a float, or,
    with `learning_rate=None`, the value an `optax.inject_hyperparams` state holds after
    the update), `grad_norm` and `update_norm` (global L2 norms, `optax.tree.norm`, of
    the gradients and of the updates). No learning rate to read, or an aux already named
    one of these, is a `ValueError` (at trace time).

    With `accumulate=k > 1` the batch is split into `k` micro-batches (rows `i, i + k, ...`)
    whose losses, aux metrics and gradients are summed in a `lax.scan`, each weighted by
    the objective's `loss_weight` (`dew.objectives.base.WeighsLoss`; else its rows), and
    averaged before the one optimizer update: the step and its outputs are the whole
    batch's, up to float rounding (`dew._accumulate`). `k` must divide the batch's rows.

    `precision` (`"float32"`, `"bfloat16"` or `"mixed_bfloat16"`; decision 0078): under a
    bfloat16 policy the loss is computed from the params and the batch's floating arrays
    cast to bfloat16, its value and aux metrics returned in float32; the gradients reach the
    float32 params through the casts, so the params and the optimizer state stay float32.
    """
    check_precision(precision)
    if ema_decay is not None and state.ema_params is None:
        raise ValueError(
            "train_step got ema_decay but the state has no ema_params; "
            "create it with TrainState.create(..., ema=True)."
        )
    loss_of: Any = objective.loss
    reads_ema = isinstance(objective, ReadsEMAParams)
    if reads_ema and ema_decay is not None:
        ema_params = in_compute(state.ema_params, precision)  # the target in the compute dtype
        loss_of = functools.partial(_ema_loss, objective, ema_params)
    elif reads_ema and getattr(objective, "ema_decay", None) is not None:
        raise ValueError(
            f"{type(objective).__name__} trains against its EMA params (ema_decay="
            f"{objective.ema_decay}); pass train_step(..., ema_decay=objective.ema_decay) "
            "with a state from TrainState.create(..., ema=True)."
        )
    loss_of = with_precision(loss_of, precision)
    with computing_in(precision):  # the backward pass traced under the policy too
        if check_accumulate(accumulate) == 1:
            gradient = jax.value_and_grad(loss_of, has_aux=True)
            (loss, aux), grads = gradient(state.params, batch, key)
        else:
            weight_of = objective.loss_weight if isinstance(objective, WeighsLoss) else None
            (loss, aux), grads = accumulated_gradients(
                loss_of, weight_of, state.params, batch, key, accumulate
            )
    # optax's transforms mix Python floats with int32 step counts (Adam's bias
    # correction), which a caller's strict dtype promotion would refuse.
    with jax.numpy_dtype_promotion("standard"):
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        telemetry = {}
        if log_optimizer:
            telemetry = _optimizer_metrics(grads, updates, state, opt_state, learning_rate, aux)
    ema_params = state.ema_params
    if ema_decay is not None:
        ema_params = ema_update(ema_params, params, ema_decay)
    next_state = TrainState(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        key=state.key,
        ema_params=ema_params,
        metric_history=state.metric_history,
    )
    return next_state, {"loss": loss, **aux, **telemetry}


def eval_step(
    objective: Objective,
    state: TrainState,
    batch: Mapping[str, Any],
    key: PRNGKeyArray,
    *,
    use_ema: bool = False,
) -> Artifact:
    """The objective's scoring artifact for `batch`, from the live or the EMA params."""
    if use_ema and state.ema_params is None:
        raise ValueError("eval_step(use_ema=True) needs a state with ema_params.")
    params = state.ema_params if use_ema else state.params
    return objective.evaluate(params, batch, key)
