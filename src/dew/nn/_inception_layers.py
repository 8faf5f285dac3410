"""The layers of pytorch-fid's FID InceptionV3 (`dew.nn.inception`): its BasicConv2d with the
batch norm folded in, the pools and resize as pytorch-fid computes them, the Mixed blocks, and
the loader that builds them from pytorch-fid's state dict by name."""

from collections.abc import Mapping
from typing import Any, TypedDict

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float

_BN_EPS = 1e-3  # pytorch-fid's BasicConv2d: BatchNorm2d(eps=0.001)
_SIZE = 299
_IGNORED = (
    ".bn.num_batches_tracked",
    "fc.weight",
    "fc.bias",
)  # the classifier is unused
_PAIR = tuple[int, int]


class _Window(TypedDict):
    """A factorized convolution's kernel and padding, spread into `_Weights.conv`."""

    kernel: _PAIR
    padding: _PAIR


class _Conv(eqx.Module):
    """pytorch-fid's BasicConv2d: a bias-free convolution, inference batch norm, ReLU, with
    the batch norm folded into the convolution's weights and a bias at load."""

    weight: Float[Array, "kernel_height kernel_width inputs outputs"]
    bias: Float[Array, " outputs"]
    stride: int = eqx.field(static=True)
    padding: _PAIR = eqx.field(static=True)

    def __call__(self, x: Float[Array, "rows height width inputs"]) -> Float[Array, "..."]:
        (ph, pw), s = self.padding, self.stride
        kh, kw = self.weight.shape[:2]
        pads = ((ph, ph), (pw, pw))
        if (ph, pw) == (0, 0) and (kh, kw) != (1, 1):
            # XLA's CPU convolution without any padding takes a path two to four times
            # slower; a row and a column of zeros after the image change no valid window,
            # and the windows that reach them are cropped (the result is bitwise the same).
            pads = ((0, 1), (0, 1))
        y = lax.conv_general_dilated(
            x, self.weight, (s, s), pads, dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        rows = (x.shape[1] + 2 * ph - kh) // s + 1
        columns = (x.shape[2] + 2 * pw - kw) // s + 1
        return jax.nn.relu(y[:, :rows, :columns] + self.bias[None, None, None])


class _Weights:
    """Builds each `_Conv` from the state dict by name, collecting every missing key and
    shape mismatch so that one error can name them all."""

    def __init__(self, state: Mapping[str, np.ndarray], dtype):
        self.state, self.dtype = state, dtype
        self.shapes: dict[str, tuple[int, ...]] = {}  # every key read, with its shape
        self.missing: list[str] = []
        self.mismatched: list[str] = []

    def _array(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        self.shapes[key] = shape
        if key not in self.state:
            self.missing.append(key)
            return np.ones(shape)
        value = np.asarray(self.state[key])
        if value.shape != shape:
            self.mismatched.append(f"{key}: {value.shape}, expected {shape}")
            return np.ones(shape)
        return value.astype(np.float64)

    def conv(
        self,
        name: str,
        inputs: int,
        outputs: int,
        kernel: int | _PAIR = 1,
        *,
        stride: int = 1,
        padding: int | _PAIR = 0,
    ) -> _Conv:
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        padding = (padding, padding) if isinstance(padding, int) else padding
        weight = self._array(f"{name}.conv.weight", (outputs, inputs, kh, kw))
        gamma, beta, mean, variance = (
            self._array(f"{name}.bn.{field}", (outputs,))
            for field in ("weight", "bias", "running_mean", "running_var")
        )
        scale = gamma / np.sqrt(variance + _BN_EPS)  # folded in float64, then cast
        return _Conv(
            jnp.asarray(weight.transpose(2, 3, 1, 0) * scale, self.dtype),  # OIHW -> HWIO
            jnp.asarray(beta - mean * scale, self.dtype),
            stride,
            padding,
        )

    def check(self) -> None:
        unexpected = sorted(
            k for k in self.state if k not in self.shapes and not k.endswith(_IGNORED)
        )
        problems = [
            f"{label} ({len(keys)}): {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}"
            for label, keys in (
                ("missing keys", self.missing),
                ("unexpected keys", unexpected),
                ("shape mismatches", self.mismatched),
            )
            if keys
        ]
        if problems:
            raise ValueError(
                "The state dict is not pytorch-fid's FID InceptionV3: " + "; ".join(problems) + "."
            )


def _max_pool(x: Array, stride: int = 2, padding: int = 0) -> Array:
    pad = ((0, 0), (padding, padding), (padding, padding), (0, 0))
    return lax.reduce_window(
        x,
        jnp.array(-jnp.inf, x.dtype),
        lax.max,
        (1, 3, 3, 1),
        (1, stride, stride, 1),
        pad,
    )


def _average_pool(x: Array) -> Array:
    """avg_pool2d(3, stride 1, padding 1, count_include_pad=False): the padding is not
    counted (`eqx.nn.AvgPool2d` would divide by the full window)."""
    pad = ((0, 0), (1, 1), (1, 1), (0, 0))
    total = lax.reduce_window(x, jnp.zeros((), x.dtype), lax.add, (1, 3, 3, 1), (1,) * 4, pad)
    count = [np.convolve(np.ones(n), np.ones(3))[1:-1] for n in x.shape[1:3]]
    return total / jnp.asarray(np.outer(*count)[None, :, :, None], x.dtype)


def _resize(x: Array, size: int = _SIZE) -> Array:
    """F.interpolate(size, mode="bilinear", align_corners=False) without antialiasing, as
    pytorch-fid resizes; `jax.image.resize` antialiases by default when downsampling."""

    def weights(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        source = np.maximum((np.arange(size) + 0.5) * (n / size) - 0.5, 0.0)
        low = np.minimum(np.floor(source).astype(np.int32), n - 1)
        return low, np.minimum(low + 1, n - 1), source - low

    (h0, h1, wh), (w0, w1, ww) = weights(x.shape[1]), weights(x.shape[2])
    wh = jnp.asarray(wh, x.dtype)[None, :, None, None]
    ww = jnp.asarray(ww, x.dtype)[None, None, :, None]
    x = x[:, h0] * (1 - wh) + x[:, h1] * wh
    return x[:, :, w0] * (1 - ww) + x[:, :, w1] * ww


def _concatenate(*branches: Array) -> Array:
    return jnp.concatenate(branches, axis=-1)


class _Pointwise(eqx.Module):
    """Several 1x1 `_Conv`s of one input as one convolution (one wide matrix product), split
    back into their outputs. `pooled`'s output is average pooled before its bias and ReLU:
    a 1x1 convolution and an average pool commute, and the pool then runs over the few
    output channels instead of the many input ones."""

    weight: Float[Array, "inputs outputs"]
    bias: Float[Array, " outputs"]
    widths: tuple[int, ...] = eqx.field(static=True)
    pooled: bool = eqx.field(static=True)

    def __init__(self, convs: tuple[_Conv, ...], pooled: _Conv | None = None):
        layers = (*convs, *(() if pooled is None else (pooled,)))
        self.weight = jnp.concatenate([layer.weight[0, 0] for layer in layers], axis=-1)
        self.bias = jnp.concatenate([layer.bias for layer in layers])
        self.widths = tuple(layer.bias.shape[0] for layer in layers)
        self.pooled = pooled is not None

    def __call__(self, x: Float[Array, "rows height width inputs"]) -> tuple[Array, ...]:
        y = x @ self.weight
        ends = np.cumsum(self.widths)
        parts = [y[..., end - width : end] for end, width in zip(ends, self.widths, strict=True)]
        biases = [
            self.bias[end - width : end] for end, width in zip(ends, self.widths, strict=True)
        ]
        if self.pooled:
            parts[-1] = _average_pool(parts[-1])
        pairs = zip(parts, biases, strict=True)
        return tuple(jax.nn.relu(part + bias[None, None, None]) for part, bias in pairs)


class _InceptionA(eqx.Module):  # FIDInceptionA: its pool excludes the padding
    heads: _Pointwise  # branch1x1, branch5x5_1, branch3x3dbl_1 and the pool's branch_pool
    branch5x5: _Conv
    branch3x3dbl: tuple[_Conv, _Conv]

    def __init__(self, w: _Weights, name: str, inputs: int, pool_features: int):
        self.heads = _Pointwise(
            (
                w.conv(f"{name}.branch1x1", inputs, 64),
                w.conv(f"{name}.branch5x5_1", inputs, 48),
                w.conv(f"{name}.branch3x3dbl_1", inputs, 64),
            ),
            pooled=w.conv(f"{name}.branch_pool", inputs, pool_features),
        )
        self.branch5x5 = w.conv(f"{name}.branch5x5_2", 48, 64, 5, padding=2)
        self.branch3x3dbl = (
            w.conv(f"{name}.branch3x3dbl_2", 64, 96, 3, padding=1),
            w.conv(f"{name}.branch3x3dbl_3", 96, 96, 3, padding=1),
        )

    def __call__(self, x: Array) -> Array:
        branch1x1, branch5x5, branch3x3dbl, branch_pool = self.heads(x)
        return _concatenate(
            branch1x1,
            self.branch5x5(branch5x5),
            _chain(self.branch3x3dbl, branch3x3dbl),
            branch_pool,
        )


class _InceptionB(eqx.Module):  # Mixed_6a, torchvision's InceptionB
    branch3x3: _Conv
    branch3x3dbl: tuple[_Conv, _Conv, _Conv]

    def __init__(self, w: _Weights, name: str, inputs: int):
        self.branch3x3 = w.conv(f"{name}.branch3x3", inputs, 384, 3, stride=2)
        self.branch3x3dbl = (
            w.conv(f"{name}.branch3x3dbl_1", inputs, 64),
            w.conv(f"{name}.branch3x3dbl_2", 64, 96, 3, padding=1),
            w.conv(f"{name}.branch3x3dbl_3", 96, 96, 3, stride=2),
        )

    def __call__(self, x: Array) -> Array:
        return _concatenate(self.branch3x3(x), _chain(self.branch3x3dbl, x), _max_pool(x))


class _InceptionC(eqx.Module):  # FIDInceptionC: factorised 7x7 convolutions
    heads: _Pointwise  # branch1x1, branch7x7_1, branch7x7dbl_1 and the pool's branch_pool
    branch7x7: tuple[_Conv, _Conv]
    branch7x7dbl: tuple[_Conv, _Conv, _Conv, _Conv]

    def __init__(self, w: _Weights, name: str, inputs: int, c7: int):
        row: _Window = {"kernel": (1, 7), "padding": (0, 3)}
        column: _Window = {"kernel": (7, 1), "padding": (3, 0)}
        self.heads = _Pointwise(
            (
                w.conv(f"{name}.branch1x1", inputs, 192),
                w.conv(f"{name}.branch7x7_1", inputs, c7),
                w.conv(f"{name}.branch7x7dbl_1", inputs, c7),
            ),
            pooled=w.conv(f"{name}.branch_pool", inputs, 192),
        )
        self.branch7x7 = (
            w.conv(f"{name}.branch7x7_2", c7, c7, **row),
            w.conv(f"{name}.branch7x7_3", c7, 192, **column),
        )
        self.branch7x7dbl = (
            w.conv(f"{name}.branch7x7dbl_2", c7, c7, **column),
            w.conv(f"{name}.branch7x7dbl_3", c7, c7, **row),
            w.conv(f"{name}.branch7x7dbl_4", c7, c7, **column),
            w.conv(f"{name}.branch7x7dbl_5", c7, 192, **row),
        )

    def __call__(self, x: Array) -> Array:
        branch1x1, branch7x7, branch7x7dbl, branch_pool = self.heads(x)
        return _concatenate(
            branch1x1,
            _chain(self.branch7x7, branch7x7),
            _chain(self.branch7x7dbl, branch7x7dbl),
            branch_pool,
        )


class _InceptionD(eqx.Module):  # Mixed_7a, torchvision's InceptionD
    heads: _Pointwise  # branch3x3_1 and branch7x7x3_1
    branch3x3: _Conv
    branch7x7x3: tuple[_Conv, _Conv, _Conv]

    def __init__(self, w: _Weights, name: str, inputs: int):
        self.heads = _Pointwise(
            (
                w.conv(f"{name}.branch3x3_1", inputs, 192),
                w.conv(f"{name}.branch7x7x3_1", inputs, 192),
            )
        )
        self.branch3x3 = w.conv(f"{name}.branch3x3_2", 192, 320, 3, stride=2)
        self.branch7x7x3 = (
            w.conv(f"{name}.branch7x7x3_2", 192, 192, (1, 7), padding=(0, 3)),
            w.conv(f"{name}.branch7x7x3_3", 192, 192, (7, 1), padding=(3, 0)),
            w.conv(f"{name}.branch7x7x3_4", 192, 192, 3, stride=2),
        )

    def __call__(self, x: Array) -> Array:
        branch3x3, branch7x7x3 = self.heads(x)
        return _concatenate(
            self.branch3x3(branch3x3),
            _chain(self.branch7x7x3, branch7x7x3),
            _max_pool(x),
        )


class _InceptionE(eqx.Module):
    """FIDInceptionE_1 (Mixed_7b: average pool excluding the padding) and FIDInceptionE_2
    (Mixed_7c: pytorch-fid's port of the TF graph's max pool)."""

    heads: _Pointwise  # branch1x1, branch3x3_1, branch3x3dbl_1 (and 7b's branch_pool)
    branch3x3: tuple[_Conv, _Conv]
    branch3x3dbl: tuple[_Conv, _Conv, _Conv]
    branch_pool: _Conv | None  # Mixed_7c's, after its max pool
    pool: str = eqx.field(static=True)

    def __init__(self, w: _Weights, name: str, inputs: int, pool: str):
        row: _Window = {"kernel": (1, 3), "padding": (0, 1)}
        column: _Window = {"kernel": (3, 1), "padding": (1, 0)}
        heads = (
            w.conv(f"{name}.branch1x1", inputs, 320),
            w.conv(f"{name}.branch3x3_1", inputs, 384),
            w.conv(f"{name}.branch3x3dbl_1", inputs, 448),
        )
        self.branch3x3 = (
            w.conv(f"{name}.branch3x3_2a", 384, 384, **row),
            w.conv(f"{name}.branch3x3_2b", 384, 384, **column),
        )
        self.branch3x3dbl = (
            w.conv(f"{name}.branch3x3dbl_2", 448, 384, 3, padding=1),
            w.conv(f"{name}.branch3x3dbl_3a", 384, 384, **row),
            w.conv(f"{name}.branch3x3dbl_3b", 384, 384, **column),
        )
        branch_pool = w.conv(f"{name}.branch_pool", inputs, 192)
        if pool == "average":  # the pool commutes with the 1x1 convolution
            self.heads, self.branch_pool = _Pointwise(heads, pooled=branch_pool), None
        else:
            self.heads, self.branch_pool = _Pointwise(heads), branch_pool
        self.pool = pool

    def __call__(self, x: Array) -> Array:
        branch1x1, b3, d, *pooled = self.heads(x)
        wide, tall = self.branch3x3
        d2, dwide, dtall = self.branch3x3dbl
        d = d2(d)
        if self.branch_pool is not None:
            pooled = [self.branch_pool(_max_pool(x, 1, 1))]
        return _concatenate(branch1x1, wide(b3), tall(b3), dwide(d), dtall(d), *pooled)


def _chain(layers: tuple[Any, ...], x: Array) -> Array:
    """`x` through each of `layers` (callable modules) in turn."""
    for layer in layers:
        x = layer(x)
    return x


def _network(w: "_Weights") -> tuple[tuple[_Conv, ...], tuple[eqx.Module, ...]]:
    """The stem's convolutions and the eleven Mixed blocks, in pytorch-fid's order."""
    stem = (
        w.conv("Conv2d_1a_3x3", 3, 32, 3, stride=2),
        w.conv("Conv2d_2a_3x3", 32, 32, 3),
        w.conv("Conv2d_2b_3x3", 32, 64, 3, padding=1),
        w.conv("Conv2d_3b_1x1", 64, 80),
        w.conv("Conv2d_4a_3x3", 80, 192, 3),
    )
    blocks = (
        _InceptionA(w, "Mixed_5b", 192, pool_features=32),
        _InceptionA(w, "Mixed_5c", 256, pool_features=64),
        _InceptionA(w, "Mixed_5d", 288, pool_features=64),
        _InceptionB(w, "Mixed_6a", 288),
        _InceptionC(w, "Mixed_6b", 768, c7=128),
        _InceptionC(w, "Mixed_6c", 768, c7=160),
        _InceptionC(w, "Mixed_6d", 768, c7=160),
        _InceptionC(w, "Mixed_6e", 768, c7=192),
        _InceptionD(w, "Mixed_7a", 768),
        _InceptionE(w, "Mixed_7b", 1280, pool="average"),
        _InceptionE(w, "Mixed_7c", 2048, pool="max"),
    )
    return stem, blocks


def _parameter_shapes() -> dict[str, tuple[int, ...]]:
    """Every key the network reads from pytorch-fid's state dict, with its shape."""
    weights = _Weights({}, jnp.float32)
    _network(weights)
    return weights.shapes
