"""The metric contract: a monoid over one batch's sufficient statistics."""

import abc
import re
from typing import Any, ClassVar, Generic, TypeVar, overload

import equinox as eqx
import jax.numpy as jnp
from equinox import AbstractVar
from jaxtyping import Array, Float, PyTree, Real

from dew._checks import error_if
from dew._directions import guessed_direction
from dew.artifacts import Artifact
from dew.metrics._sums import Sum

__all__ = ["MeanState", "Metric", "raise_if"]

A = TypeVar("A", bound=Artifact)
_SNAKE_CASE = re.compile(r"[a-z][a-z0-9_]*")


class _GuessedDirection:
    """`Metric.direction` for a subclass that declares none: the guess from the metric's
    name. A descriptor rather than a property, so that a subclass's class variable
    (`direction: ClassVar[str | None] = "maximize"`) overrides a variable, which type
    checkers accept, and not a property, which they refuse."""

    @overload
    def __get__(self, metric: None, owner: type) -> "_GuessedDirection": ...
    @overload
    def __get__(self, metric: "Metric[Any]", owner: type) -> str | None: ...
    def __get__(
        self, metric: "Metric[Any] | None", owner: type
    ) -> "str | _GuessedDirection | None":
        if metric is None:
            return self
        return guessed_direction(metric.name)


class Metric(eqx.Module, Generic[A]):
    """A metric over one artifact type, as a monoid of sufficient statistics.

    Subclasses set the class variable `artifact_type`, a static `name` field, and
    implement:

    - `init()`: the identity statistics, the unit of `merge`;
    - `statistics(artifact)`: one batch's sufficient statistics;
    - `merge(accumulated, contribution)`: associative, with `init()` as unit;
    - `finalize(accumulated)`: the scalar.

    Calling the metric, `metric(artifact)`, checks the artifact's type (a
    `TypeError` names both types) and returns `statistics(artifact)`. A metric
    instance keeps no state between calls: the accumulator is a value the caller
    holds. Device metrics (`host = False`) are pure JAX and work under `jit`,
    `vmap` and `lax.scan`; host metrics keep NumPy float64 statistics and may
    merge in place.

    A metric knows which way it is better: its `direction` is `"minimize"` (lower is
    better: losses, errors, FID), `"maximize"` (higher is better: accuracies, PSNR) or
    `None` (neither: a statistic best near the data's own value). Every built-in declares
    it; a subclass sets the class variable (`direction: ClassVar[str | None] = "maximize"`),
    and one that does not gets the guess from its name
    (`dew._directions.guessed_direction`). A fit records its metrics' directions in its
    `FitStarted` record, where the console's best values, `dew runs --sort`, `dew sweep`'s
    default `--direction` and the early stopper's default `mode` read them (decision 0064).

    `finalize(init())`, the value of an empty pass, is NaN for every built-in:
    a mean over nothing is undefined, and dew reports it as data rather than
    dividing 0 by 0. `evaluate` reports no value at all for an empty pass.
    """

    name: AbstractVar[str]
    artifact_type: ClassVar[type[Artifact]]
    host: ClassVar[bool] = False
    # How many batches `MetricSet.reduce_stacked` should score at once: None for metrics
    # whose statistics stream through memory (the whole pass at once is fastest), a small
    # number for metrics with large per-batch intermediates (SSIM's filtered maps).
    scan_chunk: ClassVar[int | None] = None
    # Whether merging the statistics of any partition of an artifact's rows finalizes like
    # the whole artifact's (the batch-split invariance law `dew.testing.check_metric_laws`
    # checks). Under `jax.distributed`, a pass whose device metrics all declare it keeps an
    # accumulator on each device and merges them once, at its end (decision 0089).
    split_invariant: ClassVar[bool] = False

    direction = _GuessedDirection()
    """`"minimize"`, `"maximize"` or `None` (no direction): for a subclass that declares
    none, the guess from its name."""

    def __check_init__(self) -> None:
        if not isinstance(self.name, str) or not _SNAKE_CASE.fullmatch(self.name):
            raise ValueError(
                f"metric name {self.name!r} must be bare snake_case "
                "(lowercase letters, digits and '_', starting with a letter)."
            )

    def __call__(self, artifact: A) -> PyTree:
        """One batch's sufficient statistics, after checking the artifact's type."""
        if not isinstance(artifact, self.artifact_type):
            raise TypeError(
                f"metric {self.name!r} reads {self.artifact_type.__name__}, "
                f"got {type(artifact).__name__}."
            )
        return self.statistics(artifact)

    @abc.abstractmethod
    def init(self) -> PyTree:
        """The identity statistics (an empty pass)."""

    @abc.abstractmethod
    def statistics(self, artifact: A) -> PyTree:
        """One batch's sufficient statistics."""

    @abc.abstractmethod
    def merge(self, accumulated: PyTree, contribution: PyTree) -> PyTree:
        """Combine two statistics; associative, with `init()` as unit."""

    @abc.abstractmethod
    def finalize(self, accumulated: PyTree) -> Any:
        """The metric's scalar value for the accumulated statistics."""


def raise_if(bad: Any, message: str, value: Any) -> Any:
    """Return `value`, or raise `ValueError(message)` where `bad` holds: how a
    `finalize` refuses statistics that have no value (a pass with token positions but
    no counted target).

    Eagerly this is a plain Python check; under `jit` it becomes `eqx.error_if`,
    which raises when the compiled function runs (dew's own passes then finalize
    once more eagerly, so the user sees the plain `ValueError`).
    """
    return error_if(value, bad, message)


class MeanState(eqx.Module):
    """Statistics of a mean: a compensated total and a compensated count."""

    total: Sum
    count: Sum

    @staticmethod
    def zero() -> "MeanState":
        """The identity: nothing summed, nothing counted."""
        return MeanState(Sum.zero(), Sum.zero())

    @staticmethod
    def of(values: Real[Array, "..."], weights: Real[Array, "..."] | None = None) -> "MeanState":
        """The statistics of `values`, each weighted once or by `weights`."""
        values = jnp.asarray(values, jnp.float32)
        if weights is None:
            return MeanState(Sum.of(values), Sum.of(jnp.ones_like(values)))
        weights = jnp.asarray(weights, jnp.float32)
        weighted = jnp.where(weights != 0, values * weights, jnp.zeros_like(values))
        return MeanState(Sum.of(weighted), Sum.of(weights))

    def merge(self, other: "MeanState") -> "MeanState":
        """Add two statistics."""
        return MeanState(self.total.add(other.total), self.count.add(other.count))

    def mean(self) -> Float[Array, ""]:
        """total / count, NaN when nothing was counted."""
        count = self.count.value()
        safe = jnp.where(count == 0, jnp.ones_like(count), count)
        # A Python NaN, not a NaN array: eagerly, jax.debug_nans checks every array an op
        # builds, so only the empty pass may ever produce one.
        return jnp.where(count == 0, jnp.nan, self.total.value() / safe)
