"""dew.nn.clip.CLIP on tiny random configs: loading and its refusals, preprocessing, the
towers' invariants (parity with open_clip's ViT-B-32 is in tests/parity/test_clip_parity.py)."""

import json
import pathlib
import struct
import zipfile

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

from dew.io import load_torch_state_dict
from dew.nn.clip import CLIP, MODELS, CLIPConfig, preprocess
from dew.nn.clip._model import _parameter_shapes

TINY = CLIPConfig(
    embed_dim=8,
    image_size=16,
    patch_size=8,
    vision_width=16,
    vision_layers=1,
    vision_heads=2,
    text_width=16,
    text_layers=1,
    text_heads=2,
)


def random_state_dict(config: CLIPConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """open_clip's key names and shapes for `config`, random values (layer-norm scales near
    one, so no feature is near zero)."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape in _parameter_shapes(config).items():
        values = rng.normal(0.0, 0.3, shape)
        if ".ln" in key or key.startswith("ln_") or key.endswith(("ln_1.weight", "ln_2.weight")):
            values = values + (1.0 if key.endswith("weight") else 0.0)
        state[key] = values.astype(np.float32)
    return state


def write_safetensors(path: pathlib.Path, arrays: dict[str, np.ndarray]) -> pathlib.Path:
    header, offset, blobs = {}, 0, []
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).tobytes()
        dtype = {"float32": "F32", "float16": "F16"}[array.dtype.name]
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))
    return path


@pytest.fixture(scope="module")
def tiny():
    return CLIP(random_state_dict(TINY), TINY)


encode_image = eqx.filter_jit(CLIP.encode_image)
encode_text = eqx.filter_jit(CLIP.encode_text)


def test_the_config_names_are_open_clips_shapes():
    vit = MODELS["ViT-B-32"]
    shapes = _parameter_shapes(vit)
    assert len(shapes) == 302 - 1  # open_clip's 302 keys less logit_scale
    assert shapes["visual.positional_embedding"] == (50, 768)
    assert shapes["token_embedding.weight"] == (49408, 512)
    assert sum(np.prod(s) for s in shapes.values()) + 1 == 151_277_313  # with logit_scale


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="image_size 20 must be a multiple of patch_size 8"):
        CLIPConfig(image_size=20, patch_size=8)
    with pytest.raises(ValueError, match="text_width 10 must be a multiple of text_heads 4"):
        CLIPConfig(text_width=10, text_heads=4)
    with pytest.raises(ValueError, match="vision_layers must be an int >= 1, got 0"):
        CLIPConfig(vision_layers=0)


def test_load_reads_safetensors_and_half_precision(tmp_path):
    state = random_state_dict(TINY)
    state["logit_scale"] = np.float32(4.6).reshape(())  # ignored, as open_clip's files hold it
    half = {key: value.astype(np.float16) for key, value in state.items()}
    model = CLIP.load(write_safetensors(tmp_path / "w.safetensors", half), model=TINY)
    assert model.token_embedding.dtype == jnp.float32
    np.testing.assert_array_equal(
        np.asarray(model.token_embedding), half["token_embedding.weight"].astype(np.float32)
    )
    assert model.config.quick_gelu is False
    quick = CLIP.load(tmp_path / "w.safetensors", model=TINY, quick_gelu=True)
    assert quick.config.quick_gelu and quick.vision_blocks[0].quick_gelu
    images = jnp.asarray(np.random.default_rng(1).random((2, 16, 16, 3), np.float32))
    assert not np.allclose(encode_image(model, images), encode_image(quick, images))


def test_a_state_dict_of_another_model_is_refused(tmp_path):
    state = random_state_dict(TINY)
    with pytest.raises(ValueError, match=r"not open_clip's ViT-B-32: missing \d+ arrays"):
        CLIP.load(write_safetensors(tmp_path / "w.safetensors", state))
    wrong = dict(state, **{"visual.proj": np.zeros((16, 9), np.float32)})
    with pytest.raises(
        ValueError, match=r"'visual.proj' has shape \(16, 9\); CLIP needs \(16, 8\)"
    ):
        CLIP(wrong, TINY)
    extra = dict(state, **{"visual.attnpool.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected 1 \['visual.attnpool.weight'\]"):
        CLIP(extra, TINY)
    with pytest.raises(ValueError, match="Unknown CLIP model 'ViT-X'"):
        CLIP.load(tmp_path / "w.safetensors", model="ViT-X")


def _text(value: str) -> bytes:  # pickle's BINUNICODE
    return b"X" + struct.pack("<I", len(value.encode())) + value.encode()


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _scripted_archive(path: pathlib.Path, data_pkl: bytes) -> pathlib.Path:
    """A TorchScript archive as torch.jit.save lays it out: data.pkl, constants.pkl, data/."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("net/data.pkl", data_pkl)
        archive.writestr("net/constants.pkl", b"\x80\x02).")
        archive.writestr("net/data/0", struct.pack("<2f", 1.5, -2.0))
        archive.writestr("net/code/__torch__/m.py", "raise SystemExit('never run')\n")
    return path


# A scripted module `Outer` holding a flag, a number and a submodule `inner` whose `weight`
# is a float32 tensor of 2 elements in storage 0, pickled opcode by opcode as torch.jit.save
# writes it (module classes under __torch__, built by NEWOBJ and BUILD with an attribute dict).
_TENSOR = (
    _global("torch._utils", "_rebuild_tensor_v2")
    + b"(("
    + _text("storage")
    + _global("torch", "FloatStorage")
    + _text("0")
    + _text("cpu")
    + b"K\x02tQ"  # numel 2, TUPLE, BINPERSID
    + b"K\x00(K\x02t(K\x01t\x89"  # offset 0, size (2,), stride (1,), requires_grad False
    + _global("collections", "OrderedDict")
    + b")Rt"  # backward hooks, TUPLE
    + b"R"  # REDUCE
)
_INNER = _global("__torch__.m", "Inner") + b")\x81}(" + _text("training") + b"\x89"
_INNER += _text("weight") + _TENSOR + b"ub"
_OUTER = _global("__torch__.m", "Outer") + b")\x81}(" + _text("training") + b"\x89"
_OUTER += _text("inner") + _INNER + _text("scale") + b"K\x03ub"
SCRIPTED = b"\x80\x02" + _OUTER + b"."


def test_a_torchscript_archive_gives_its_parameters_and_runs_no_code(tmp_path):
    # The format of OpenAI's CLIP .pt files; parity with torch.jit.save on an open_clip model
    # is in tests/parity/test_clip_parity.py.
    loaded = load_torch_state_dict(_scripted_archive(tmp_path / "net.pt", SCRIPTED))
    assert list(loaded) == ["inner.weight"]
    np.testing.assert_array_equal(loaded["inner.weight"], np.array([1.5, -2.0], np.float32))


def test_a_torchscript_archive_naming_other_globals_is_refused(tmp_path):
    evil = b"\x80\x02" + _global("os", "system") + _text("echo owned") + b"\x85R."
    with pytest.raises(ValueError, match=r"names the global os\.system, which is not allowed"):
        load_torch_state_dict(_scripted_archive(tmp_path / "evil.pt", evil))
    # A module class is inert: calling it with arguments is a malformed file, not a call.
    called = b"\x80\x02" + _global("__torch__.m", "Inner") + b"(" + _text("x") + b"tR."
    with pytest.raises(ValueError, match="its pickle is damaged, truncated or malformed"):
        load_torch_state_dict(_scripted_archive(tmp_path / "called.pt", called))
    not_a_module = b"\x80\x02}."
    with pytest.raises(ValueError, match="does not hold a module"):
        load_torch_state_dict(_scripted_archive(tmp_path / "dict.pt", not_a_module))
    with pytest.raises(FileNotFoundError):
        CLIP.load(tmp_path / "missing.bin")


def test_preprocess_resizes_the_short_side_and_crops_the_centre():
    # A horizontal ramp 20 high, 40 wide: the short side goes to 16 and the long to 32; the
    # crop keeps columns 8..24, whose ramp values sit between a quarter and three quarters.
    ramp = np.broadcast_to(np.linspace(0, 1, 40, dtype=np.float32)[None, :, None], (20, 40, 3))
    out = np.asarray(preprocess(jnp.asarray(ramp)[None], 16))
    assert out.shape == (1, 16, 16, 3)
    mean, std = (
        np.array([0.48145466, 0.4578275, 0.40821073]),
        np.array([0.26862954, 0.26130258, 0.27577711]),
    )
    values = out[0, 0] * std + mean
    assert 0.2 < values[0, 0] < 0.3 and 0.7 < values[-1, 0] < 0.8
    # An image already at the size is only normalised.
    square = np.random.default_rng(0).random((1, 16, 16, 3), np.float32)
    np.testing.assert_allclose(
        np.asarray(preprocess(jnp.asarray(square), 16)), (square - mean) / std, atol=1e-6
    )


def test_a_grey_image_is_its_rgb_repetition(tiny):
    grey = jnp.asarray(np.random.default_rng(2).random((2, 24, 20, 1), np.float32))
    np.testing.assert_allclose(
        encode_image(tiny, grey), encode_image(tiny, jnp.repeat(grey, 3, axis=-1)), atol=1e-6
    )
    with pytest.raises(ValueError, match=r"1 or 3 channels, got shape \(2, 24, 20, 4\)"):
        tiny.encode_image(jnp.zeros((2, 24, 20, 4)))


def test_images_of_any_size_give_one_feature_row_each(tiny):
    for height, width in ((16, 16), (9, 30), (50, 17)):
        images = jnp.asarray(
            np.random.default_rng(height).random((3, height, width, 3), np.float32)
        )
        features = encode_image(tiny, images)
        assert features.shape == (3, 8) and np.isfinite(features).all()


def test_text_features_pool_at_end_of_text_and_ignore_what_follows(tiny):
    # Causal attention and pooling at the largest ID (<end_of_text>): the padding after it
    # cannot change the feature; a token before it does.
    ids = np.zeros((2, 77), np.int32)
    ids[:, :4] = [49406, 320, 2368, 49407]
    ids[1, 10:] = 5
    features = np.asarray(encode_text(tiny, jnp.asarray(ids)))
    np.testing.assert_allclose(features[0], features[1], atol=1e-6)
    ids[1, 2] = 1125
    assert not np.allclose(features[0], np.asarray(encode_text(tiny, jnp.asarray(ids)))[1])


def test_bad_token_rows_are_refused(tiny):
    with pytest.raises(
        ValueError, match=r"token ID 49408 at row 0, position 1; valid IDs are 0 to 49407"
    ):
        tiny.encode_text(jnp.asarray([[49406, 49408, 49407]]))
    with pytest.raises(ValueError, match=r"at most 77 tokens, got shape \(1, 78\)"):
        tiny.encode_text(jnp.zeros((1, 78), jnp.int32))


def test_encoding_compiles_once_per_shape(tiny):
    images = jnp.zeros((2, 16, 16, 3))
    encode = eqx.filter_jit(CLIP.encode_image)
    encode(tiny, images)
    size = encode._cached._cache_size()
    encode(tiny, images + 0.5)
    assert encode._cached._cache_size() == size
