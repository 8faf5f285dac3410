"""A population's FID statistics: its streaming float64 `Moments`, the `FIDStatistics` FID
compares with (a mean, a covariance and a row count that may be unknown), and their `.npz`
file, which pytorch-fid reads and writes too."""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any, NamedTuple

import numpy as np
from jaxtyping import Float

__all__ = ["FIDStatistics", "Moments", "load_fid_statistics", "save_fid_statistics"]

_STATISTICS_FORMAT = "dew.fid_statistics.v1"


class Moments(NamedTuple):
    """Streaming float64 moments of one population of feature rows.

    - `count`: the number of rows, a float64 (exact up to 2**53 rows);
    - `mean`: `(dims,)`, their mean;
    - `m2`: `(dims, dims)`, the centred second moment `Σ (x - mean)(x - mean)ᵀ`.

    `Moments.empty()` is the identity of `merge` (it holds no feature axis yet).
    """

    # A field named as the statistic is; it hides tuple.count, which nothing calls.
    count: float  # pyright: ignore[reportIncompatibleMethodOverride]
    mean: Float[np.ndarray, " dims"]
    m2: Float[np.ndarray, "dims dims"]

    @staticmethod
    def empty() -> Moments:
        """The moments of no rows: the unit of `merge`."""
        return Moments(0.0, np.zeros((0,)), np.zeros((0, 0)))

    @staticmethod
    def of(features: Any) -> Moments:
        """The moments of `features`, `(rows, dims)`, computed in float64."""
        x = np.asarray(features, np.float64)
        if x.ndim != 2:
            raise ValueError(f"FID features must have shape (rows, dims), got shape {x.shape}.")
        if x.shape[0] == 0:
            return Moments.empty()
        mean = x.mean(axis=0)
        centred = x - mean
        return Moments(float(x.shape[0]), mean, centred.T @ centred)

    @property
    def dims(self) -> int:
        """The number of features (0 for the empty moments)."""
        return self.mean.shape[0]

    def merge(self, other: Moments) -> Moments:
        """Chan et al.'s pairwise update: the moments of both populations' rows together.

        Associative, with `Moments.empty()` as its unit; it builds new arrays and never
        writes into either operand.
        """
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        if self.dims != other.dims:
            raise ValueError(
                f"FID moments of {self.dims} and {other.dims} features cannot be merged: "
                "every batch must come from the same feature network."
            )
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + np.outer(delta, delta * (self.count * other.count / count))
        return Moments(count, mean, m2)

    def covariance(self) -> Float[np.ndarray, "dims dims"]:
        """The unbiased covariance `m2 / (count - 1)` (needs at least two rows)."""
        if self.count < 2:
            raise ValueError(f"a covariance needs at least two rows, got {self.count:g}.")
        return self.m2 / (self.count - 1.0)

    @property
    def nbytes(self) -> int:
        """The bytes the moments' arrays hold."""
        return self.mean.nbytes + self.m2.nbytes


class FIDStatistics(NamedTuple):
    """The Gaussian FID fits to one population's features: what a reference file holds.

    - `mean`: `(dims,)`; `covariance`: `(dims, dims)`, the unbiased covariance.
    - `count`: the rows they were computed from, or `None` when that is unknown
      (pytorch-fid's own `.npz` files hold `mu` and `sigma` alone); shown as `unknown`
      wherever dew prints or records it.

    `FIDStatistics.of(moments)` gives those of pooled `Moments`.
    """

    mean: Float[np.ndarray, " dims"]
    covariance: Float[np.ndarray, "dims dims"]
    count: float | None  # pyright: ignore[reportIncompatibleMethodOverride]

    @staticmethod
    def of(moments: Moments) -> FIDStatistics:
        """The statistics of `moments` (at least two rows)."""
        return FIDStatistics(moments.mean, moments.covariance(), moments.count)

    @property
    def dims(self) -> int:
        """The number of features."""
        return self.mean.shape[0]

    @property
    def rows(self) -> str:
        """The row count as text: `"30"`, or `"unknown"`."""
        return "unknown" if self.count is None else f"{self.count:g}"


def save_fid_statistics(path: str | os.PathLike[str], moments: Moments) -> pathlib.Path:
    """Write a population's moments (the real images', typically) to an `.npz` file.

    The file holds pytorch-fid's keys, `mu` (the mean) and `sigma` (the unbiased
    covariance), so pytorch-fid reads it too, and `count`, the rows, which dew needs.
    It is written to a temporary file beside `path` and moved into place, so a failed
    write leaves an existing file as it was. Read it back with `load_fid_statistics`,
    or score against it with `fid(reference=path)`.

    **Raises:** `ValueError` when `moments` holds fewer than two rows.
    """
    if moments.count < 2:
        raise ValueError(
            f"FID statistics need at least two rows, got {moments.count:g}: "
            "merge more batches' moments before saving them."
        )
    path = pathlib.Path(path)
    descriptor, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            np.savez(
                file,
                mu=moments.mean,
                sigma=moments.covariance(),
                count=np.float64(moments.count),
                format=np.str_(_STATISTICS_FORMAT),
            )
        os.replace(scratch, path)
    except BaseException:
        pathlib.Path(scratch).unlink(missing_ok=True)
        raise
    return path


def load_fid_statistics(path: str | os.PathLike[str]) -> FIDStatistics:
    """Read the statistics `save_fid_statistics` wrote, or pytorch-fid's own `.npz`
    (`save_fid_stats`, `--save-stats`: `mu` and `sigma` alone), whose row count is then
    unknown (`count=None`).

    **Raises:** `FileNotFoundError` when there is no such file; `ValueError` when the
    file is not an `.npz` of FID statistics (`mu` and `sigma`, with dew's `count` and
    `format` or without both), or they are malformed.
    """
    path = pathlib.Path(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(f"{path} is not an .npz of FID statistics ({error}).") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} holds a single array, not an .npz of FID statistics.")
    with loaded:
        arrays = {key: loaded[key] for key in loaded.files}
    stamped = "format" in arrays
    written = str(arrays.pop("format", _STATISTICS_FORMAT))
    pytorch_fid = not stamped and "count" not in arrays  # save_fid_stats: mu and sigma alone
    needed = {"mu", "sigma"} if pytorch_fid else {"mu", "sigma", "count"}
    if needed - set(arrays) or written != _STATISTICS_FORMAT:
        raise ValueError(
            f"{path} does not hold FID statistics: it has keys {sorted(arrays)} and format "
            f"{written!r}, expected 'count', 'mu' and 'sigma' in format {_STATISTICS_FORMAT!r} "
            "(written by dew.metrics.save_fid_statistics), or pytorch-fid's 'mu' and 'sigma'."
        )
    mean = np.asarray(arrays["mu"], np.float64)
    covariance = np.asarray(arrays["sigma"], np.float64)
    count = None if pytorch_fid else float(np.asarray(arrays["count"]))
    dims = mean.shape[0] if mean.ndim == 1 else -1
    if covariance.shape != (dims, dims) or not (count is None or count >= 2):
        raise ValueError(
            f"{path} holds malformed FID statistics: mu {mean.shape}, sigma "
            f"{covariance.shape} and count {'unknown' if count is None else f'{count:g}'}; "
            "expected mu (dims,), sigma (dims, dims) and a count of at least 2."
        )
    return FIDStatistics(mean, covariance, count)
