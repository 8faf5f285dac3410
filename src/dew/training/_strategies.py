"""Sharding presets: `Trainer(..., mesh=..., strategy=...)` lays a fit's params and optimizer
state out over a device mesh by rule instead of by a user's `param_sharding` callable.

- `"data"`: every param replicated, each step's batch split by rows along the mesh's `"data"`
  axis (data parallelism).
- `"fsdp"`: as `"data"`, and every param (with its EMA copy and the optimizer state's
  params-shaped parts) split along its largest axis that the `"data"` axis's size divides;
  a param with no such axis (a scalar, an odd length) stays replicated.
- `"fsdp+tensor"`: as `"fsdp"` on a mesh that also has a `"model"` axis, over which each param
  is first split as the module holding it declares (`tensor_sharding`, below): the built-in
  backbones split their attention projections by heads and their MLP by its hidden axis; fsdp
  then takes the largest remaining axis.

A module declares its tensor shardings with a method `tensor_sharding(self) -> Mapping[str,
PartitionSpec]`: keys are the paths of its array fields below it, as
`jax.tree_util.keystr` writes them without the leading dot (`"qkv.weight"`,
`"layers[0].bias"`), values `PartitionSpec`s whose entries are `None` or `"model"`. Every
module in the tree that has the method is asked (a block and the attention inside it each
declare their own parts); a leaf no module names is not split over `"model"`. The same rules
place the objective's own arrays (a model's initial weights, a frozen reference model), so
under fsdp no device keeps a whole copy of them either.

The shardings are chosen once per fit; the compiled step keeps them (no host work per step).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dew._processes import data_mesh

__all__ = ["STRATEGIES", "Strategy", "sharding_strategy"]

STRATEGIES = ("data", "fsdp", "fsdp+tensor")
_AXES = ("data", "model")


def _declares(node: Any) -> bool:
    return callable(getattr(type(node), "tensor_sharding", None))


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _joined(prefix: str, name: str) -> str:
    return prefix + (name if name.startswith("[") else f".{name}")


def _declared(tree: Any, prefix: str = "") -> dict[str, tuple[PartitionSpec, str]]:
    """Every tensor sharding declared in `tree`: the absolute path (`keystr`) of each named
    leaf, with its spec and the declaring module's name (for the errors)."""
    found: dict[str, tuple[PartitionSpec, str]] = {}
    if _declares(tree):
        owner = type(tree).__name__
        declared = tree.tensor_sharding()
        if not isinstance(declared, Mapping):
            raise ValueError(
                f"{owner}.tensor_sharding() returned {declared!r}; it must return a mapping "
                "of field paths to PartitionSpec (e.g. {'weight': PartitionSpec('model', None)})."
            )
        paths, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)
        fields = {jax.tree_util.keystr(path) for path, _ in paths}  # a None field's too
        at = f" (the module at {prefix})" if prefix else ""
        for name, spec in declared.items():
            where = f"{owner}.tensor_sharding()[{name!r}]{at}"
            if not isinstance(name, str) or _joined("", name) not in fields:
                shown = ", ".join(sorted(field.lstrip(".") for field in fields))
                raise ValueError(f"{where} names no field of the module; its fields: {shown}.")
            if not isinstance(spec, PartitionSpec) or any(
                entry not in (None, "model") for entry in spec
            ):
                raise ValueError(
                    f"{where} is {spec!r}; it must be a PartitionSpec of None and 'model' "
                    "entries (the data axis is fsdp's to add)."
                )
            found[_joined(prefix, name)] = (spec, owner)
    children, _ = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda node: node is not tree and _declares(node)
    )
    for path, child in children:
        if _declares(child):
            for name, entry in _declared(child, prefix + jax.tree_util.keystr(path)).items():
                if name in found:
                    raise ValueError(
                        f"param {name} is given a tensor sharding by both {found[name][1]} and "
                        f"{entry[1]}; declare it in one module."
                    )
                found[name] = entry
    return found


class Strategy:
    """A checked preset (`sharding_strategy`): its name and mesh, and the shardings it gives
    a tree of arrays (`shardings`)."""

    def __init__(self, name: str, mesh: Mesh) -> None:
        self.name, self.mesh = name, mesh
        self.data = int(mesh.shape["data"])
        self.model = int(mesh.shape["model"]) if "model" in mesh.axis_names else 1

    def __repr__(self) -> str:
        return f"Strategy({self.name!r}, {dict(self.mesh.shape)})"

    def spec(self, path: str, leaf: Any, declared: PartitionSpec | None) -> PartitionSpec:
        """The partition of one array leaf at `path` (its declared tensor spec or `None`)."""
        shape = tuple(np.shape(leaf))
        if self.name == "data" or _is_key(leaf) or not shape:
            return PartitionSpec()
        entries: list[Any] = [None] * len(shape)
        if declared is not None and self.name == "fsdp+tensor":
            if len(declared) > len(shape):
                raise ValueError(
                    f"param {path} of shape {shape} is declared {declared}, which names more "
                    f"axes than the param has ({len(shape)})."
                )
            for axis, entry in enumerate(declared):
                if entry is not None and shape[axis] % self.model:
                    raise ValueError(
                        f"param {path} of shape {shape} is declared {declared}, but its axis "
                        f"{axis} ({shape[axis]}) cannot be split over the mesh's 'model' axis "
                        f"({self.model} devices); choose a 'model' size that divides it."
                    )
                entries[axis] = entry
        if self.data > 1:
            free = [
                axis
                for axis, size in enumerate(shape)
                if entries[axis] is None and size % self.data == 0
            ]
            if free:  # the largest, the first of equals; none: replicated over "data"
                entries[max(free, key=lambda axis: (shape[axis], -axis))] = "data"
        while entries and entries[-1] is None:
            entries.pop()
        return PartitionSpec(*entries)

    def shardings(self, tree: Any) -> Any:
        """A `NamedSharding` on the mesh for every array leaf of `tree` (params, or an
        objective's arrays: an Equinox module whose submodules may declare
        `tensor_sharding`)."""
        declared = _declared(tree) if self.name == "fsdp+tensor" else {}

        def choose(path: Any, leaf: Any) -> Any:
            name = jax.tree_util.keystr(path)
            spec = self.spec(name, leaf, declared.get(name, (None, ""))[0])
            return NamedSharding(self.mesh, spec)

        return jax.tree_util.tree_map_with_path(choose, tree)


def sharding_strategy(mesh: Any, strategy: Any, param_sharding: Any = None) -> Strategy | None:
    """The `Trainer`'s checked `mesh` and `strategy`: `None` where they change nothing (no mesh
    and `"data"`, or no mesh, one device and `"fsdp"`), else a `Strategy`. One `ValueError`
    (a `TypeError` for a mesh that is no `jax.sharding.Mesh`) naming a bad value."""
    if strategy not in STRATEGIES:
        allowed = ", ".join(repr(name) for name in STRATEGIES)
        raise ValueError(f"strategy {strategy!r} is not one of {allowed}.")
    if param_sharding is not None and strategy != "data":
        raise ValueError(
            f"param_sharding lays the params out itself; give it with strategy='data' (the "
            f"default), not strategy={strategy!r}."
        )
    if mesh is None:
        if strategy == "fsdp+tensor":
            raise ValueError(
                "strategy 'fsdp+tensor' needs a mesh with axes 'data' and 'model', got mesh=None "
                "(e.g. mesh=jax.make_mesh((4, 2), ('data', 'model')))."
            )
        if strategy == "data" or jax.device_count() == 1:
            return None
        return Strategy(strategy, data_mesh())
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be None or a jax.sharding.Mesh, got {type(mesh).__name__}.")
    names = tuple(mesh.axis_names)
    needed = _AXES if strategy == "fsdp+tensor" else ("data",)
    if any(name not in names for name in needed) or any(name not in _AXES for name in names):
        wanted = "'data' and 'model'" if strategy == "fsdp+tensor" else "'data' (and 'model')"
        raise ValueError(
            f"mesh axes {names} do not fit strategy {strategy!r}: it takes a mesh with axes "
            f"{wanted}, no others."
        )
    if list(mesh.devices.flat) != jax.devices():
        raise ValueError(
            f"mesh devices {[device.id for device in mesh.devices.flat]} are not every device "
            f"in jax.devices() order ({[device.id for device in jax.devices()]}); build it with "
            "jax.make_mesh or jax.sharding.Mesh(np.array(jax.devices()).reshape(...), names)."
        )
    # Its axes as GSPMD's automatic ones (jax.make_mesh's default is explicit sharding, which
    # the objectives' code is not written for): the step's shardings propagate through it.
    auto = (jax.sharding.AxisType.Auto,) * len(names)
    return Strategy(strategy, Mesh(mesh.devices, names, axis_types=auto))
