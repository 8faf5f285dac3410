"""The training speed a log step reports, by name, and the accelerators' peak dense FLOP/s it
is measured against (decision 0080); JAX-free, so the console reads the names without JAX.

A log step of `Trainer.fit` reports, besides the window's training metrics, the bare metrics
`examples_per_second` (the batch's rows: sequences, images, pairs), `tokens_per_second` (for
an objective that counts its tokens, `dew.objectives.base.CountsTokens`) and, on a device
whose peak is in `PEAK_FLOPS`, `mfu`: the compiled step's FLOPs per second over the peak of
every device the step runs on. They are training metrics like the loss, so their tags are
`<stage>/train/examples_per_second` and so on (`dew.naming.metric_tag`).

```python
>>> peak_flops("NVIDIA H100 80GB HBM3", "bfloat16")
989000000000000.0
>>> peak_flops("cpu", "float32") is None
True

```
"""

from __future__ import annotations

__all__ = ["EXAMPLES_PER_SECOND", "MFU", "PEAK_FLOPS", "THROUGHPUT", "TOKENS_PER_SECOND"]

EXAMPLES_PER_SECOND = "examples_per_second"
TOKENS_PER_SECOND = "tokens_per_second"
MFU = "mfu"
THROUGHPUT: tuple[str, ...] = (TOKENS_PER_SECOND, EXAMPLES_PER_SECOND, MFU)
"""The throughput metrics' bare names, in the order the end-of-run summary shows them."""

_H100 = {"bfloat16": 989e12, "float32": 494.7e12}
_A100 = {"bfloat16": 312e12, "float32": 156e12}
_TPU_V5P = {"bfloat16": 459e12, "float32": 459e12}
_TPU_V5E = {"bfloat16": 197e12, "float32": 197e12}

# Peak dense FLOP/s of one device (a GPU, a TPU chip) by `jax.devices()[0].device_kind`, for a
# matmul whose operands are bfloat16, or float32 under JAX's default matmul precision.
# Dense: the datasheets' larger "with sparsity" figures are twice these.
# - NVIDIA H100 SXM5 (`NVIDIA H100 80GB HBM3`): BF16 Tensor Core 989 TFLOPS, TF32 494.7
#   (NVIDIA H100 Tensor Core GPU datasheet; 1,979 and 989 with sparsity).
# - NVIDIA H200 SXM (`NVIDIA H200`): the H100 SXM5's compute, BF16 989 TFLOPS, TF32 494.7
#   (NVIDIA H200 Tensor Core GPU datasheet; 1,979 and 989 with sparsity).
# - NVIDIA A100, SXM4 and PCIe, 40 and 80 GB: BF16 312 TFLOPS, TF32 156 (NVIDIA A100 Tensor
#   Core GPU datasheet; 624 and 312 with sparsity).
# - Cloud TPU v4 (`TPU v4`): 275 TFLOPS bf16 per chip (cloud.google.com/tpu/docs/v4).
# - Cloud TPU v5e (`TPU v5 lite`, also reported as `TPU v5e`): 197 TFLOPS bf16 per chip
#   (cloud.google.com/tpu/docs/v5e).
# - Cloud TPU v5p (`TPU v5`, also reported as `TPU v5p`): 459 TFLOPS bf16 per chip
#   (cloud.google.com/tpu/docs/v5p).
# The kinds are the strings JAX's devices report (XLA's TPU runtime reads the same ones).
# float32: on these GPUs XLA's default precision runs a float32 matmul on TF32 tensor cores,
# and on a TPU as one bfloat16 pass of the MXU, so float32's peak is TF32's and bfloat16's
# respectively. Under `jax_default_matmul_precision="highest"` a float32 matmul runs slower
# than that peak, and the `mfu` measured against it reads low.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "NVIDIA H100 80GB HBM3": _H100,
    "NVIDIA H200": _H100,
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12},
    "TPU v5 lite": _TPU_V5E,
    "TPU v5e": _TPU_V5E,
    "TPU v5": _TPU_V5P,
    "TPU v5p": _TPU_V5P,
}


def peak_flops(device_kind: str, dtype: str) -> float | None:
    """One device's peak dense FLOP/s for matmuls in `dtype` (`"bfloat16"`, `"float16"` as
    bfloat16, or `"float32"`); `None` for a device kind not in `PEAK_FLOPS` (a CPU)."""
    peaks = PEAK_FLOPS.get(device_kind)
    if peaks is None:
        return None
    return peaks["bfloat16" if dtype in ("bfloat16", "float16") else "float32"]
