"""The model `benchmarks/first_step.py` trains with `dew train`: an MLP over a flattened
16x16 RGB image, registered as `first_step_mlp` (imported with `--import _first_step_mlp`)."""

import equinox as eqx
import jax

import dew.registry


class FlatMLP(eqx.Module):
    """`eqx.nn.MLP(768, classes, width, depth)` (ReLU) over one flattened image."""

    mlp: eqx.nn.MLP

    def __init__(self, width: int, depth: int, classes: int = 3, *, key: jax.Array) -> None:
        self.mlp = eqx.nn.MLP(16 * 16 * 3, classes, width, depth, key=key)

    def __call__(self, image: jax.Array) -> jax.Array:
        return self.mlp(image.reshape(-1))


dew.registry.models.register("first_step_mlp", FlatMLP, replace=True)
