"""Weights files the tests write: random stand-ins for published networks' weights."""

import json
import struct

import numpy as np

from dew.nn import _inception_layers as layers


def random_inception_weights(path) -> None:
    """pytorch-fid's 470 arrays, random and scaled to keep activations O(1), as a
    .safetensors file (an 8-byte header length, a JSON header, the raw arrays)."""
    rng = np.random.default_rng(0)
    header, blobs, offset = {}, [], 0
    for key, shape in layers._parameter_shapes().items():
        if key.endswith("conv.weight"):
            array = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        elif key.endswith("running_var"):
            array = rng.uniform(0.5, 1.5, shape)
        else:
            array = rng.normal(0.0, 0.1, shape)
        blob = array.astype("<f4").tobytes()
        header[key] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))
