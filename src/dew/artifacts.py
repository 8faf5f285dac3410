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
from collections.abc import Sequence
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Shaped

from dew._checks import check_ids
from dew._host import collective_host, host

# importable from here too (their home is dew.distributed): evaluation hooks call them
from dew._processes import PhaseFailedError as PhaseFailedError
from dew._processes import agree_process_phase as agree_process_phase

__all__ = [
    "Artifact",
    "ClassScores",
    "Clips",
    "Images",
    "RegressionScores",
    "Representations",
    "TokenRows",
    "TokenScores",
    "collective_host",
    "concatenate_rows",
    "host",
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
    present = [tuple(field for field in _optional_fields(artifact)) for artifact in artifacts]
    if len(set(present)) != 1:
        raise ValueError(
            "concatenate_rows needs the same optional fields in every "
            f"{type(artifacts[0]).__name__}, got {sorted(set(present))}."
        )
    if isinstance(artifacts[0], Images) and artifacts[0].prompts is not None:
        # Prompts are static per-row metadata: join them as the arrays are joined.
        prompts: list[str] = []
        for artifact in artifacts:
            if not isinstance(artifact, Images) or artifact.prompts is None:
                raise ValueError("concatenate_rows needs prompts on every Images or on none.")
            prompts.extend(artifact.prompts)
        arrays = [dataclasses.replace(artifact, prompts=None) for artifact in artifacts]
        return dataclasses.replace(_concatenate_arrays(arrays), prompts=tuple(prompts))
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


def _check_labels(kind: str, labels: Any, rows: int) -> None:
    """`labels`, where given, must hold one integer class label per generated row."""
    if labels is None:
        return
    _require_rank(kind, "labels", labels, 1, "rows")
    if _shape(labels)[0] != rows or not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
        raise ValueError(
            f"{kind}.labels must hold one integer class label per generated row ({rows}), got "
            f"shape {_shape(labels)} and dtype {jnp.result_type(labels)}."
        )


class Images(Artifact):
    """Generated images, with optional references, prompts and class labels, channels last.

    - `generated`: `(rows, height, width, channels)`, values in `[0, data_range]`.
    - `reference`: optional real images; paired metrics need one per generated row.
    - `prompts`: optional conditioning prompts, one per generated row (static).
    - `labels`: optional integer class labels `(rows,)`, the class each generated row was
      conditioned on (a preview names them by the data's class names).
    """

    generated: Float[Array, "rows height width channels"]
    reference: Float[Array, "ref_rows ref_height ref_width channels"] | None = None
    prompts: tuple[str, ...] | None = eqx.field(static=True, default=None)
    labels: Int[Array, " rows"] | None = None

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
        _check_labels("Images", self.labels, _shape(self.generated)[0])

    def rows(self, start: int, stop: int) -> Images:
        prompts = None if self.prompts is None else self.prompts[start:stop]
        return dataclasses.replace(super().rows(start, stop), prompts=prompts)


class Clips(Artifact):
    """Generated videos, with optional reference videos and class labels, channels last.

    - `generated`: `(rows, frames, height, width, channels)`.
    - `reference`: optional real videos of the same frames, height, width and channels.
    - `labels`: optional integer class labels `(rows,)`, the class each generated row was
      conditioned on (a preview names them by the data's class names).
    """

    generated: Float[Array, "rows frames height width channels"]
    reference: Float[Array, "ref_rows frames height width channels"] | None = None
    labels: Int[Array, " rows"] | None = None

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
        _check_labels("Clips", self.labels, _shape(self.generated)[0])


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
