"""Typed scoring artifacts: what `Objective.evaluate` returns and metrics read.

Each artifact is an Equinox module (a pytree) whose array fields share a leading
*row* axis, one row per example of the batch. Constructing one with inconsistent
shapes raises a `ValueError` naming the fields and their shapes. `rows(start, stop)`
takes a slice of rows and `concatenate_rows` joins artifacts of one type, which is
what batch-split laws are stated in.

```python
>>> import jax.numpy as jnp
>>> scores = TokenScores(losses=jnp.ones((2, 3)), weights=jnp.ones((2, 3)))
>>> scores.num_rows
2

```
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Shaped

from dew._checks import check_ids
from dew._processes import PhaseFailedError, agree_process_phase

__all__ = [
    "Artifact",
    "ClassScores",
    "Clips",
    "Images",
    "RegressionScores",
    "Representations",
    "TokenRows",
    "TokenScores",
    "agree_process_phase",
    "collective_host",
    "concatenate_rows",
    "host",
    "PhaseFailedError",
]

_A = TypeVar("_A", bound="Artifact")


def _shape(value) -> tuple[int, ...]:
    return tuple(np.shape(value))


def _describe(**fields) -> str:
    return ", ".join(f"{name} {_shape(value)}" for name, value in fields.items())


def _require_rank(kind: str, name: str, value, rank: int, layout: str) -> None:
    if np.ndim(value) != rank:
        raise ValueError(
            f"{kind}.{name} must have {rank} axes ({layout}), got shape {_shape(value)}."
        )


class Artifact(eqx.Module):
    """Base of the scoring artifacts: pytrees whose array fields share a row axis."""

    @property
    def num_rows(self) -> int:
        """The number of rows (examples) the artifact holds."""
        return _shape(jax.tree.leaves(self)[0])[0]

    def rows(self: _A, start: int, stop: int) -> _A:
        """The artifact restricted to rows `start:stop`."""
        return jax.tree.map(lambda leaf: leaf[start:stop], self)


def concatenate_rows(artifacts: Sequence[_A]) -> _A:
    """Join artifacts of one type along their row axis.

    ```python
    >>> import jax.numpy as jnp
    >>> one = TokenScores(losses=jnp.ones((1, 3)), weights=jnp.ones((1, 3)))
    >>> concatenate_rows([one, one]).num_rows
    2

    ```
    """
    if not artifacts:
        raise ValueError("concatenate_rows needs at least one artifact.")
    kinds = {type(artifact) for artifact in artifacts}
    if len(kinds) != 1:
        names = sorted(kind.__name__ for kind in kinds)
        raise TypeError(f"concatenate_rows needs artifacts of one type, got {names}.")
    if isinstance(artifacts[0], Images):
        # Prompts are static per-row metadata: join them as the arrays are joined.
        with_prompts = {artifact.prompts is not None for artifact in artifacts}
        if len(with_prompts) != 1:
            raise ValueError("concatenate_rows needs all Images or none of them to carry prompts.")
        prompts = (
            tuple(prompt for artifact in artifacts for prompt in artifact.prompts)
            if with_prompts == {True}
            else None
        )
        joined = _concatenate_arrays([Images(a.generated, a.reference) for a in artifacts])
        return Images(joined.generated, joined.reference, prompts)
    present = [tuple(field for field in _optional_fields(artifact)) for artifact in artifacts]
    if len(set(present)) != 1:
        raise ValueError(
            "concatenate_rows needs the same optional fields in every "
            f"{type(artifacts[0]).__name__}, got {sorted(set(present))}."
        )
    return _concatenate_arrays(artifacts)


def _concatenate_arrays(artifacts: Sequence[_A]) -> _A:
    return jax.tree.map(lambda *leaves: jnp.concatenate(leaves, axis=0), *artifacts)


def _optional_fields(artifact: Artifact) -> list[str]:
    return [
        field.name
        for field in dataclasses.fields(artifact)
        if getattr(artifact, field.name) is not None
    ]


class TokenScores(Artifact):
    """Teacher-forced per-position scores of a token batch.

    - `losses`: per-position negative log-likelihood (nats), `(rows, positions)`.
    - `weights`: per-position target weights, zero where a position is padding.
    - `correct`: optional per-position correctness of the argmax prediction.
    """

    losses: Float[Array, "rows positions"]
    weights: Float[Array, "rows positions"]
    correct: Bool[Array, "rows positions"] | None = None

    def __check_init__(self) -> None:
        _require_rank("TokenScores", "losses", self.losses, 2, "rows, positions")
        fields = {"losses": self.losses, "weights": self.weights}
        if self.correct is not None:
            fields["correct"] = self.correct
        if len({_shape(value) for value in fields.values()}) != 1:
            raise ValueError(f"TokenScores fields must share one shape, got {_describe(**fields)}.")


class RegressionScores(Artifact):
    """Per-row scores of a supervised batch, and optionally its predictive distribution.

    - `losses`: each row's loss, `(rows,)`.
    - `weights`: each row's weight, `(rows,)`, zero where a row does not count.
    - `mean`, `targets`: optional point predictions and their targets, one shape
      `(rows, ...)`, for `rmse`.
    - `std`: optional predictive standard deviation of the Gaussian `N(mean, std²)`,
      shaped like `mean`, for `point_crps`.
    """

    losses: Float[Array, " rows"]
    weights: Float[Array, " rows"]
    mean: Float[Array, " rows *value"] | None = None
    std: Float[Array, " rows *value"] | None = None
    targets: Float[Array, " rows *value"] | None = None

    def __check_init__(self) -> None:
        _require_rank("RegressionScores", "losses", self.losses, 1, "rows")
        if _shape(self.weights) != _shape(self.losses):
            raise ValueError(
                "RegressionScores.weights must hold one weight per row, got "
                f"{_describe(losses=self.losses, weights=self.weights)}."
            )
        values = {
            name: value
            for name, value in (("mean", self.mean), ("std", self.std), ("targets", self.targets))
            if value is not None
        }
        if (self.mean is None) != (self.targets is None):
            raise ValueError(
                f"RegressionScores needs mean and targets together, got only {_describe(**values)}."
            )
        if self.std is not None and self.mean is None:
            raise ValueError("RegressionScores.std needs mean and targets beside it.")
        if values and (
            len({_shape(value) for value in values.values()}) != 1
            or _shape(self.mean)[:1] != _shape(self.losses)
        ):
            raise ValueError(
                "RegressionScores.mean, std and targets must share one shape whose first axis "
                f"is the rows of losses, got {_describe(losses=self.losses, **values)}."
            )


class Images(Artifact):
    """Generated images, with optional references and prompts, channels last.

    - `generated`: `(rows, height, width, channels)`, values in `[0, data_range]`.
    - `reference`: optional real images; paired metrics need one per generated row.
    - `prompts`: optional conditioning prompts, one per generated row (static).
    """

    generated: Float[Array, "rows height width channels"]
    reference: Float[Array, "ref_rows ref_height ref_width channels"] | None = None
    prompts: tuple[str, ...] | None = eqx.field(static=True, default=None)

    def __check_init__(self) -> None:
        _require_rank("Images", "generated", self.generated, 4, "rows, height, width, channels")
        if self.reference is not None:
            _require_rank("Images", "reference", self.reference, 4, "rows, height, width, channels")
            if _shape(self.reference)[-1] != _shape(self.generated)[-1]:
                raise ValueError(
                    "Images.generated and Images.reference must have the same channels, got "
                    f"{_describe(generated=self.generated, reference=self.reference)}."
                )
        if self.prompts is not None and len(self.prompts) != _shape(self.generated)[0]:
            raise ValueError(
                "Images.prompts must hold one prompt per generated row, got "
                f"{len(self.prompts)} prompt(s) for {_shape(self.generated)[0]} rows."
            )

    def rows(self, start: int, stop: int) -> Images:
        prompts = None if self.prompts is None else self.prompts[start:stop]
        reference = None if self.reference is None else self.reference[start:stop]
        return Images(self.generated[start:stop], reference, prompts)


class Clips(Artifact):
    """Generated videos, with optional reference videos, channels last.

    - `generated`: `(rows, frames, height, width, channels)`.
    - `reference`: optional real videos of the same frames, height, width and channels.
    """

    generated: Float[Array, "rows frames height width channels"]
    reference: Float[Array, "ref_rows frames height width channels"] | None = None

    def __check_init__(self) -> None:
        layout = "rows, frames, height, width, channels"
        _require_rank("Clips", "generated", self.generated, 5, layout)
        if self.reference is not None:
            _require_rank("Clips", "reference", self.reference, 5, layout)
            if _shape(self.reference)[1:] != _shape(self.generated)[1:]:
                raise ValueError(
                    "Clips.generated and Clips.reference must share frames, height, width and "
                    "channels, got "
                    f"{_describe(generated=self.generated, reference=self.reference)}."
                )


class Representations(Artifact):
    """Encoder features, with optional integer class labels.

    - `features`: `(rows, dim)`.
    - `labels`: optional `(rows,)` class labels, as probes need.
    """

    features: Float[Array, "rows dim"]
    labels: Int[Array, " rows"] | None = None

    def __check_init__(self) -> None:
        _require_rank("Representations", "features", self.features, 2, "rows, dim")
        if self.labels is not None:
            _require_rank("Representations", "labels", self.labels, 1, "rows")
            if _shape(self.labels)[0] != _shape(self.features)[0]:
                raise ValueError(
                    "Representations.labels must hold one label per row, got "
                    f"{_describe(features=self.features, labels=self.labels)}."
                )


class TokenRows(Artifact):
    """Generated token rows, one batch's worth, for custom text metrics.

    - `tokens`: `(rows, length)` integer token IDs.
    - `mask`: optional `(rows, length)`, true where a token was generated.
    """

    tokens: Shaped[Array, "rows length"]
    mask: Bool[Array, "rows length"] | None = None

    def __check_init__(self) -> None:
        _require_rank("TokenRows", "tokens", self.tokens, 2, "rows, length")
        if not jnp.issubdtype(jnp.result_type(self.tokens), jnp.integer):
            raise ValueError(
                f"TokenRows.tokens must hold integer token IDs, got dtype "
                f"{jnp.result_type(self.tokens)}."
            )
        if self.mask is not None and _shape(self.mask) != _shape(self.tokens):
            raise ValueError(
                "TokenRows.mask must match tokens, got "
                f"{_describe(tokens=self.tokens, mask=self.mask)}."
            )


class ClassScores(Artifact):
    """Per-row class scores of a classification batch.

    - `logits`: unnormalised scores `(rows, classes)`, at least 2 classes; the metrics
      read `softmax(logits)` as the predicted distribution.
    - `labels`: each row's true class, integer `(rows,)` in `[0, classes)`.
    - `weights`: optional `(rows,)` row weights (`None`: every row weighs one); a
      metric counts a row `weight` times.

    A binary task is 2 classes: `auroc` scores `softmax(logits)[:, 1]`, p(class 1).
    Concrete labels outside `[0, classes)` raise a `ValueError` naming the first, its row
    and the range; traced ones (built inside `jit`) are checked by the metrics.

    ```python
    >>> import jax.numpy as jnp
    >>> scores = ClassScores(jnp.zeros((2, 3)), jnp.array([0, 2]))
    >>> scores.num_rows, scores.classes
    (2, 3)
    >>> ClassScores(jnp.zeros((2, 3)), jnp.array([0, 3]))
    Traceback (most recent call last):
    ...
    ValueError: ClassScores.labels holds label 3 at row 1; valid labels are 0 to 2 (classes=3).

    ```
    """

    logits: Float[Array, "rows classes"]
    labels: Int[Array, " rows"]
    weights: Float[Array, " rows"] | None = None

    def __check_init__(self) -> None:
        _require_rank("ClassScores", "logits", self.logits, 2, "rows, classes")
        _require_rank("ClassScores", "labels", self.labels, 1, "rows")
        if _shape(self.logits)[1] < 2:
            raise ValueError(
                "ClassScores.logits must score at least 2 classes, got shape "
                f"{_shape(self.logits)}."
            )
        fields = {"logits": self.logits, "labels": self.labels}
        if self.weights is not None:
            _require_rank("ClassScores", "weights", self.weights, 1, "rows")
            fields["weights"] = self.weights
        if len({_shape(value)[0] for value in fields.values()}) != 1:
            raise ValueError(
                f"ClassScores fields must share one row axis, got {_describe(**fields)}."
            )
        if not jnp.issubdtype(jnp.result_type(self.labels), jnp.integer):
            raise ValueError(
                "ClassScores.labels must hold integer class labels, got dtype "
                f"{jnp.result_type(self.labels)}."
            )
        if not isinstance(self.labels, jax.core.Tracer):
            check_ids(self.labels, self.classes, subject="ClassScores.labels", noun="label",
                      size_name="classes", axes=("row",))  # fmt: skip

    @property
    def classes(self) -> int:
        """The number of classes the logits score."""
        return _shape(self.logits)[1]


# --- artifacts on the host, in one process or several ------------------------------------


def host(artifact: _A) -> _A:
    """`artifact` with every array leaf fetched to the host as a NumPy array.

    The plain, local transfer: it needs every array on this process's devices, which is
    always so in one process, and under `jax.distributed` for arrays a process made
    itself (process zero decoding its own local arrays). A global array sharded over
    several processes needs `collective_host`, called on every process.

    ```python
    >>> import jax.numpy as jnp
    >>> type(host(TokenScores(losses=jnp.ones((1, 2)), weights=jnp.ones((1, 2)))).losses)
    <class 'numpy.ndarray'>

    ```

    **Raises:** `ValueError` naming the field when an array is not fully addressable here.
    """

    def fetch(path: Any, leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            raise ValueError(
                f"{type(artifact).__name__}{jax.tree_util.keystr(path)} is a global array "
                f"of shape {leaf.shape} spread over several processes: fetch it with "
                "dew.artifacts.collective_host(artifact), called on every process."
            )
        return np.asarray(leaf)

    return jax.tree_util.tree_map_with_path(fetch, artifact)


def _plan_of(path: Any, leaf: Any) -> str:
    """One leaf's part of a gather plan: how it is fetched, its shape and dtype."""
    if isinstance(leaf, jax.Array):
        if leaf.is_deleted():
            raise ValueError(f"field {jax.tree_util.keystr(path)} is a deleted (donated) array.")
        if leaf.is_fully_replicated or (leaf.is_fully_addressable and jax.process_count() == 1):
            how = "copy"
        elif leaf.is_fully_addressable:
            how = "rows"  # process-local rows: joined in process order
        else:
            how = "gather"
            for shard in leaf.addressable_shards:  # every local shard must be readable
                shard.data.shape  # noqa: B018
        return f"{how} {leaf.dtype} {tuple(leaf.shape) if how != 'rows' else tuple(leaf.shape[1:])}"
    array = np.asarray(leaf)  # a local conversion that fails here fails before any gather
    if array.dtype == object:
        raise ValueError(
            f"field {jax.tree_util.keystr(path)} holds Python objects, not an array "
            f"({type(leaf).__name__})."
        )
    how = "rows" if jax.process_count() > 1 and array.ndim else "copy"
    return f"{how} {array.dtype} {array.shape if how == 'copy' else array.shape[1:]}"


def _join_rows(local: np.ndarray) -> np.ndarray:
    """Every process's rows of a process-local array, joined in process order (padded to
    the longest for the gather, which needs one shape everywhere)."""
    from jax.experimental import multihost_utils

    counts = np.asarray(multihost_utils.process_allgather(np.array([len(local)], np.int32)))
    counts = counts.reshape(-1)
    padded = np.zeros((int(counts.max()), *local.shape[1:]), local.dtype)
    padded[: len(local)] = local
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return np.concatenate([rows[:count] for rows, count in zip(gathered, counts, strict=True)])


def _received(value: Any) -> np.ndarray:
    """A transferred leaf as this process keeps it (a seam the failure tests patch)."""
    return np.asarray(value)


def collective_host(artifact: _A) -> _A:
    """`artifact` on the host of every process, its global arrays gathered: the
    collective counterpart of `host`, called on every process at the same point.

    Under `jax.distributed` it first checks, on each process, that every leaf converts
    locally and that its addressable shards are readable; then the processes agree on the
    gather plan (each leaf's kind, dtype and shape); then it gathers leaf by leaf, sharing
    each transfer's outcome before the next gather, so a failure on one process raises
    the same error on all of them instead of leaving the others blocked in a gather. A
    global array is gathered whole; a replicated one is copied; process-local arrays (a
    process's own rows, not a global array) are joined along their row axis in process
    order. In one process it is `host`.

    ```python
    >>> import jax.numpy as jnp
    >>> images = Images(generated=jnp.zeros((2, 4, 4, 3)))
    >>> collective_host(images).generated.shape
    (2, 4, 4, 3)

    ```

    **Raises:** `ValueError` (or `dew.artifacts.PhaseFailedError` for a failure that is
    not bad input) on every process, naming the phase, the process and the field.
    """
    if jax.process_count() == 1:
        return host(artifact)
    from jax.experimental import multihost_utils

    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(artifact)
    plan: list[str] = []
    outcome: bool | BaseException = True
    try:
        plan = [_plan_of(path, leaf) for path, leaf in paths_leaves]
    except Exception as error:
        outcome = error
    kind = type(artifact).__name__
    agree_process_phase(f"collective_host({kind}): local conversions", outcome)
    digest = hashlib.sha256("\n".join(plan).encode()).digest()[:16]
    digests = np.asarray(multihost_utils.process_allgather(np.frombuffer(digest, np.uint8)))
    differing = [index for index, row in enumerate(digests) if bytes(row) != bytes(digests[0])]
    if differing:
        raise ValueError(
            f"collective_host({kind}): process {', '.join(map(str, differing))} holds an "
            "artifact whose fields, dtypes or shapes differ from process 0's; every process "
            "must pass an artifact of the same structure (only the rows of process-local "
            "arrays may differ)."
        )
    values = []
    for (path, leaf), step in zip(paths_leaves, plan, strict=True):
        value: Any = None
        outcome = True
        try:
            if step.startswith("copy"):
                value = leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf
            elif step.startswith("rows"):
                value = _join_rows(np.asarray(leaf))
            else:
                value = multihost_utils.process_allgather(leaf, tiled=True)
            value = _received(value)
        except Exception as error:
            outcome = error
        agree_process_phase(
            f"collective_host({kind}): transfer of {jax.tree_util.keystr(path)}", outcome
        )
        values.append(value)
    return jax.tree_util.tree_unflatten(treedef, values)
