"""Sharding presets: `Trainer(..., mesh=..., strategy="data" | "fsdp" | "fsdp+tensor")`.

The 8-device cases run in one subprocess (`_sharding_presets_worker.py`, 8 simulated CPU
devices): params after a few Adam steps under each preset equal a one-device fit's, the
compiled step's per-device argument bytes under fsdp are about 1/8 of data's, checkpoints
move between presets, and `param_sharding` still works. The rest runs here, on one device.
"""

import itertools
import re

import equinox as eqx
import jax
import numpy as np
import optax
import pytest
from _multiprocess import run_on_devices
from jax.sharding import PartitionSpec

from dew import Trainer
from dew.data import Dataset
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.training._strategies import sharding_strategy

# Adam at a learning rate of 1e-2 for 3 (and 5) steps: the presets sum a step's gradients
# over the devices in another order than one device does, which Adam's normalised update
# carries into the params (measured: at most 1.8e-4 apart; a missing gradient reduction
# is off by about the learning rate).
TOLERANCE = 5e-4


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("presets") / "results.json"
    return run_on_devices("_sharding_presets_worker.py", 8, out, timeout=900)


@pytest.mark.slow
def test_every_preset_trains_the_params_a_single_device_fit_does(eight_devices):
    assert eight_devices["reference_devices"] == 1
    cases = ("data", "fsdp", "fsdp_default_mesh", "fsdp+tensor", "remat_fsdp+tensor")
    for name in (*cases, "param_sharding", "param_sharding_mesh"):
        assert eight_devices[name]["gap"] < TOLERANCE, (name, eight_devices[name]["gap"])
    block = ".stack.blocks[1]"
    data, fsdp, tensor = (eight_devices[name]["specs"] for name in ("data", "fsdp", "fsdp+tensor"))
    assert set(data.values()) == {"P()"}
    assert fsdp[f"{block}.qkv.weight"] == "P('data',)"  # (192, 64): its largest axis
    assert fsdp[f"{block}.down.weight"] == "P(None, 'data')"  # (64, 256)
    assert fsdp == eight_devices["fsdp_default_mesh"]["specs"]
    # Megatron's split over "model", then fsdp over "data" on the largest axis left
    assert tensor[f"{block}.qkv.weight"] == "P('model', 'data')"
    assert tensor[f"{block}.qkv.bias"] == "P('model',)"
    assert tensor[f"{block}.out.weight"] == "P('data', 'model')"
    assert tensor[f"{block}.up.weight"] == "P('model', 'data')"
    assert tensor[f"{block}.down.weight"] == "P('data', 'model')"
    assert tensor[".stack.head.weight"] == "P('data',)"  # no declaration: fsdp alone
    assert eight_devices["remat_fsdp+tensor"]["specs"] == tensor
    # the fit's evaluation runs on the sharded params: the one-device fit's perplexity
    reference = eight_devices["reference_perplexity"]
    assert abs(eight_devices["fsdp+tensor"]["perplexity"] - reference) < 1e-3 * reference
    assert set(eight_devices["param_sharding_mesh"]["specs"].values()) == {"P('model',)"}


@pytest.mark.slow
def test_fsdp_holds_an_eighth_of_the_params_and_optimizer_state_per_device(eight_devices):
    data, fsdp = eight_devices["memory"]["data"], eight_devices["memory"]["fsdp"]
    # The compiled step's per-device argument bytes: params, Adam's moments, the batch's
    # rows and the window (measured 164252 / 1312700 = 0.125).
    ratio = fsdp["argument_bytes"] / data["argument_bytes"]
    assert 0.11 < ratio < 0.14, (ratio, data, fsdp)
    held = fsdp["state_bytes_on_device_0"] / data["state_bytes_on_device_0"]
    assert 0.11 < held < 0.14, (held, data, fsdp)


@pytest.mark.slow
def test_checkpoints_move_between_presets(eight_devices):
    checkpoints = eight_devices["checkpoints"]
    assert checkpoints["saved_step"] == 3
    # saved under fsdp, continued under fsdp+tensor: the params of an unbroken fit
    assert checkpoints["continued_gap"] < TOLERANCE
    # saved under fsdp+tensor, restored under data and fsdp: the same values, laid out anew
    assert checkpoints["restored_steps"] == {"data": 5, "fsdp": 5}
    assert checkpoints["restored_gaps"] == {"data": 0.0, "fsdp": 0.0}
    assert set(checkpoints["restored_specs"]["data"].values()) == {"P()"}
    assert checkpoints["restored_specs"]["fsdp"] == eight_devices["fsdp"]["specs"]


@pytest.mark.slow
def test_a_user_module_declares_its_tensor_sharding(eight_devices):
    assert eight_devices["user_module"] == {"weight": "P(None, 'model')", "scale": "P('data',)"}
    assert eight_devices["indivisible"] == (
        f"param ['odd'].weight of shape (3, 8) is declared {PartitionSpec('model')}, but its "
        "axis 0 (3) "
        "cannot be split over the mesh's 'model' axis (2 devices); choose a 'model' size "
        "that divides it."
    )


@pytest.fixture(scope="module")
def objective():
    model = CausalTransformer(4, 16, 1, 2, 32, 8, key=jax.random.key(0))
    return LMObjective(model, seq_len=7)


def _data():
    text = np.tile(np.arange(8, dtype=np.int32) % 4, (4, 1))
    return Dataset(train=lambda partition: itertools.repeat({"text": text}))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "zero"}, "strategy 'zero' is not one of 'data', 'fsdp', 'fsdp+tensor'."),
        (
            {"strategy": "fsdp+tensor"},
            "strategy 'fsdp+tensor' needs a mesh with axes 'data' and 'model', got mesh=None",
        ),
        (
            {"mesh": ("batch",)},
            "mesh axes ('batch',) do not fit strategy 'data': it takes a mesh with axes "
            "'data' (and 'model'), no others.",
        ),
        (
            {"mesh": ("data",), "strategy": "fsdp+tensor"},
            "mesh axes ('data',) do not fit strategy 'fsdp+tensor': it takes a mesh with axes "
            "'data' and 'model', no others.",
        ),
        (
            {"param_sharding": lambda path, leaf: None, "strategy": "fsdp"},
            "param_sharding lays the params out itself; give it with strategy='data' (the "
            "default), not strategy='fsdp'.",
        ),
    ],
)
def test_a_bad_mesh_or_strategy_is_one_line(objective, kwargs, message):
    if isinstance(kwargs.get("mesh"), tuple):
        names = kwargs["mesh"]
        kwargs = {**kwargs, "mesh": jax.make_mesh((1,) * len(names), names)}
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        Trainer(objective, optax.sgd(0.1), key=jax.random.key(0), **kwargs)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_fsdp_on_one_device_without_a_mesh_is_no_preset(objective):
    trainer = Trainer(objective, optax.sgd(0.1), key=jax.random.key(0), strategy="fsdp")
    assert trainer.strategy is None  # a plain one-device fit: no placement, nothing paid


def test_fsdp_and_tensor_on_a_one_device_mesh_train_as_a_plain_fit(objective):
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    key = jax.random.key(0)
    placed = Trainer(objective, optax.adam(0.01), key=key, mesh=mesh, strategy="fsdp+tensor")
    placed_state = placed.fit(_data(), steps=2, log_every=2, progress=False)
    plain = Trainer(objective, optax.adam(0.01), key=key).fit(
        _data(), steps=2, log_every=2, progress=False
    )
    qkv = placed_state.params.stack.blocks[0].qkv.weight
    assert qkv.sharding.spec == PartitionSpec("model")  # one device a side: no "data"
    pairs = zip(jax.tree.leaves(placed_state.params), jax.tree.leaves(plain.params), strict=True)
    for got, want in pairs:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


class _Declares(eqx.Module):
    weight: jax.Array
    declared: dict = eqx.field(static=True)

    def tensor_sharding(self):
        return self.declared


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (
            {"wieght": PartitionSpec("model")},
            "_Declares.tensor_sharding()['wieght'] names no field of the module; its fields: "
            "weight.",
        ),
        (
            {"weight": PartitionSpec("data")},
            f"_Declares.tensor_sharding()['weight'] is {PartitionSpec('data')!r}; it must be a "
            "PartitionSpec of None and 'model' entries",
        ),
        (
            {"weight": PartitionSpec(None, None, "model")},
            f"param .weight of shape (4, 2) is declared {PartitionSpec(None, None, 'model')}, "
            "which names more axes than the param has (2).",
        ),
        (["weight"], "_Declares.tensor_sharding() returned ['weight']; it must return a mapping"),
    ],
)
def test_a_bad_tensor_sharding_declaration_is_one_line(declared, message):
    preset = sharding_strategy(jax.make_mesh((1, 1), ("data", "model")), "fsdp+tensor")
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        preset.shardings(_Declares(np.zeros((4, 2), np.float32), declared))
    assert str(raised.value).startswith(message)


class _Wraps(eqx.Module):
    inner: _Declares
    bias: jax.Array
    declared: dict = eqx.field(static=True)

    def tensor_sharding(self):
        return self.declared


def test_nested_modules_declare_their_own_leaves_and_never_the_same_one():
    preset = sharding_strategy(jax.make_mesh((1, 1), ("data", "model")), "fsdp+tensor")
    inner = _Declares(np.zeros((4, 2), np.float32), {"weight": PartitionSpec(None, "model")})
    both = _Wraps(inner, np.zeros((4,), np.float32), {"bias": PartitionSpec("model")})
    shardings = preset.shardings(both)
    assert shardings.inner.weight.spec == PartitionSpec(None, "model")
    assert shardings.bias.spec == PartitionSpec("model")
    twice = _Wraps(inner, np.zeros((4,), np.float32), {"inner.weight": PartitionSpec("model")})
    message = (
        "param .inner.weight is given a tensor sharding by both _Wraps and _Declares; declare "
        "it in one module."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        preset.shardings(twice)
