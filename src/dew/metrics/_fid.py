"""FID: the Fréchet distance between Gaussians fitted to features of two image populations.

A host metric. Each population (the generated images and the real ones) is pooled as
float64 `Moments`, a count, a mean and a centred second moment merged with Chan et al.'s
pairwise update, so the state takes O(D²) memory however many batches it sees, and
`finalize` computes one distance from the unbiased covariances. The distance takes the
symmetric route (DESIGN.md, "Performance targets"): a Cholesky factor `L` of one
covariance and the eigenvalues of the congruent product `Lᵀ C₂ L`, whose square roots sum
to `tr √(C₁ C₂)`; where both covariances are singular (always when a population has no
more rows than features) one of them's symmetric `eigh` square root, its eigenvalues
clipped at zero, takes the place of `L` (as `V √Λ`, the clipped directions dropped).
`scipy.linalg.sqrtm` is never called.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import numpy as np
from jaxtyping import Array

from dew.artifacts import Artifact, Images
from dew.metrics._base import Metric
from dew.metrics._features import FeatureDefinition
from dew.metrics._fid_statistics import FIDStatistics, Moments, load_fid_statistics
from dew.nn.inception import FEATURES, FIDInceptionV3

__all__ = [
    "FID",
    "FIDState",
    "FrechetDistance",
    "fid",
    "frechet_distance",
]

# The clipped negative eigenvalues' share of the eigenvalue mass above which
# `frechet_distance` warns: rounding leaves ~1e-13 on singular covariances; more says a
# matrix passed in is not a covariance (not positive semi-definite).
NEGATIVE_MASS_WARNING = 1e-6
_EPS = float(np.finfo(np.float64).eps)


class FrechetDistance(NamedTuple):
    """The result of `frechet_distance`.

    - `distance`: `‖μ₁ - μ₂‖² + tr C₁ + tr C₂ - 2 tr √(C₁ C₂)`, a float; NaN when an input
      is not finite.
    - `negative_mass`: the eigenvalues clipped at zero, as a share of the eigenvalue mass:
      `Σ|λ|` over the negative eigenvalues of the congruent product (and, on the `eigh`
      route, of the covariance whose square root was taken) over `Σ|λ|` over all of them,
      the larger share of the two. Rounding leaves about 1e-13 or less; `frechet_distance`
      warns above `NEGATIVE_MASS_WARNING` (1e-6), where a matrix is not a covariance.
    - `route`: `"cholesky"` (a covariance was positive definite), `"eigh"` (both were
      singular) or `"non-finite"`.

    `float(result)` is the distance, as `float(calculate_frechet_distance(...))` is
    pytorch-fid's.
    """

    distance: float
    negative_mass: float
    route: str

    def __float__(self) -> float:
        """The distance."""
        return float(self.distance)


def _negative_share(eigenvalues: np.ndarray) -> float:
    total = np.abs(eigenvalues).sum()
    negative = -eigenvalues[eigenvalues < 0].sum()
    return float(negative / total) if total > 0 else 0.0


def _check_gaussian(which: str, mean: Any, cov: Any) -> tuple[np.ndarray, np.ndarray]:
    mean, cov = np.asarray(mean, np.float64), np.asarray(cov, np.float64)
    if mean.ndim != 1 or cov.shape != (mean.shape[0], mean.shape[0]):
        raise ValueError(
            f"frechet_distance: mean{which} must have shape (dims,) and cov{which} "
            f"(dims, dims), got mean{which} {mean.shape} and cov{which} {cov.shape}."
        )
    return mean, cov


def frechet_distance(mean1: Any, cov1: Any, mean2: Any, cov2: Any) -> FrechetDistance:
    """The Fréchet distance between `N(mean1, cov1)` and `N(mean2, cov2)`, in float64.

    pytorch-fid's `calculate_frechet_distance` without `scipy.linalg.sqrtm`:
    `tr √(C₁ C₂)` is the sum of the square roots of the eigenvalues of `Lᵀ C₂ L`, where
    `C₁ = L Lᵀ` (Cholesky; `C₂`'s factor is tried when `C₁` is singular). When both are
    singular, `L` is `C₁`'s symmetric square root from `eigh`, its eigenvalues clipped at
    zero, and those at or below rounding (`dims · ε · λmax`, NumPy's `matrix_rank`
    tolerance) counted as zero too (kept as `V √Λ` over the eigenvalues left, a
    `(dims, rank)` factor with the same product eigenvalues and a smaller product).
    Negative eigenvalues of the product are clipped at zero, which is the real part `sqrtm`
    would give; their share is reported in the result, never hidden (decision 0019).

    ```python
    >>> import numpy as np
    >>> from dew.metrics import frechet_distance
    >>> result = frechet_distance(np.zeros(2), np.diag([1.0, 4.0]), np.ones(2), np.eye(2))
    >>> round(result.distance, 12), result.route  # |μ₁ - μ₂|² + (1 - 1)² + (2 - 1)²
    (3.0, 'cholesky')
    >>> round(float(result), 12)  # as pytorch-fid's users write it
    3.0

    ```

    **Arguments:** the two means `(dims,)` and covariances `(dims, dims)` (symmetric
    positive semi-definite), any array type; they are converted to float64 NumPy arrays.

    **Returns:** a `FrechetDistance` (`distance`, `negative_mass`, `route`).

    **Raises:** `ValueError` when the shapes do not agree.
    """
    return _frechet_distance(mean1, cov1, mean2, cov2)


def _frechet_distance(
    mean1: Any, cov1: Any, mean2: Any, cov2: Any, *, singular: tuple[bool, bool] = (False, False)
) -> FrechetDistance:
    """`frechet_distance`; `singular[i]` says covariance `i` is known to be singular (it
    came from no more rows than dims), so its Cholesky factor is not tried: a failed
    attempt at 2048 dims costs about a full one (0.1 s)."""
    mean1, cov1 = _check_gaussian("1", mean1, cov1)
    mean2, cov2 = _check_gaussian("2", mean2, cov2)
    if mean1.shape != mean2.shape:
        raise ValueError(
            f"frechet_distance compares Gaussians of one dimension, got {mean1.shape[0]} "
            f"and {mean2.shape[0]} dims."
        )
    if not all(np.isfinite(a).all() for a in (mean1, cov1, mean2, cov2)):
        return FrechetDistance(float("nan"), float("nan"), "non-finite")
    # cholesky, eigh and eigvalsh read only the lower triangle, so the rounding asymmetry of
    # a covariance (or of the product) needs no D² symmetrising pass.
    factor, other, route, clipped = None, cov2, "cholesky", 0.0
    for first, second, known_singular in ((cov1, cov2, singular[0]), (cov2, cov1, singular[1])):
        if known_singular:
            continue
        try:
            factor, other = np.linalg.cholesky(first), second
            break
        except np.linalg.LinAlgError:
            continue
    if factor is None:  # both singular: cov1 = F Fᵀ from eigh, eigenvalues clipped at zero
        route = "eigh"
        eigenvalues, vectors = np.linalg.eigh(cov1)
        clipped = _negative_share(eigenvalues)
        # F = V √Λ without the clipped directions, whose columns would be zero: FᵀC₂F has the
        # nonzero eigenvalues of √C₁ C₂ √C₁ in a smaller matrix.
        # Eigenvalues at or below the rounding floor (NumPy's matrix_rank tolerance, D·ε·λmax)
        # are zero in exact arithmetic: with n <= D rows, about D - n + 1 of them. Dropping
        # them too keeps their √(noise) out of the trace and the product near the true rank.
        kept = eigenvalues > max(eigenvalues[-1], 0.0) * eigenvalues.size * _EPS
        factor = vectors[:, kept] * np.sqrt(eigenvalues[kept])
    product = factor.T @ other @ factor
    eigenvalues = np.linalg.eigvalsh(product)
    negative_mass = max(clipped, _negative_share(eigenvalues))
    if negative_mass > NEGATIVE_MASS_WARNING:
        warnings.warn(
            f"frechet_distance clipped negative eigenvalues holding {negative_mass:.3g} of the "
            "eigenvalue mass at zero: a covariance passed in is not positive semi-definite.",
            RuntimeWarning,
            stacklevel=2,
        )
    difference = mean1 - mean2
    # No floor here: the product's small eigenvalues are real whenever the covariances span
    # many scales (pool3 features do: λmax(C₁C₂) ~ 1e10 beside eigenvalues of 1e-3, which a
    # D·ε·λmax floor would drop, moving FID by 1%). Only the negative ones are clipped.
    trace_sqrt = np.sqrt(np.clip(eigenvalues, 0.0, None)).sum()
    distance = difference @ difference + np.trace(cov1) + np.trace(cov2) - 2.0 * trace_sqrt
    return FrechetDistance(float(distance), float(negative_mass), route)


class FIDState(NamedTuple):
    """FID's accumulator: the moments of the generated and of the reference features."""

    generated: Moments
    reference: Moments


def _statistics(reference: Any) -> FIDStatistics | None:
    """`FID.reference` as `FIDStatistics`: pooled `Moments` are converted (two rows at
    least)."""
    if reference is None or isinstance(reference, FIDStatistics):
        return reference
    if isinstance(reference, Moments):
        if reference.count < 2:
            raise ValueError(
                f"FID's reference statistics need at least two rows, got {reference.count:g}."
            )
        return FIDStatistics.of(reference)
    raise TypeError(
        "FID's reference must be FIDStatistics (load_fid_statistics), Moments or None, got "
        f"{type(reference).__name__}."
    )


@eqx.filter_jit
def _extract(network: Callable[[Array], Array], images: Array) -> Array:
    return network(images)


class FID(Metric[Images]):
    """Fréchet Inception Distance over `Images`: generated rows against reference rows.

    `dew.metrics.fid()` builds it, on pytorch-fid's InceptionV3 or another network. The fields:

    - `network`: the feature network, a (jit-compatible) callable from images
      `(rows, height, width, 3)` in `[0, 1]` to features `(rows, dims)`. Values compare
      with pytorch-fid's only for `FIDInceptionV3.features` on its published weights.
    - `reference`: precomputed `FIDStatistics` of the real population
      (`load_fid_statistics`; `Moments` given here are converted), or None to pool each
      batch's `Images.reference` rows.
    - `name`: the reported name, `fid` by default.
    - `definition`: the `FeatureDefinition` of `network` (`fid()` gives InceptionV3's),
      which `feature_definition()` reports; `None` names the callable alone.

    Both populations are pooled separately and may differ in size; `finalize` needs at
    least two rows in each (a `ValueError` names the counts; an empty pass is NaN). The
    value is a float64 distance, NaN when a feature was not finite.
    """

    artifact_type: ClassVar[type[Artifact]] = Images
    host: ClassVar[bool] = True

    network: Callable[[Array], Array]
    reference: FIDStatistics | None = eqx.field(default=None, converter=_statistics)
    name: str = eqx.field(static=True, default="fid")
    direction: ClassVar[str | None] = "minimize"
    definition: FeatureDefinition | None = eqx.field(static=True, default=None)

    def feature_definition(self) -> dict[str, Any]:
        """What the score reads the images through (`dew.metrics.DescribesFeatures`):
        `definition`'s fields (without one, the network callable's name and nothing
        else), and the reference population: `"reference": "pooled"` (the pass's
        reference rows), or `"statistics"` with their `"reference_rows"` (`None`: unknown,
        pytorch-fid's own file)."""
        if self.definition is not None:
            described: dict[str, Any] = self.definition.to_dict()
        else:
            network = getattr(self.network, "__qualname__", type(self.network).__name__)
            described = {"network": network, "preprocessing": None, "weights_sha256": None}
        if self.reference is None:
            return {**described, "reference": "pooled"}
        count = self.reference.count
        rows = None if count is None else int(count)
        return {**described, "reference": "statistics", "reference_rows": rows}

    def moments(self, images: Any) -> Moments:
        """The float64 moments of the network's features of `images`, one population."""
        if np.shape(images)[0] == 0:
            return Moments.empty()
        return Moments.of(_extract(self.network, images))

    def init(self) -> FIDState:
        """No rows in either population."""
        return FIDState(Moments.empty(), Moments.empty())

    def statistics(self, artifact: Images) -> FIDState:
        """The moments of the batch's generated and (without `reference`) reference rows."""
        if self.reference is not None:
            return FIDState(self.moments(artifact.generated), Moments.empty())
        if artifact.reference is None:
            raise ValueError(
                f"metric {self.name!r} compares generated images with real ones, but the "
                "batch has no reference images: pass Images(..., reference=real_images), or "
                "precomputed statistics of the real population (fid(reference=path))."
            )
        return FIDState(self.moments(artifact.generated), self.moments(artifact.reference))

    def merge(self, accumulated: FIDState, contribution: FIDState) -> FIDState:
        """Merge each population's moments (Chan et al.); a new state, operands untouched."""
        return FIDState(
            accumulated.generated.merge(contribution.generated),
            accumulated.reference.merge(contribution.reference),
        )

    def distance(self, accumulated: FIDState) -> FrechetDistance:
        """The whole result of `finalize`: the distance, its clipped negative eigenvalue
        share and its route (see `FrechetDistance`)."""
        generated, pooled = accumulated
        if generated.count == 0 and pooled.count == 0:
            return FrechetDistance(float("nan"), float("nan"), "empty")
        reference = self.reference
        if generated.count < 2 or (reference is None and pooled.count < 2):
            rows = f"{pooled.count:g}" if reference is None else reference.rows
            raise ValueError(
                f"metric {self.name!r} needs at least two rows in each population, got "
                f"{generated.count:g} generated and {rows} reference rows."
            )
        if reference is None:
            reference = FIDStatistics.of(pooled)
        if generated.dims != reference.dims:
            raise ValueError(
                f"metric {self.name!r}: the generated features have {generated.dims} dims "
                f"but the reference statistics {reference.dims}; they must come from the "
                "same feature network."
            )
        # n rows give a covariance of rank at most n - 1: singular when n <= dims (a file's
        # statistics of an unknown count are tried as if they were not)
        known = reference.count is not None and reference.count <= reference.dims
        return _frechet_distance(
            generated.mean,
            generated.covariance(),
            reference.mean,
            reference.covariance,
            singular=(generated.count <= generated.dims, known),
        )

    def finalize(self, accumulated: FIDState) -> float:
        """The Fréchet distance of the two populations' features (NaN for an empty pass)."""
        return self.distance(accumulated).distance


def fid(
    weights: str | os.PathLike[str] | None = None,
    *,
    network: Callable[[Array], Array] | None = None,
    dtype: str = "float32",
    reference: str | os.PathLike[str] | FIDStatistics | Moments | None = None,
    name: str = "fid",
) -> FID:
    """Fréchet Inception Distance over `Images`, as pytorch-fid 0.3.0 computes it (name `fid`).

    **Arguments:**

    - `weights`: pytorch-fid's `pt_inception-2015-12-05-6726825d.pth`; by default the file
      named by `$DEW_FID_WEIGHTS`, else `~/.cache/dew/pt_inception-2015-12-05-6726825d.pth`,
      checked by its SHA-256 prefix (`dew.nn.inception.default_weights_path`). Nothing is
      downloaded.
    - `network`: another feature network instead of InceptionV3, a (jit-compatible)
      callable from images `(rows, height, width, 3)` in `[0, 1]` to features
      `(rows, dims)`: the metric is then the Fréchet distance of its features, not FID
      (`weights` must be None; nothing is loaded).
    - `dtype`: the network's `"float32"` (default) or `"float64"` (needs 64-bit JAX).
    - `reference`: precomputed statistics of the real population: the path of a file
      `save_fid_statistics` wrote, or of pytorch-fid's own `.npz` (its row count then
      unknown), `FIDStatistics` or `Moments`; None pools the batches' reference rows.
    - `name`: the reported name.

    **Raises:** `FileNotFoundError` when the weights (or the statistics) are not there, the
    message saying where to put pytorch-fid's published weights.
    """
    if reference is not None and not isinstance(reference, FIDStatistics | Moments):
        reference = load_fid_statistics(reference)
    if network is not None:
        if weights is not None:
            raise ValueError(
                f"fid takes weights for InceptionV3 or another network, not both; got "
                f"weights={weights!r} and network={network!r}."
            )
        return FID(network=network, reference=reference, name=name)
    inception = FIDInceptionV3.load(weights, dtype=dtype)
    definition = FeatureDefinition(FEATURES, inception.preprocessing, inception.weights_sha256)
    return FID(network=inception.features, reference=reference, name=name, definition=definition)
