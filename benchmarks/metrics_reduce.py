"""A validation pass reduced in one compiled scan (dew) against torchmetrics, on the CPU.

Design target (DESIGN.md, "Performance targets"): a validation pass that reduces its metrics
inside one compiled scan runs at >= 3x the throughput of torchmetrics doing the same metric on
the same CPU and data. This script measures that ratio; it asserts nothing and always exits 0.

Data: one synthetic validation pass, generated once with NumPy (seeded) and handed to both
sides before any timing (dew: device arrays, channels last; torch: tensors, NCHW).

- Language model: 64 batches of 32 rows x 128 positions of logits over a 256-token vocabulary,
  targets, and per-row padding (every row keeps 64..128 positions; the rest weigh zero).
- Images: 32 batches of 16 RGB 64x64 generated/reference pairs in [0, 1].

Groups, and why each comparison is the same work:

- `perplexity (logits)`: torchmetrics' `Perplexity` only reads logits and targets, so both
  sides start from the logits. torchmetrics: `Perplexity(ignore_index=-100)` with padded
  targets set to -100. dew: one `jax.jit`-compiled `lax.scan` over the batches whose body
  scores a batch as `LMObjective` does (`token_log_probs`: `log_softmax` + `take_along_axis`),
  builds `TokenScores(losses, weights)` with zero weight on padding, and merges it into
  `MetricSet([perplexity()])`: the body of `MetricSet.reduce_stacked`'s scan with the scoring
  fused in. The variant `vmap + reduce_stacked` uses the public API unchanged: the same
  scoring `vmap`-ed over the stacked logits, then `reduce_stacked` on the stacked scores, all
  in one compiled call.
- `perplexity (losses)`: the metric layer alone, on per-position losses computed once from
  the same logits. dew: `reduce_stacked` over stacked `TokenScores`; torchmetrics:
  `MeanMetric` updated with the losses and the weights, exponentiated after `compute()`
  (`Perplexity` cannot read losses).
- `psnr`: dew `psnr()` over `Images` (PSNR of each image, averaged over images); torchmetrics
  `PeakSignalNoiseRatio(data_range=1.0, reduction="elementwise_mean", dim=(1, 2, 3))`, the same
  per-image definition.
- `ssim`: dew `ssim()` (scikit-image's Gaussian SSIM: sigma 1.5, 11 taps, mean over the pixels
  whose window lies inside the image); torchmetrics
  `StructuralSimilarityIndexMeasure(data_range=1.0, gaussian_kernel=True, sigma=1.5,
  kernel_size=11)`. torchmetrics reflect-pads each image by 5 pixels and averages the SSIM map
  over the whole image, border pixels (whose windows read the reflection) included, so its
  value differs slightly from dew's. The script checks that this border is the whole
  difference: torchmetrics' full SSIM map of the first batches, cropped to the valid region,
  matches dew.

Timing: each side is warmed up once (dew: compile and run; excluded, but printed), then the
sides alternate pass by pass, `--repeats` times, so that both see the same machine load;
the table shows the median wall time of one full pass (`time.perf_counter`). dew results are
`block_until_ready`; torchmetrics runs `reset(); update(...) per batch; compute()` under
`torch.inference_mode()` with as many torch threads as the process has CPU cores
(`--torch-threads` overrides). On a machine whose cores are busy with other work, torch's
OpenMP pool stalls and its times balloon: read the load average the script prints.

`--prototypes` additionally times variants that are NOT dew's code, clearly labelled, to size
possible changes to `src/dew`: SSIM with its separable Gaussian filter as two banded matmuls,
a `logsumexp - gather` token loss, and `reduce_stacked` as a map and a fold (every batch's
statistics at once under `vmap`, then the merges in a scan over those small statistics).

Run: `python benchmarks/metrics_reduce.py` (full: about 1.5 minutes on an idle 2-core CPU),
`--quick` (a smoke run on a tiny pass, 1 repeat; mostly imports and compilation). torch and
torchmetrics come from the `bench` extra (`pip install torch==2.13.0 torchmetrics`); without
them the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SEED = 20261130
IGNORE_INDEX = -100
TARGET_RATIO = 3.0


@dataclass(frozen=True)
class Sizes:
    lm_batches: int
    lm_rows: int
    lm_positions: int
    vocab: int
    image_batches: int
    image_rows: int
    image_side: int
    repeats: int
    check_batches: int


FULL = Sizes(64, 32, 128, 256, 32, 16, 64, 5, 2)
QUICK = Sizes(4, 8, 32, 256, 2, 4, 32, 1, 1)


@dataclass
class Group:
    """One metric group: dew variants and the torchmetrics run, each a full pass."""

    name: str
    dew: dict[str, Callable[[], dict[str, float]]]
    torch: Callable[[], dict[str, float]]
    dew_ms: dict[str, float] = field(default_factory=dict)
    torch_ms: float = float("nan")
    warmup_s: dict[str, float] = field(default_factory=dict)
    dew_values: dict[str, dict[str, float]] = field(default_factory=dict)
    torch_values: dict[str, float] = field(default_factory=dict)
    floor: Callable[[], dict[str, float]] | None = None
    floor_ms: float = float("nan")


# --------------------------------------------------------------------------------------------
# Data


def make_lm_pass(sizes: Sizes, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shape = (sizes.lm_batches, sizes.lm_rows, sizes.lm_positions)
    logits = 2.0 * rng.standard_normal((*shape, sizes.vocab), dtype=np.float32)
    targets = rng.integers(0, sizes.vocab, shape, dtype=np.int64)
    lengths = rng.integers(sizes.lm_positions // 2, sizes.lm_positions + 1, shape[:2])
    weights = (np.arange(sizes.lm_positions) < lengths[..., None]).astype(np.float32)
    return {"logits": logits, "targets": targets, "weights": weights}


def make_image_pass(sizes: Sizes, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Reference images with some structure (8x8 blocks plus texture), and noisy copies."""
    side, block = sizes.image_side, 8
    coarse = rng.random(
        (sizes.image_batches, sizes.image_rows, side // block, side // block, 3), np.float32
    )
    reference = np.repeat(np.repeat(coarse, block, axis=2), block, axis=3)
    reference += 0.05 * rng.standard_normal(reference.shape, dtype=np.float32)
    reference = np.clip(reference, 0.0, 1.0)
    generated = reference + 0.1 * rng.standard_normal(reference.shape, dtype=np.float32)
    generated = np.clip(generated, 0.0, 1.0)
    return {"generated": generated, "reference": reference}


# --------------------------------------------------------------------------------------------
# Timing


def time_groups(groups: list[Group], repeats: int, time_torch: bool = True) -> None:
    """Warm each side up once, then time `repeats` passes per side, the sides alternating."""
    import jax

    def run(fn: Callable[[], dict[str, float]]) -> tuple[float, dict[str, float]]:
        start = time.perf_counter()
        values = jax.block_until_ready(fn())
        return time.perf_counter() - start, {name: float(value) for name, value in values.items()}

    for group in groups:
        sides = dict(group.dew)
        if time_torch:
            sides["torchmetrics"] = group.torch
        if group.floor is not None:
            sides["floor"] = group.floor
        samples: dict[str, list[float]] = {label: [] for label in sides}
        values: dict[str, dict[str, float]] = {}
        for label, fn in sides.items():
            group.warmup_s[label], values[label] = run(fn)
        for _ in range(repeats):
            for label, fn in sides.items():
                samples[label].append(run(fn)[0])
        group.dew_ms = {label: 1e3 * statistics.median(samples[label]) for label in group.dew}
        if group.floor is not None:
            group.floor_ms = 1e3 * statistics.median(samples["floor"])
        group.dew_values = {label: values[label] for label in group.dew}
        if time_torch:
            group.torch_ms = 1e3 * statistics.median(samples["torchmetrics"])
            group.torch_values = values["torchmetrics"]
        print(f"  timed {group.name}", flush=True)


# --------------------------------------------------------------------------------------------
# dew


def dew_groups(
    lm: dict[str, np.ndarray], images: dict[str, np.ndarray], sizes: Sizes
) -> tuple[dict[str, dict[str, Callable[[], dict[str, float]]]], np.ndarray]:
    """The dew side of every group (a callable per variant, each one full pass), and the
    per-position losses of the LM pass for the torchmetrics `MeanMetric` run."""
    import jax
    import jax.numpy as jnp

    from dew import metrics
    from dew.artifacts import Images, TokenScores
    from dew.objectives.base import token_log_probs

    logits = jnp.asarray(lm["logits"])
    targets = jnp.asarray(lm["targets"], jnp.int32)
    weights = jnp.asarray(lm["weights"])
    perplexity = metrics.MetricSet([metrics.perplexity()])

    def scores(batch_logits, batch_targets, batch_weights) -> TokenScores:
        return TokenScores(-token_log_probs(batch_logits, batch_targets), batch_weights)

    @jax.jit
    def scored_in_scan(logits, targets, weights):
        def step(state, batch):
            return perplexity.update(state, scores(*batch)), None

        state, _ = jax.lax.scan(step, perplexity.init(), (logits, targets, weights))
        return perplexity.finalize(state)

    @jax.jit
    def vmap_then_reduce_stacked(logits, targets, weights):
        return perplexity.reduce_stacked(jax.vmap(scores)(logits, targets, weights))

    losses = jax.block_until_ready(jax.jit(jax.vmap(scores))(logits, targets, weights))
    stacked_scores = metrics.stack_batches(
        [TokenScores(losses.losses[b], losses.weights[b]) for b in range(sizes.lm_batches)]
    )
    stacked_images = metrics.stack_batches(
        [
            Images(jnp.asarray(images["generated"][b]), jnp.asarray(images["reference"][b]))
            for b in range(sizes.image_batches)
        ]
    )
    psnr = metrics.MetricSet([metrics.psnr(data_range=1.0)])
    ssim = metrics.MetricSet([metrics.ssim(data_range=1.0)])
    groups = {
        "perplexity (logits)": {
            "scored in the scan": lambda: scored_in_scan(logits, targets, weights),
            "vmap + reduce_stacked": lambda: vmap_then_reduce_stacked(logits, targets, weights),
        },
        "perplexity (losses)": {
            "reduce_stacked": lambda: perplexity.reduce_stacked(stacked_scores),
        },
        "psnr": {"reduce_stacked": lambda: psnr.reduce_stacked(stacked_images)},
        "ssim": {"reduce_stacked": lambda: ssim.reduce_stacked(stacked_images)},
    }
    floors = floor_kernels(logits, targets, weights, losses, images)
    return groups, np.array(losses.losses), floors


def floor_kernels(logits, targets, weights, losses, images):
    """The least work each group's value needs, as one bare `jax.jit` kernel over the
    whole pass (no metric layer, no artifacts, no compensated sums, no scan): the time
    any implementation on this CPU needs at least, so `torchmetrics / floor` bounds the
    ratio any implementation could reach. Not dew's code."""
    import jax
    import jax.numpy as jnp

    generated, reference = jnp.asarray(images["generated"]), jnp.asarray(images["reference"])

    @jax.jit
    def perplexity_from_logits(logits, targets, weights):
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return {"perplexity": jnp.exp(jnp.sum(weights * (lse - picked)) / jnp.sum(weights))}

    @jax.jit
    def perplexity_from_losses(losses, weights):
        return {"perplexity": jnp.exp(jnp.sum(weights * losses) / jnp.sum(weights))}

    @jax.jit
    def psnr(generated, reference):
        mse = jnp.mean(jnp.square(generated - reference), axis=(-3, -2, -1))
        return {"psnr": jnp.mean(10.0 * jnp.log10(1.0 / mse))}

    return {
        "perplexity (logits)": lambda: perplexity_from_logits(logits, targets, weights),
        "perplexity (losses)": lambda: perplexity_from_losses(losses.losses, losses.weights),
        "psnr": lambda: psnr(generated, reference),
    }


# --------------------------------------------------------------------------------------------
# torchmetrics


def torch_groups(lm: dict[str, np.ndarray], images: dict[str, np.ndarray], losses: np.ndarray):
    """The torchmetrics side of every group: reset, update per batch, compute."""
    import torch
    from torchmetrics import MeanMetric
    from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure
    from torchmetrics.text import Perplexity

    logits = torch.from_numpy(lm["logits"])
    targets = torch.from_numpy(np.where(lm["weights"] > 0, lm["targets"], IGNORE_INDEX))
    token_losses = torch.from_numpy(losses)
    token_weights = torch.from_numpy(lm["weights"])
    generated = torch.from_numpy(np.ascontiguousarray(images["generated"].transpose(0, 1, 4, 2, 3)))
    reference = torch.from_numpy(np.ascontiguousarray(images["reference"].transpose(0, 1, 4, 2, 3)))

    def pass_of(metric, name: str, inputs, finish=lambda value: value):
        def run() -> dict[str, float]:
            with torch.inference_mode():
                metric.reset()
                for batch in zip(*inputs, strict=True):
                    metric.update(*batch)
                return {name: finish(metric.compute())}

        return run

    return {
        "perplexity (logits)": pass_of(
            Perplexity(ignore_index=IGNORE_INDEX), "perplexity", (logits, targets)
        ),
        "perplexity (losses)": pass_of(
            MeanMetric(), "perplexity", (token_losses, token_weights), torch.exp
        ),
        "psnr": pass_of(
            PeakSignalNoiseRatio(data_range=1.0, reduction="elementwise_mean", dim=(1, 2, 3)),
            "psnr",
            (generated, reference),
        ),
        "ssim": pass_of(
            StructuralSimilarityIndexMeasure(
                data_range=1.0, gaussian_kernel=True, sigma=1.5, kernel_size=11
            ),
            "ssim",
            (generated, reference),
        ),
    }


def ssim_border_check(images: dict[str, np.ndarray], batches: int) -> tuple[float, float, float]:
    """SSIM of the first `batches` batches: dew, torchmetrics, and torchmetrics' map cropped
    to the pixels whose 11x11 window lies inside the image (scikit-image's definition)."""
    import jax.numpy as jnp
    import torch
    from torchmetrics.functional.image import structural_similarity_index_measure

    from dew.metrics._images import per_image_ssim

    generated = images["generated"][:batches].reshape(-1, *images["generated"].shape[2:])
    reference = images["reference"][:batches].reshape(-1, *images["reference"].shape[2:])
    dew_value = float(jnp.mean(per_image_ssim(jnp.asarray(generated), jnp.asarray(reference), 1.0)))
    with torch.inference_mode():
        whole, full_map = structural_similarity_index_measure(
            torch.from_numpy(np.ascontiguousarray(generated.transpose(0, 3, 1, 2))),
            torch.from_numpy(np.ascontiguousarray(reference.transpose(0, 3, 1, 2))),
            data_range=1.0,
            return_full_image=True,
        )
    pad = 5
    cropped = full_map[..., pad:-pad, pad:-pad].reshape(full_map.shape[0], -1).mean(-1)
    return dew_value, float(whole), float(cropped.mean())


# --------------------------------------------------------------------------------------------
# Prototypes (not dew's code): what a change to dew could gain


def prototype_groups(
    lm: dict[str, np.ndarray], images: dict[str, np.ndarray], losses: np.ndarray, sizes: Sizes
):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from dew import metrics
    from dew.artifacts import Images, TokenScores
    from dew.metrics._images import SSIM, SSIM_K1, SSIM_K2, gaussian_window

    def banded(size: int, dtype) -> jax.Array:
        """The 'valid' Gaussian correlation along one axis as a (size - 10, size) matrix."""
        window = gaussian_window()
        matrix = np.zeros((size - window.size + 1, size))
        for row in range(matrix.shape[0]):
            matrix[row, row : row + window.size] = window
        return jnp.asarray(matrix, dtype)

    def banded_ssim(x, y, data_range):
        """per_image_ssim with each 11-tap pass as a matmul, on channels-first images."""
        rows, cols = banded(x.shape[1], x.dtype), banded(x.shape[2], x.dtype)
        x, y = x.transpose(0, 3, 1, 2), y.transpose(0, 3, 1, 2)

        def filt(z):
            return jnp.einsum("nciw,jw->ncij", jnp.einsum("ih,nchw->nciw", rows, z), cols)

        mu_x, mu_y = filt(x), filt(y)
        var_x = filt(x * x) - mu_x * mu_x
        var_y = filt(y * y) - mu_y * mu_y
        cov_xy = filt(x * y) - mu_x * mu_y
        c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
        numerator = (2 * mu_x * mu_y + c1) * (2 * cov_xy + c2)
        denominator = (mu_x * mu_x + mu_y * mu_y + c1) * (var_x + var_y + c2)
        return jnp.mean(numerator / denominator, axis=(1, 2, 3))

    class BandedSSIM(SSIM):
        """dew's SSIM metric with the separable filter done as two banded matmuls."""

        def per_image(self, generated, reference):
            return banded_ssim(generated, reference, self.data_range)

    stacked_images = metrics.stack_batches(
        [
            Images(jnp.asarray(images["generated"][b]), jnp.asarray(images["reference"][b]))
            for b in range(sizes.image_batches)
        ]
    )
    banded_set = metrics.MetricSet([BandedSSIM(data_range=1.0)])
    psnr_set = metrics.MetricSet([metrics.psnr(data_range=1.0)])

    @eqx.filter_jit
    def map_then_fold(metric_set, stacked):
        """reduce_stacked as a map and a fold: every batch's statistics at once (vmap), then
        the monoid merges in a scan over those small statistics alone."""
        statistics = jax.vmap(lambda batch: tuple(m(batch) for m in metric_set.metrics))(stacked)

        def merge(state, contribution):
            pairs = zip(metric_set.metrics, state, contribution, strict=True)
            return tuple(m.merge(a, c) for m, a, c in pairs), None

        state, _ = jax.lax.scan(merge, metric_set.init(), statistics)
        return metric_set.finalize(state)

    logits = jnp.asarray(lm["logits"])
    targets = jnp.asarray(lm["targets"], jnp.int32)
    weights = jnp.asarray(lm["weights"])
    perplexity = metrics.MetricSet([metrics.perplexity()])
    stacked_scores = metrics.stack_batches(
        [TokenScores(jnp.asarray(losses[b]), weights[b]) for b in range(sizes.lm_batches)]
    )

    @jax.jit
    def logsumexp_in_scan(logits, targets, weights):
        def step(state, batch):
            batch_logits, batch_targets, batch_weights = batch
            picked = jnp.take_along_axis(batch_logits, batch_targets[..., None], axis=-1)
            losses = jax.nn.logsumexp(batch_logits, axis=-1) - picked[..., 0]
            return perplexity.update(state, TokenScores(losses, batch_weights)), None

        state, _ = jax.lax.scan(step, perplexity.init(), (logits, targets, weights))
        return perplexity.finalize(state)

    return {
        "perplexity (logits)": {
            "PROTOTYPE logsumexp - gather": lambda: logsumexp_in_scan(logits, targets, weights)
        },
        "perplexity (losses)": {
            "PROTOTYPE vmap stats, fold merges": lambda: map_then_fold(perplexity, stacked_scores)
        },
        "psnr": {
            "PROTOTYPE vmap stats, fold merges": lambda: map_then_fold(psnr_set, stacked_images)
        },
        "ssim": {
            "PROTOTYPE banded-matmul SSIM": lambda: banded_set.reduce_stacked(stacked_images),
            "PROTOTYPE banded + vmap/fold": lambda: map_then_fold(banded_set, stacked_images),
        },
    }


# --------------------------------------------------------------------------------------------
# Report


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def print_table(groups: list[Group]) -> None:
    header = (
        f"{'metric group':<21} {'dew variant':<30} {'dew ms/pass':>12} "
        f"{'torchmetrics ms/pass':>21} {'ratio':>7}  {'target':>7}  met"
    )
    print(header)
    print("-" * len(header))
    for group in groups:
        for label, dew_ms in group.dew_ms.items():
            ratio = group.torch_ms / dew_ms
            met = "yes" if ratio >= TARGET_RATIO else "NO"
            print(
                f"{group.name:<21} {label:<30} {dew_ms:>12.1f} {group.torch_ms:>21.1f} "
                f"{ratio:>6.2f}x  {'>= 3x':>7}  {met}"
            )


def print_floors(groups: list[Group]) -> None:
    header = (
        f"{'metric group':<21} {'floor ms/pass':>14} {'dew / floor':>12} "
        f"{'torchmetrics / floor':>21}"
    )
    print(header)
    print("-" * len(header))
    for group in groups:
        if group.floor is None:
            continue
        best = min(group.dew_ms.values())
        print(
            f"{group.name:<21} {group.floor_ms:>14.1f} {best / group.floor_ms:>11.2f}x "
            f"{group.torch_ms / group.floor_ms:>20.2f}x"
        )


def print_values(groups: list[Group]) -> None:
    header = (
        f"{'metric group':<21} {'dew variant':<30} {'dew value':>14} {'torchmetrics':>14} "
        f"{'abs diff':>10} {'rel diff':>10}"
    )
    print(header)
    print("-" * len(header))
    for group in groups:
        for label, values in group.dew_values.items():
            for name, dew_value in values.items():
                torch_value = group.torch_values[name]
                difference = abs(dew_value - torch_value)
                print(
                    f"{group.name:<21} {label:<30} {dew_value:>14.7g} {torch_value:>14.7g} "
                    f"{difference:>10.2e} {relative(dew_value, torch_value):>10.2e}"
                )


def print_warmups(groups: list[Group]) -> None:
    for group in groups:
        parts = ", ".join(f"{label} {seconds:.2f} s" for label, seconds in group.warmup_s.items())
        print(f"  {group.name}: {parts}")


def versions() -> str:
    names = ["dew-ml", "jax", "jaxlib", "equinox", "numpy", "torch", "torchmetrics"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} ?")
    return ", ".join(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="timed passes per side")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch threads (default: CPU cores)"
    )
    parser.add_argument(
        "--prototypes",
        action="store_true",
        help="also time faster variants that are NOT dew's code (banded SSIM, logsumexp "
        "loss, reduce_stacked as vmap-then-fold)",
    )
    args = parser.parse_args(argv)

    try:
        import torch
        import torchmetrics  # noqa: F401
    except ImportError as error:
        print(
            f"metrics_reduce: skipped, torch/torchmetrics not installed ({error}). "
            "Install the bench extra: pip install torch==2.13.0 torchmetrics"
        )
        return 0

    import jax

    sizes = QUICK if args.quick else FULL
    repeats = args.repeats if args.repeats is not None else sizes.repeats
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(args.torch_threads or cores)

    print("dew MetricSet.reduce_stacked (one compiled lax.scan) vs torchmetrics, one pass each")
    print(f"  {versions()}")
    print(
        f"  CPU cores available {cores}; torch threads {torch.get_num_threads()}; "
        f"jax devices {jax.devices()}; load average {os.getloadavg()[0]:.1f} at start"
    )
    print(
        f"  LM pass: {sizes.lm_batches} batches x {sizes.lm_rows} rows x {sizes.lm_positions} "
        f"positions, vocab {sizes.vocab}, padded rows; image pass: {sizes.image_batches} batches "
        f"x {sizes.image_rows} RGB {sizes.image_side}x{sizes.image_side} pairs; "
        f"median of {repeats} passes per side, sides alternating, warm-up excluded"
    )

    rng = np.random.default_rng(SEED)
    lm = make_lm_pass(sizes, rng)
    images = make_image_pass(sizes, rng)

    dew_side, losses, floors = dew_groups(lm, images, sizes)
    torch_side = torch_groups(lm, images, losses)
    groups = [
        Group(name, dew_side[name], torch_side[name], floor=floors.get(name)) for name in torch_side
    ]
    time_groups(groups, repeats)

    print()
    print_table(groups)
    print()
    print("Floors: one bare jax.jit kernel per group doing the least work the value needs (not")
    print("dew's code; timed in the same alternation). torchmetrics / floor is the highest ratio")
    print("any implementation could reach on this machine and data:")
    print_floors(groups)
    print()
    print("Values (same pass, both sides):")
    print_values(groups)
    dew_ssim, whole, cropped = ssim_border_check(images, sizes.check_batches)
    print(
        f"SSIM border check on the first {sizes.check_batches} batch(es): dew {dew_ssim:.7f}, "
        f"torchmetrics {whole:.7f} (rel diff {relative(dew_ssim, whole):.1e}), torchmetrics map "
        f"cropped to the valid region {cropped:.7f} (rel diff {relative(dew_ssim, cropped):.1e})."
    )
    print(
        "  torchmetrics reflect-pads 5 pixels and averages the SSIM map over the whole image; "
        "dew (like scikit-image) averages only where the 11x11 window lies inside the image."
    )
    print()
    print("Warm-up (first call, excluded; dew's includes compilation):")
    print_warmups(groups)
    load = os.getloadavg()[0]
    print(f"Load average {load:.1f} at the end of the timed passes ({cores} cores).")
    if load > cores:
        print(
            "  WARNING: the machine is oversubscribed; thread pools (torch's OpenMP, XLA's) stall "
            "on busy cores and the times above are inflated, torchmetrics' most (see README)."
        )

    if args.prototypes:
        print()
        print("PROTOTYPES: not dew's code; what a change to src/dew could gain (same data;")
        print("the torchmetrics times are the medians measured above, not re-timed):")
        proto = prototype_groups(lm, images, losses, sizes)
        measured = {group.name: group for group in groups}
        proto_groups = [Group(name, proto[name], torch_side[name]) for name in proto]
        for group in proto_groups:
            group.torch_ms = measured[group.name].torch_ms
            group.torch_values = measured[group.name].torch_values
        time_groups(proto_groups, repeats, time_torch=False)
        print()
        print_table(proto_groups)
        print()
        print_values(proto_groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
