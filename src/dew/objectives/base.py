"""The objective contract: what a model is trained on, scored with and previewed by."""

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from equinox import AbstractVar
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from dew._checks import (
    HOST_CHECKING,
    MissingBatchKeyError,
    check_ids,
)
from dew.artifacts import Artifact
from dew.metrics import Metric
from dew.naming import Split
from dew.telemetry.records import SamplingProtocol

__all__ = [
    "AbstractObjective",
    "CountsTokens",
    "MissingBatchKeyError",
    "ReadsEMAParams",
    "ReportsSampling",
    "SkipsMetrics",
    "WeighsLoss",
    "check_batch_keys",
    "check_on_host",
    "check_token_ids",
    "check_token_batch",
    "combine",
    "token_log_probs",
    "trainable",
]

Batch = Mapping[str, Any]


class AbstractObjective(eqx.Module):
    """An Equinox module that holds a model's structure and defines how to train,
    score and preview it. Every objective is abstract or final, as in Equinox: a
    subclass implements the abstract methods below and overrides nothing else.

    `params` are the trainable arrays (`eqx.partition` of the model by
    `eqx.is_inexact_array`), so optax updates only them; anything frozen (a DPO
    reference model, static hyperparameters) stays in the objective.

    A subclass implements:

    - `name`: the default stage name of a run (`lm`, `masked_diffusion`, `dpo`, ...).
    - `init_params()`: the trainable arrays to start training from.
    - `loss(params, batch, key) -> (loss, aux)`: a scalar loss and a mapping of
      bare metric names to scalars, for `jax.grad` with `has_aux=True`.
    - `evaluate(params, batch, key)`: the scoring artifact for the whole batch.
    - `batch_keys(split)`: the keys every training (`loss`) or validation (`evaluate`)
      batch must hold; the trainer and the evaluation pass check the first batch against
      them before compiling anything (`check_batch_keys`).
    - `check_batch(batch)`: the checks `loss` and `evaluate` run on a batch, on the
      host, raising their `ValueError` (an objective without any returns `None`).
    - `generate_preview(params, batch, key)`: the objective's own preview artifact
      (sampled rows, say), or `None` to preview the scoring artifact.
    - `default_metrics()`: the metrics a run of this objective is scored with when
      none are named (`dew train`, `dew eval`); `()` for none. An objective that leaves
      some out for want of something (FID's weights) says which through `SkipsMetrics`.

    An objective may also declare `ema_decay: float | None` (a static field; the base
    says `None`). With a decay, the `Trainer` creates the state with `ema_params` and
    updates them after every step (`dew.steps.ema_update`), and its validation passes
    `state.ema_params` to `evaluate` and `preview` instead of the live params
    (`dew.steps.generation_params`). Without one, both read the live params: the
    language objectives, DPO and GRPO (whose reference model is frozen in the objective,
    not an average of the policy) preview and score the live policy. An objective whose
    loss reads the EMA as well (JEPA's target encoder) implements `ReadsEMAParams`.

    and gets `preview(params, batch, key, scored=None)`, the artifact a tracker shows.
    """

    name: AbstractVar[str]

    if not TYPE_CHECKING:

        def __getattribute__(self, name: str) -> Any:
            # Equinox wraps every method looked up on a module in a `BoundMethod` (a
            # module, so the method is a pytree), and building one flattens the whole
            # objective, its model included: 0.1-0.8 ms from one to twelve transformer
            # layers. The host checks a pass runs on every batch look up a few methods
            # (`check_batch`, its helpers, `batch_keys`); under `check_on_host` they are
            # plain bound methods, as the checks only call them.
            if HOST_CHECKING.get():
                return object.__getattribute__(self, name)
            return super().__getattribute__(name)

    # The EMA contract: an objective with a decay here (a field of its own) has the
    # Trainer keep `state.ema_params` and generate and score with them.
    ema_decay = None  # unannotated: a subclass's own field may take its place in any order

    @abc.abstractmethod
    def init_params(self) -> PyTree:
        """The trainable arrays to start from."""

    @abc.abstractmethod
    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        """The scalar training loss and auxiliary metrics of one batch."""

    @abc.abstractmethod
    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> Artifact:
        """The scoring artifact of one coordinated batch."""

    @abc.abstractmethod
    def batch_keys(self, split: Split) -> Mapping[str, str | None]:
        """The keys every batch of `split` must hold: those `loss` reads for
        `Split.TRAIN`, those `evaluate` reads for `Split.VALIDATION`. Each maps to what
        names it, as a phrase for an error message (`"its `inputs` field"`), or to `None`
        for a key the objective fixes. Keys read only when present (sample weights) are
        left out. `check_batch_keys` checks a batch against them on the host, so a batch
        that lacks one fails with one line naming it before any step is compiled."""

    @abc.abstractmethod
    def check_batch(self, batch: Batch) -> None:
        """Run the batch checks of `loss` and `evaluate` on a concrete `batch` and raise
        their `ValueError`. Traced, those checks are `eqx.error_if`, whose failure
        reaches the user only through this method; a pass over batches held on the host
        runs it on each of them and scores them without the traced token-ID checks, so
        it must run every check `loss` and `evaluate` rely on."""

    @abc.abstractmethod
    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> Artifact | None:
        """The objective's own preview artifact of `batch`, or `None` when it previews
        the scoring artifact (see `preview`)."""

    @abc.abstractmethod
    def default_metrics(self) -> tuple[Metric, ...]:
        """The validation metrics a run of this objective is scored with when none are
        named (`dew train`, `dew eval`)."""

    def preview(
        self,
        params: PyTree,
        batch: Batch,
        key: PRNGKeyArray,
        scored: Artifact | None = None,
    ) -> Artifact:
        """A preview artifact for a tracker: `generate_preview(params, batch, key)`, or
        where that is `None` the first scoring artifact of the evaluation event
        (`scored`, else `evaluate(params, batch, key)`), so the model never runs twice
        for it."""
        generated = self.generate_preview(params, batch, key)
        if generated is None:
            generated = self.evaluate(params, batch, key) if scored is None else scored
        if not isinstance(generated, Artifact):
            raise TypeError(
                f"{type(self).__name__}'s preview must be a dew artifact, got "
                f"{type(generated).__name__}."
            )
        return generated


@runtime_checkable
class ReportsSampling(Protocol):
    """An objective that generates the artifacts it is scored on and reports how, as a
    `dew.telemetry.records.SamplingProtocol` (`DiffusionObjective`,
    `MaskedDiffusionObjective`). The `Trainer` reports `sampling_record(0, event_key=None)`
    once per fit, at its start, and `sampling_record(rows, event_key=..., batch=first
    batch)` with every evaluation that scored `rows` real rows; it fills in the record's
    `features` (the metrics' `feature_definition()`s) and `conditioning_sha256` (the
    identity of `conditioning_values(batch)` over every batch of the pass)."""

    def sampling_record(
        self, real_rows: int, *, event_key: str | None, batch: Batch | None = None
    ) -> SamplingProtocol:
        """The record of a generation from `real_rows` real rows under `event_key`;
        `batch` is the pass's first batch (`None` for the fit's record)."""
        ...

    def conditioning_values(self, batch: Batch) -> Any:
        """What conditions the samples generated for `batch`'s rows, one integer row per
        batch row (class labels, prompt token ids), or `None` for unconditional samples."""
        ...


@runtime_checkable
class ReadsEMAParams(Protocol):
    """An objective whose training loss reads the EMA of its own params (JEPA's target
    encoder): with an `ema_decay`, `dew.steps.train_step` differentiates
    `ema_loss(params, state.ema_params, batch, key)` with respect to `params` instead of
    `loss(params, batch, key)` (`JEPAObjective`)."""

    def ema_loss(
        self, params: PyTree, ema_params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        """The loss of `params` against targets computed from `ema_params`."""
        ...


@runtime_checkable
class WeighsLoss(Protocol):
    """An objective whose loss is a weighted mean over something other than the batch's
    rows (the LM's targets, a classifier's sample weights): `loss_weight(batch)` is the
    loss's denominator, the total weight the batch's loss averages over. An accumulated
    step (`dew.steps.train_step(..., accumulate=k)`, `Trainer.fit(..., accumulate=k)`)
    weighs each micro-batch's loss, aux metrics and gradients by it, so the step equals the
    one on the whole batch; an objective without it weighs each micro-batch by its rows,
    which is exact for a mean over rows (DPO's pairs, a diffusion loss)."""

    def loss_weight(self, batch: Batch) -> Float[Array, ""]:
        """The total weight `loss(params, batch, key)` averages over (traced, in the step)."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """An objective whose batches are rows of tokens (`LMObjective`,
    `MaskedDiffusionObjective`): `Trainer.fit` reports its training speed in
    `tokens_per_second` too, from `batch_tokens(batch)`, beside `examples_per_second`
    (docs/training.md, "Throughput and MFU")."""

    def batch_tokens(self, batch: Batch) -> int:
        """The token positions the model reads in `batch`, padding included (what the
        step computes on), counted on the host from the batch's shapes."""
        ...


@runtime_checkable
class SkipsMetrics(Protocol):
    """An objective whose `default_metrics()` may leave some out because something they
    need is missing (an image `DiffusionObjective` without FID's weights): the shell
    (`dew train`, `dew sweep`, `dew eval`) prints each one it names, with why."""

    def skipped_metrics(self) -> dict[str, str]:
        """Each default metric left out, by name, with why on one line; `{}` for none."""
        ...


Objective = AbstractObjective
"""The objective base under its first public name: `Objective is AbstractObjective`."""


def check_on_host(objective: AbstractObjective, batch: Batch) -> None:
    """`objective.check_batch(batch)`, at a cost that does not grow with the model: the
    methods the checks look up on the objective are plain bound methods, not Equinox's
    pytree `BoundMethod`s (each of which flattens the objective). What every pass and
    every `jax.distributed` fit runs on each batch held on the host.

    **Raises:** the `ValueError` of the objective's own checks.
    """
    token = HOST_CHECKING.set(True)
    try:
        objective.check_batch(batch)
    finally:
        HOST_CHECKING.reset(token)


def check_batch_keys(objective: AbstractObjective, batch: Any, split: Split) -> None:
    """Check that `batch` holds every key `objective.batch_keys(split)` declares, on the
    host: `Trainer.fit` runs it on its first training batch and every evaluation pass on
    its first batch, before anything is compiled.

    **Raises:** `MissingBatchKeyError` (a `KeyError` and a `ValueError`) naming the missing
    keys, what names each, and the keys the batch has.

    ```python
    >>> import equinox as eqx, jax, numpy as np
    >>> from dew.naming import Split
    >>> from dew.objectives.classifier import ClassifierObjective
    >>> objective = ClassifierObjective(eqx.nn.Linear(4, 3, key=jax.random.key(0)), classes=3)
    >>> batch = {"images": np.zeros((2, 4)), "labels": np.zeros(2, np.int32)}
    >>> try:
    ...     check_batch_keys(objective, batch, Split.TRAIN)
    ... except ValueError as error:
    ...     print(error)
    ClassifierObjective reads batch key 'inputs' (its `inputs` field), but the batch has
    'images', 'labels'.

    ```
    """
    # Looked up on the class: on an Equinox module `objective.batch_keys` builds a
    # `BoundMethod`, which flattens the whole objective (decision 0051).
    declared = type(objective).batch_keys(objective, split)
    kind = type(objective).__name__
    if not isinstance(declared, Mapping):
        raise TypeError(
            f"{kind}.batch_keys({split.value!r}) must return a mapping of batch keys to what "
            f"names them (None for a fixed key), got {type(declared).__name__}."
        )
    mapping = isinstance(batch, Mapping)
    missing = [key for key in declared if key not in batch] if mapping else list(declared)
    if not missing:
        return
    if mapping:
        has = "the batch has " + (", ".join(repr(key) for key in batch) or "no keys")
    else:
        has = f"the batch is a {type(batch).__name__}, not a mapping of keys to arrays"
    shown = [
        repr(key) + ("" if declared[key] is None else f" ({declared[key]})") for key in missing
    ]
    keys = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
    noun = "batch key" if len(shown) == 1 else "batch keys"
    raise MissingBatchKeyError(f"{kind} reads {noun} {keys}, but {has}.")


def trainable(model: PyTree) -> PyTree:
    """The trainable arrays of a model: its inexact (floating) arrays, every other leaf
    `None` (`eqx.filter(model, eqx.is_inexact_array)`). An objective's `init_params()`
    returns these; `combine` puts them back.

    ```python
    >>> import equinox as eqx, jax
    >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
    >>> params = trainable(model)
    >>> params.weight.shape, bool(eqx.tree_equal(combine(params, model), model))
    ((1, 2), True)

    ```
    """
    return eqx.filter(model, eqx.is_inexact_array)


def combine(params: PyTree, model: PyTree) -> PyTree:
    """The model with its trainable arrays replaced by `params` (a `trainable(model)`
    tree, or one the optimizer updated): how an objective's `loss` and `evaluate` rebuild
    the model they run from the `params` they are given. The model's other leaves (integer
    arrays, static hyperparameters) come from `model`."""
    return eqx.combine(params, eqx.filter(model, eqx.is_inexact_array, inverse=True))


def token_log_probs(
    logits: Float[Array, "*batch seq vocab"], targets: Array
) -> Float[Array, "*batch seq"]:
    """log p(target) at every position: `log_softmax` and `take_along_axis`, no one-hot."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def check_token_batch(
    kind: str, field: str, tokens: Any, *, vocab_size: int, min_length: int
) -> Array:
    """Check a token array before any compute: integer dtype, 2 axes, rows of at
    least `min_length` IDs, every ID in `[0, vocab_size)`; return it as a JAX array.
    Concrete arrays are checked on the host with a `ValueError` (`check_token_ids`);
    traced ones with `eqx.error_if` (see `dew._checks.error_if`)."""
    if isinstance(tokens, jax.core.Tracer):
        _check_token_shape(kind, field, tokens, min_length)
        return check_ids(tokens, vocab_size, **_token_subject(kind, field))
    check_token_ids(kind, field, tokens, vocab_size=vocab_size, min_length=min_length)
    return jnp.asarray(tokens)


def check_token_ids(
    kind: str, field: str, tokens: Any, *, vocab_size: int, min_length: int
) -> None:
    """The host half of `check_token_batch`, for an objective's `check_batch`: the same
    checks and the same `ValueError`s on a concrete array, in NumPy, with nothing copied
    to a device (a NumPy batch stays on the host until its compiled call takes it)."""
    _check_token_shape(kind, field, tokens, min_length)
    check_ids(tokens, vocab_size, **_token_subject(kind, field))


def _check_token_shape(kind: str, field: str, tokens: Any, min_length: int) -> None:
    dtype = getattr(tokens, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(
            f"{kind} needs integer token IDs in batch[{field!r}], got dtype {dtype}; "
            "cast with .astype(jnp.int32)."
        )
    if tokens.ndim != 2:
        raise ValueError(
            f"{kind} needs batch[{field!r}] shaped (rows, length), got shape {tuple(tokens.shape)}."
        )
    if tokens.shape[1] < min_length:
        raise ValueError(
            f"{kind} needs rows of at least {min_length} token IDs in batch[{field!r}], "
            f"got rows of {tokens.shape[1]}."
        )


def _token_subject(kind: str, field: str) -> dict[str, Any]:
    return {
        "subject": f"{kind}: batch[{field!r}]",
        "noun": "token ID",
        "size_name": "vocab_size",
        "axes": ("row", "position"),
    }
