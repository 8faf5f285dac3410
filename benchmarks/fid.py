"""FID against its references: the Fréchet distance at 2048 dimensions against pytorch-fid's
`calculate_frechet_distance`, feature extraction against pytorch-fid's InceptionV3 forward, and
a whole FID pass through `dew.evaluate` against torchmetrics' `FrechetInceptionDistance`.

Targets (DESIGN.md, "Performance targets"; issue 14 item 6): the distance the same to 1e-5
relative and >= 10x faster; features <= 1.1x pytorch-fid's time per image in float32; the whole
pass: time and peak memory, quoted. This script asserts nothing and always exits 0.

**distance** (`--part distance`). The moments: synthetic pool3-like activations (ReLU of
correlated Gaussians, `max(z @ mix + shift, 0)` with `mix` a fixed random 2048x2048 matrix /
sqrt(2048)), NumPy, seeded, float64 as pytorch-fid holds them; means and `np.cov` computed once
and handed to both sides before timing. Three cases, one per route dew takes:

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

It prints per case each side's median seconds, the ratio pytorch-fid time / dew time (target
>= 10x), the values and the relative difference (target <= 1e-5), and dew's route and clipped
negative eigenvalue share.

**features** (`--part features`). pytorch-fid's own `InceptionV3([3])` with seeded random
weights (batch-norm statistics calibrated as tests/parity/_pytorch_fid.py does, so features are
O(1)) and `FIDInceptionV3` built on the same state dict, both float32; one batch of
`--feature-batch` seeded random images `--size` pixels square (resized to 299x299 inside, as
pytorch-fid does) timed side by side, alternating, after an untimed call each (dew's compiles);
`torch.no_grad()` for pytorch-fid, `eqx.filter_jit` of `model.features` (as `FID` calls it) and
`block_until_ready` for dew.
Both run on the same cores: `--threads N` pins the process to N cores
(`os.sched_setaffinity`, before JAX starts, so XLA's pool is that size) and sets
`torch.set_num_threads(N)`. It prints seconds per image, the ratio dew / pytorch-fid (target
<= 1.1x) and the largest feature difference.

**pass** (`--part pass`). A whole FID over `--rows` generated and as many real images
(default 1000 each, `--size` pixels, batches of `--batch`), each side in its own subprocess
so that its peak resident memory (`resource.getrusage(...).ru_maxrss`, which counts native
buffers that tracemalloc does not see) is its own: dew's `dew.evaluate` of a pass-through
objective (its batches' `Images(generated, reference=real)`) with `metrics.fid(weights)`, the
random weights saved as a `.pth` that dew reads without torch; torchmetrics'
`FrechetInceptionDistance(feature=<pytorch-fid's InceptionV3 on the same weights>,
normalize=True)`, `update(real, real=True)` and `update(generated, real=False)` per batch, then
`compute()` (torchmetrics' own Inception needs torch-fidelity and its download; the same
network on both sides times the pipelines, not two networks). It prints each side's seconds
(loading the network, the pass, the whole), the peak RSS after loading and after the pass,
and both values (random weights: they agree only in magnitude, torchmetrics' float32 result
and eigvals route differing from dew's float64 one by rounding).

The header gives versions, cores, BLAS threads and the load average: on a shared machine the
figures are indicative, not exact.

Run: `python benchmarks/fid.py` (all three parts: the distance about 3 minutes on 2 idle cores,
the pass ~10 minutes a side at 1000 rows on 2 cores), `--part distance|features|pass`,
`--quick` (512 dimensions and one round for the distance, 100 rows for the pass),
`--rounds N`, `--dims D`, `--rows N`, `--blas-threads N` (both sides' BLAS limited through
threadpoolctl; on a loaded machine OpenBLAS's two threads can run several times slower than
one), `--threads N`. torch, pytorch-fid and torchmetrics come from the `parity` extra; without
them their rows say so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
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
TARGET_FEATURE_RATIO = 1.1


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


def _parity_helpers():
    """tests/parity/_pytorch_fid.py (pytorch-fid's InceptionV3 on calibrated random weights),
    or None without torch and pytorch-fid."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
    try:
        import pytorch_fid.inception  # noqa: F401
    except ImportError:
        return None
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "parity"))
    import _pytorch_fid

    return _pytorch_fid


def _pytorch_fid_network(helpers, state_dict):
    """pytorch-fid's `InceptionV3([3])` on `state_dict` (its download patched to return it)."""
    import pytorch_fid.inception as pfi

    download = pfi.load_state_dict_from_url
    pfi.load_state_dict_from_url = lambda *args, **kwargs: state_dict
    try:
        return pfi.InceptionV3([3]).eval()
    finally:
        pfi.load_state_dict_from_url = download


def _random_images(seed: int, rows: int, size: int) -> np.ndarray:
    """Seeded float32 images in [0, 1], NHWC: smooth colour fields plus noise."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.2, 0.8, (rows, 1, 1, 3))
    return np.clip(base + rng.normal(0.0, 0.15, (rows, size, size, 3)), 0.0, 1.0).astype(np.float32)


def _features_part(args: argparse.Namespace, helpers) -> None:
    import equinox as eqx
    import jax
    import torch

    from dew.nn.inception import FIDInceptionV3

    print(
        f"\nfeatures: {args.feature_batch} images {args.size}x{args.size} a batch, float32, "
        f"torch threads {torch.get_num_threads()}, rounds {args.rounds or 3}"
    )
    if helpers is None:
        print("skipped: torch and pytorch-fid are in the parity extra")
        return
    state = helpers.calibrated_state_dict(seed=0, sizes=[(args.size, args.size)])
    reference = _pytorch_fid_network(helpers, state)
    model = FIDInceptionV3({k: v.numpy() for k, v in state.items()}, dtype="float32")
    compiled = eqx.filter_jit(lambda network, x: network(x))  # as FID calls it
    images = _random_images(SEED, args.feature_batch, args.size)
    nchw = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    on_device = jax.device_put(images)

    def torch_side() -> np.ndarray:
        with torch.no_grad():
            return reference(nchw)[0].reshape(len(images), -1).numpy()

    def dew_side() -> np.ndarray:
        return np.asarray(compiled(model.features, on_device).block_until_ready())

    start = time.perf_counter()
    ours = dew_side()
    compile_s = time.perf_counter() - start
    theirs = torch_side()
    times = _timed({"pytorch-fid": torch_side, "FIDInceptionV3": dew_side}, args.rounds or 3, {})
    base = statistics.median(times["pytorch-fid"]) / len(images)
    print(f"{'side':<18}{'s/image':>10}{'ratio':>8}{'target':>8}  max |difference|")
    print(f"{'pytorch-fid':<18}{base:>10.4f}")
    median = statistics.median(times["FIDInceptionV3"]) / len(images)
    ratio = median / base
    met = "met" if ratio <= TARGET_FEATURE_RATIO else "missed"
    print(
        f"{'FIDInceptionV3':<18}{median:>10.4f}{ratio:>7.2f}x{met:>8}"
        f"  {np.abs(ours - theirs).max():.1e} (features up to {np.abs(theirs).max():.2f}; "
        f"first call with compilation {compile_s:.1f} s)"
    )


def _pass_side(args: argparse.Namespace) -> None:
    """One side of the pass, in this (sub)process: prints one JSON line."""
    import json
    import resource

    def peak_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    batches = [
        (_random_images(2 * index, rows, args.size), _random_images(2 * index + 1, rows, args.size))
        for index, rows in enumerate(_batch_rows(args.rows, args.batch))
    ]
    start = time.perf_counter()
    if args.pass_side == "dew":
        import jax

        from dew import evaluate, metrics

        objective = _pass_through_objective()
        metric = metrics.fid(weights=args.weights)
        loaded_s, loaded_mb = time.perf_counter() - start, peak_mb()
        data = [{"generated": generated, "real": real} for generated, real in batches]
        result = evaluate(objective, {}, data, metrics=[metric], key=jax.random.key(0))
        value = result.scores["fid"]
    else:
        helpers = _parity_helpers()  # first: the torchvision stub before torchmetrics
        import torch
        from torchmetrics.image.fid import FrechetInceptionDistance

        state = torch.load(args.weights, weights_only=True)
        network = _pytorch_fid_network(helpers, state)

        class Pool3(torch.nn.Module):
            num_features = 2048

            def __init__(self):
                super().__init__()
                self.network = network

            def forward(self, images):
                return self.network(images)[0].flatten(1)

        fid = FrechetInceptionDistance(feature=Pool3(), normalize=True)
        loaded_s, loaded_mb = time.perf_counter() - start, peak_mb()
        with torch.no_grad():
            for generated, real in batches:
                fid.update(torch.from_numpy(real.transpose(0, 3, 1, 2).copy()), real=True)
                fid.update(torch.from_numpy(generated.transpose(0, 3, 1, 2).copy()), real=False)
            value = float(fid.compute())
    total_s = time.perf_counter() - start
    print(
        json.dumps(
            {
                "load_s": loaded_s,
                "pass_s": total_s - loaded_s,
                "total_s": total_s,
                "loaded_mb": loaded_mb,
                "peak_mb": peak_mb(),
                "value": value,
            }
        )
    )


def _batch_rows(rows: int, batch: int) -> list[int]:
    return [min(batch, rows - start) for start in range(0, rows, batch)]


def _pass_through_objective():
    """An objective whose scoring artifact is its batch's generated and real images."""
    from dew.artifacts import Images
    from dew.objectives.base import Objective

    class PassThrough(Objective):
        name: str = "pass_through"

        def init_params(self):
            return {}

        def loss(self, params, batch, key):
            raise NotImplementedError

        def evaluate(self, params, batch, key):
            return Images(batch["generated"], reference=batch["real"])

        def batch_keys(self, split):
            return {"generated": None, "real": None}

        def check_batch(self, batch):
            return None

        def generate_preview(self, params, batch, key):
            return None

        def default_metrics(self):
            return ()

    return PassThrough()


def _pass_part(args: argparse.Namespace, helpers) -> None:
    import json
    import subprocess
    import tempfile

    rows = args.rows or (100 if args.quick else 1000)
    print(
        f"\npass: {rows} generated and {rows} real images {args.size}x{args.size}, batches of "
        f"{args.batch}, one subprocess a side"
    )
    if helpers is None:
        print("skipped: torch, pytorch-fid and torchmetrics are in the parity extra")
        return
    import torch

    with tempfile.TemporaryDirectory() as folder:
        weights = pathlib.Path(folder) / "random_inception.pth"
        torch.save(helpers.calibrated_state_dict(seed=0, sizes=[(args.size, args.size)]), weights)
        results = {}
        for side in ("dew", "torchmetrics"):
            command = [sys.executable, __file__, "--pass-side", side, "--weights", str(weights)]
            command += ["--rows", str(rows), "--batch", str(args.batch), "--size", str(args.size)]
            if args.threads is not None:
                command += ["--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{side}: failed ({done.returncode}): {done.stderr.strip()[-400:]}")
                continue
            results[side] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"{'side':<14}{'load s':>8}{'pass s':>9}{'total s':>9}{'ratio':>8}"
        f"{'RSS loaded MB':>15}{'peak RSS MB':>13}{'value':>16}"
    )
    base = results.get("torchmetrics", {}).get("total_s")
    for side, result in results.items():
        ratio = f"{result['total_s'] / base:.2f}x" if base else ""
        print(
            f"{side:<14}{result['load_s']:>8.1f}{result['pass_s']:>9.1f}{result['total_s']:>9.1f}"
            f"{ratio:>8}{result['loaded_mb']:>15.0f}{result['peak_mb']:>13.0f}"
            f"{result['value']:>16.6f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "distance", "features", "pass"), default="all")
    parser.add_argument("--quick", action="store_true", help="smoke run: 512 dims, 1 round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--dims", type=int, default=None)
    parser.add_argument(
        "--blas-threads", type=int, default=None, help="limit BLAS threads (both sides)"
    )
    parser.add_argument("--threads", type=int, default=None, help="pin to N cores (both sides)")
    parser.add_argument("--rows", type=int, default=None, help="pass: rows a population")
    parser.add_argument("--batch", type=int, default=50, help="pass: rows a batch")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--feature-batch", type=int, default=8, help="features: rows a batch")
    parser.add_argument("--pass-side", choices=("dew", "torchmetrics"), help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads is not None:  # before JAX or torch start their thread pools
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.threads])
    if args.pass_side is not None:
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        _pass_side(args)
        return
    rounds = args.rounds or (1 if args.quick else 2)
    dims = args.dims or (512 if args.quick else 2048)

    import scipy.linalg  # noqa: F401  (its own OpenBLAS, loaded before the limit below)
    import threadpoolctl

    reference = _pytorch_fid()
    helpers = _parity_helpers()
    if helpers is not None and args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.blas_threads is not None:  # after every import, so that every BLAS is limited
        threadpoolctl.threadpool_limits(args.blas_threads)
    blas = threadpoolctl.threadpool_info()
    threads = ",".join(f"{info['internal_api']}:{info['num_threads']}" for info in blas) or "?"
    print(
        f"dew-ml {_version('dew-ml')}  numpy {np.__version__}  scipy {_version('scipy')}  "
        f"pytorch-fid {_version('pytorch-fid')}  torch {_version('torch')}  "
        f"torchmetrics {_version('torchmetrics')}  jax {_version('jax')}"
    )
    print(
        f"cores {len(os.sched_getaffinity(0))} of {os.cpu_count()}  BLAS threads {threads}  "
        f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}  dims {dims}  rounds {rounds}"
    )
    if args.part in ("all", "distance"):
        _distance_part(reference, rounds, dims)
    if args.part in ("all", "features"):
        _features_part(args, helpers)
    if args.part in ("all", "pass"):
        _pass_part(args, helpers)
    print(f"\nload at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def _distance_part(reference, rounds: int, dims: int) -> None:
    from dew.metrics import Moments, frechet_distance
    from dew.metrics._fid import FID, FIDState

    print("\ndistance")
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
