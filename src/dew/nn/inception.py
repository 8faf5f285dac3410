"""pytorch-fid's FID InceptionV3 (pool3 features, 2048 wide) as an Equinox module in NHWC,
loading pytorch-fid's state dict without torch."""

import os
import pathlib
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from dew.io import check_sha256, load_torch_state_dict, sha256_of
from dew.nn._inception_layers import (
    _chain,
    _Conv,
    _max_pool,
    _network,
    _resize,
    _Weights,
)

__all__ = [
    "FEATURES",
    "FIDInceptionV3",
    "default_weights_path",
]

_FID_WEIGHTS_FILENAME = "pt_inception-2015-12-05-6726825d.pth"
_FID_WEIGHTS_SHA256_PREFIX = "6726825d"
_FID_WEIGHTS_URL = (
    "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/" + _FID_WEIGHTS_FILENAME
)
_WEIGHTS_ENVIRONMENT_VARIABLE = "DEW_FID_WEIGHTS"
FEATURES = "pytorch-fid 0.3.0 FID InceptionV3, pool3 (2048 features)"
"""What `FIDInceptionV3.features` reads, as a `SamplingProtocol` record names it."""

_DTYPES = {"float32": jnp.float32, "float64": jnp.float64}


def _candidate(
    weights: str | os.PathLike[str] | None,
) -> tuple[pathlib.Path, str | None]:
    """The weights file `default_weights_path` reads, and what chose it (None: the cache)."""
    if weights is not None:
        path, source = pathlib.Path(weights), "the weights path given"
    elif os.environ.get(_WEIGHTS_ENVIRONMENT_VARIABLE):
        path = pathlib.Path(os.environ[_WEIGHTS_ENVIRONMENT_VARIABLE])
        source = f"${_WEIGHTS_ENVIRONMENT_VARIABLE}"
    else:
        path, source = (
            pathlib.Path.home() / ".cache" / "dew" / _FID_WEIGHTS_FILENAME,
            None,
        )
    return path.expanduser(), source


def default_weights_path(weights: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Where the FID weights are read from: `weights` when given, else the file named by
    `$DEW_FID_WEIGHTS`, else `~/.cache/dew/pt_inception-2015-12-05-6726825d.pth`.

    Nothing is downloaded. **Raises:** `FileNotFoundError` when the chosen file does not
    exist, saying where to put pytorch-fid's published weights and where to get them.
    """
    path, source = _candidate(weights)
    if path.is_file():
        return path
    where = f" ({source})" if source else ""
    raise FileNotFoundError(
        f"No FID InceptionV3 weights at {str(path)!r}{where}. dew downloads nothing: save "
        f"pytorch-fid's published weights, {_FID_WEIGHTS_URL} , as "
        f"~/.cache/dew/{_FID_WEIGHTS_FILENAME}, or point ${_WEIGHTS_ENVIRONMENT_VARIABLE} "
        "or weights= at the file."
    )


def missing_weights(weights: str | os.PathLike[str] | None = None) -> str | None:
    """None when `default_weights_path(weights)` finds a file; else why not, on one line
    for a notice: `no weights at <path> (<where to get them>)`. Reads nothing but the
    file's existence (no loading, no checksum)."""
    path, source = _candidate(weights)
    if path.is_file():
        return None
    if source is not None:
        return (
            f"no weights at {path}, named by {source} (save pytorch-fid's {_FID_WEIGHTS_URL} there)"
        )
    return (
        f"no weights at {path} (save pytorch-fid's {_FID_WEIGHTS_URL} there, or point "
        f"${_WEIGHTS_ENVIRONMENT_VARIABLE} at a copy)"
    )


@eqx.filter_jit
def _pool3(model: "FIDInceptionV3", images: Array) -> Array:
    x = 2 * _resize(images.astype(_DTYPES[model.dtype])) - 1
    x = _max_pool(_chain(model.stem[:3], x))
    x = _max_pool(_chain(model.stem[3:], x))
    x = _chain(model.blocks, x)
    return jnp.mean(x, axis=(1, 2))


class FIDInceptionV3(eqx.Module):
    """pytorch-fid 0.3.0's FID InceptionV3, up to its pool3 features (`dims=2048`).

    Built from pytorch-fid's state dict (the key names of its published
    `pt_inception-2015-12-05-6726825d.pth`): `FIDInceptionV3(state_dict, dtype=...)` from
    arrays in memory, `FIDInceptionV3.load(path)` from a file read by
    `dew.io.load_torch_state_dict` (no torch). `fc.*` and `num_batches_tracked` are ignored;
    any other missing or unexpected key or wrong shape is a `ValueError` naming them.

    `features(images)` maps `(rows, height, width, 3)` float RGB images in `[0, 1]`, of any
    size, to `(rows, 2048)` features as pytorch-fid does: bilinear resize to 299x299 without
    antialiasing (`F.interpolate(align_corners=False)`), scale to `[-1, 1]`, the network
    (batch norm eps 1e-3, average pools that exclude the padding, Mixed_7c's max pool), and
    the global mean. It is compiled once per input shape and can be called inside `jax.jit`.

    **Arguments:**

    - `state_dict`: pytorch-fid's parameter names to arrays.
    - `dtype`: `"float32"` (default) or `"float64"`, the dtype of the weights, of the
      computation and of the features. `"float64"` needs 64-bit JAX
      (`jax.config.update("jax_enable_x64", True)`, or `JAX_ENABLE_X64=1`) set first.
      On random weights, float64 matches pytorch-fid's float64 to ~5e-13, and float32 is
      within ~1e-4 of it, while pytorch-fid's own float32 can be 3e-3 off (decision 0018).
    - `weights_sha256`: the SHA-256 of the file the weights came from (`load` sets it),
      or `None`; a `SamplingProtocol` record reports it.
    """

    stem: tuple[_Conv, ...]
    blocks: tuple[eqx.Module, ...]
    dtype: str = eqx.field(static=True)
    weights_sha256: str | None = eqx.field(static=True)

    def __init__(
        self,
        state_dict: Mapping[str, np.ndarray],
        *,
        dtype: str = "float32",
        weights_sha256: str | None = None,
    ):
        _check_dtype(dtype)
        w = _Weights(state_dict, _DTYPES[dtype])
        self.stem, self.blocks = _network(w)
        w.check()
        self.dtype = dtype
        self.weights_sha256 = weights_sha256

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, *, dtype: str = "float32"
    ) -> "FIDInceptionV3":
        """The network with the weights at `path` (a `.pth` in either torch format, or a
        `.safetensors`); without `path`, pytorch-fid's published weights from
        `default_weights_path()`, checked by their SHA-256 prefix `6726825d`. The file's
        SHA-256, computed once here, is kept as `weights_sha256`."""
        _check_dtype(dtype)
        resolved = default_weights_path(path)
        digest = sha256_of(resolved)
        if path is None and not digest.startswith(_FID_WEIGHTS_SHA256_PREFIX):
            check_sha256(resolved, _FID_WEIGHTS_SHA256_PREFIX)  # raises, naming the file
        return cls(load_torch_state_dict(resolved), dtype=dtype, weights_sha256=digest)

    @property
    def preprocessing(self) -> str:
        """What `features` does to images before the network, in words."""
        return (
            "bilinear resize to 299x299 without antialiasing (align_corners=False), "
            f"[0, 1] scaled to [-1, 1], computed in {self.dtype}"
        )

    def features(self, images: Float[Array, "rows height width 3"]) -> Float[Array, "rows 2048"]:
        """pytorch-fid's pool3 features of `images` (float RGB in `[0, 1]`, any size)."""
        if images.ndim != 4 or images.shape[-1] != 3 or 0 in images.shape[1:3]:
            raise ValueError(
                "FIDInceptionV3.features expects images of shape (rows, height, width, 3), "
                f"got {images.shape}."
            )
        if not jnp.issubdtype(images.dtype, jnp.floating):
            raise ValueError(
                f"FIDInceptionV3.features expects float images in [0, 1], got {images.dtype} "
                "(divide 8-bit images by 255)."
            )
        _check_dtype(self.dtype)
        if images.shape[0] == 0:
            return jnp.zeros((0, 2048), _DTYPES[self.dtype])
        return _pool3(self, images)


def _check_dtype(dtype: str) -> None:
    if dtype not in _DTYPES:
        raise ValueError(f"FIDInceptionV3's dtype {dtype!r} is not one of 'float32', 'float64'.")
    if dtype == "float64" and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            "FIDInceptionV3 with dtype 'float64' needs 64-bit JAX: call "
            "jax.config.update('jax_enable_x64', True) (or set JAX_ENABLE_X64=1) first."
        )
