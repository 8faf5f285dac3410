"""The objective contract: what a model is trained on, scored with and previewed by."""

import abc
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractVar
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from dew._checks import check_ids
from dew.artifacts import Artifact

__all__ = ["Objective", "check_token_batch", "token_log_probs"]

Batch = Mapping[str, Any]


class Objective(eqx.Module):
    """An Equinox module that holds a model's structure and defines how to train,
    score and preview it.

    `params` are the trainable arrays (`eqx.partition` of the model by
    `eqx.is_inexact_array`), so optax updates only them; anything frozen (a DPO
    reference model, static hyperparameters) stays in the objective.

    - `init_params()`: the trainable arrays to start training from.
    - `loss(params, batch, key) -> (loss, aux)`: a scalar loss and a mapping of
      bare metric names to scalars, for `jax.grad` with `has_aux=True`.
    - `evaluate(params, batch, key)`: the scoring artifact for the whole batch.
    - `preview(params, batch, key, scored=None)`: a preview artifact for a
      tracker. The base preview returns `scored`, the first scoring artifact of
      the evaluation event, so it never runs the model a second time.
    - `check_batch(batch)`: the checks `loss` and `evaluate` run on a batch, on the
      host, raising their `ValueError`. The Trainer and `evaluate` call it only after
      a compiled call has failed, to report which value of which batch was bad.
    - `name`: the default stage name of a run (`lm`, `masked_diffusion`, `dpo`, ...).
    """

    name: AbstractVar[str]

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

    def check_batch(self, batch: Batch) -> None:
        """Run the batch checks of `loss` and `evaluate` on a concrete `batch` and raise
        their `ValueError`. The default checks nothing; every built-in objective
        overrides it with the checks its own methods run (traced, those checks are
        `eqx.error_if`, whose failure reaches the user only through this method)."""

    def preview(
        self,
        params: PyTree,
        batch: Batch,
        key: PRNGKeyArray,
        scored: Artifact | None = None,
    ) -> Artifact:
        """A preview artifact: by default the first scoring artifact itself."""
        return self.evaluate(params, batch, key) if scored is None else scored


def trainable(model: PyTree) -> PyTree:
    """The trainable arrays of a model: its inexact (floating) arrays."""
    return eqx.filter(model, eqx.is_inexact_array)


def combine(params: PyTree, model: PyTree) -> PyTree:
    """The model with its trainable arrays replaced by `params`."""
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
    least `min_length` IDs, every ID in `[0, vocab_size)`. Concrete arrays are
    checked on the host with a `ValueError`; traced ones with `eqx.error_if` (see
    `dew._checks.error_if`)."""
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
    checked = check_ids(
        tokens,
        vocab_size,
        subject=f"{kind}: batch[{field!r}]",
        noun="token ID",
        size_name="vocab_size",
        axes=("row", "position"),
    )
    return jnp.asarray(checked)
