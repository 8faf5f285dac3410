"""FID's Fréchet distance at 2048 dimensions against pytorch-fid's `calculate_frechet_distance`.

Target (DESIGN.md, "Performance targets"; issue 14 item 6): the same value to 1e-5 relative,
>= 10x faster. This script asserts nothing and always exits 0. (The feature-extraction and
whole-pass comparisons of item 6 are not here yet.)

The moments: synthetic pool3-like activations (ReLU of correlated Gaussians,
`max(z @ mix + shift, 0)` with `mix` a fixed random 2048x2048 matrix / sqrt(2048)), NumPy,
seeded, float64 as pytorch-fid holds them; means and `np.cov` computed once and handed to both
sides before timing. Three cases, one per route dew takes:

- `5000 vs 5000`: both covariances full rank (dew: Cholesky of the first);
- `1000 vs 5000`: the generated covariance singular (rows <= dims), the real one full rank
  (dew: Cholesky of the second; the usual small-population FID against real statistics);
- `1000 vs 1000`: both singular (dew: the clipped `eigh` square root of the first).

Rows, timed side by side in one run after one untimed call each (sides alternate round by
round, dew's three calls a round to pytorch-fid's one; medians):

- `pytorch-fid`: `pytorch_fid.fid_score.calculate_frechet_distance(mu1, sigma1, mu2, sigma2)`
  (`scipy.linalg.sqrtm` of the product; its `disp` DeprecationWarning silenced).
- `frechet_distance`: `dew.metrics.frechet_distance(mu1, sigma1, mu2, sigma2)`.
- `FID.finalize`: the metric's own path from its float64 state (the two populations'
  `Moments`): the unbiased covariances `m2 / (n - 1)`, then the same distance.

It prints a header (versions, cores, BLAS threads, load), then per case each side's median
seconds, the ratio pytorch-fid time / dew time (target >= 10x), the values and the relative
difference (target <= 1e-5), and dew's route and clipped negative eigenvalue share.

Run: `python benchmarks/fid.py` (about 2 minutes on 2 idle cores, nearly all of it
pytorch-fid's `sqrtm`), `--quick` (512 dimensions, one round), `--rounds N`, `--dims D`,
`--blas-threads N` (both sides limited through threadpoolctl; on a loaded machine OpenBLAS's
two threads can run several times slower than one).
pytorch-fid comes from the `parity` extra; without it the pytorch-fid rows say so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable

import numpy as np

SEED = 20261201
TARGET_SPEEDUP = 10.0
TARGET_RTOL = 1e-5


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _pytorch_fid() -> Callable[..., float] | None:
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    # PyPI's torchvision, which pytorch-fid imports, needs this module beside the CPU torch.
    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
    try:
        from pytorch_fid.fid_score import calculate_frechet_distance
    except ImportError:
        return None

    def distance(*moments: np.ndarray) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # sqrtm's `disp`
            return float(calculate_frechet_distance(*moments))

    return distance


def _activations(rng: np.random.Generator, rows: int, mix: np.ndarray, shift: float):
    return np.maximum(rng.normal(size=(rows, mix.shape[0])) @ mix + shift, 0.0)


def _timed(
    sides: dict[str, Callable[[], object]], rounds: int, repeats: dict[str, int]
) -> dict[str, list[float]]:
    """Each side `repeats[name]` times per round (order reversed every round), seconds per call."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            for _ in range(repeats.get(name, 1)):
                start = time.perf_counter()
                sides[name]()
                times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 512 dims, 1 round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--dims", type=int, default=None)
    parser.add_argument(
        "--blas-threads", type=int, default=None, help="limit BLAS threads (both sides)"
    )
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    dims = args.dims or (512 if args.quick else 2048)

    import scipy.linalg  # noqa: F401  (its own OpenBLAS, loaded before the limit below)
    import threadpoolctl

    from dew.metrics import FID, FIDState, Moments, frechet_distance

    reference = _pytorch_fid()
    if args.blas_threads is not None:  # after every import, so that every BLAS is limited
        threadpoolctl.threadpool_limits(args.blas_threads)
    blas = threadpoolctl.threadpool_info()
    threads = ",".join(f"{info['internal_api']}:{info['num_threads']}" for info in blas) or "?"
    print(
        f"dew-ml {_version('dew-ml')}  numpy {np.__version__}  scipy {_version('scipy')}  "
        f"pytorch-fid {_version('pytorch-fid')}  torch {_version('torch')}"
    )
    print(
        f"cores {os.cpu_count()}  BLAS threads {threads}  load {os.getloadavg()[0]:.1f}  "
        f"dims {dims}  rounds {rounds}"
    )
    if reference is None:
        print("pytorch-fid rows skipped: torch and pytorch-fid are in the parity extra")

    rng = np.random.default_rng(SEED)
    mix = rng.normal(size=(dims, dims)) / np.sqrt(dims)
    small, large = dims // 2, int(dims * 2.5)
    cases = [(large, large), (small, large), (small, small)]
    metric = FID(network=lambda images: images)  # finalize never calls the network

    print()
    print(
        f"{'case':<14}{'side':<18}{'median s':>10}{'speedup':>9}{'target':>8}"
        f"{'value':>22}{'rel diff':>10}  route, negative share"
    )
    for rows1, rows2 in cases:
        x1, x2 = _activations(rng, rows1, mix, 0.0), _activations(rng, rows2, mix, 0.1)
        moments = (x1.mean(axis=0), np.cov(x1, rowvar=False))
        moments += (x2.mean(axis=0), np.cov(x2, rowvar=False))
        state = FIDState(Moments.of(x1), Moments.of(x2))
        del x1, x2
        sides: dict[str, Callable[[], object]] = {
            "frechet_distance": lambda moments=moments: frechet_distance(*moments),
            "FID.finalize": lambda state=state: metric.finalize(state),
        }
        if reference is not None:
            sides["pytorch-fid"] = lambda moments=moments: reference(*moments)
        result = frechet_distance(*moments)  # the values, and every side's warm-up call
        values = {"frechet_distance": result.distance, "FID.finalize": metric.finalize(state)}
        if reference is not None:
            values["pytorch-fid"] = reference(*moments)
        times = _timed(sides, rounds, {"frechet_distance": 3, "FID.finalize": 3})
        base = values.get("pytorch-fid")
        base_time = statistics.median(times["pytorch-fid"]) if base is not None else None
        case = f"{rows1} vs {rows2}"
        for name in ("pytorch-fid", "frechet_distance", "FID.finalize"):
            if name not in times:
                continue
            median = statistics.median(times[name])
            if name == "pytorch-fid" or base_time is None:
                speedup = target = difference = ""
            else:
                ratio = base_time / median
                speedup = f"{ratio:.1f}x"
                target = "met" if ratio >= TARGET_SPEEDUP else "missed"
                rel = abs(values[name] - base) / abs(base)
                difference = f"{rel:.1e}" + ("" if rel <= TARGET_RTOL else " !")
            route = f"  {result.route}, {result.negative_mass:.1e}" if name != "pytorch-fid" else ""
            print(
                f"{case:<14}{name:<18}{median:>10.3f}{speedup:>9}{target:>8}"
                f"{values[name]:>22.12f}{difference:>10}{route}"
            )
            case = ""


if __name__ == "__main__":
    main()
