"""dew.nn.clip against open_clip 3.3.0 itself: the tokenizer's IDs on tricky strings, the
preprocessing on float tensors, and ViT-B-32 with random weights (both GELU variants), saved
by torch as `.safetensors` and as an `open_clip_pytorch_model.bin` zip, read by dew without
torch: image and text features to 1e-5 absolute in float32 (measured 3-5e-6, |feature| ~3);
and a small open_clip model saved by torch.jit.save in half precision, as OpenAI's .pt files."""

import contextlib
import dataclasses
import functools
import logging
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew import metrics
from dew.artifacts import Images
from dew.io import load_torch_state_dict
from dew.metrics._clip import _encode_image as encode_image  # shares the metric's compilation
from dew.metrics._clip import _encode_text as encode_text
from dew.nn.clip import CLIP, MODELS, CLIPTokenizer, preprocess, tokenize

torch = pytest.importorskip("torch")
if "torchvision" not in sys.modules:  # PyPI's torchvision beside the CPU build of torch
    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
open_clip = pytest.importorskip("open_clip")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.parity

TRICKY = [
    "a photo of a cat",
    "Café crème brûlée, naïve résumé, Ünïcödé ÀÉÎ ß",
    "1234567890, 3.14159 and 1,000,000",
    "🐱🐶 emoji 🚀✨ and a family 👨‍👩‍👧",
    "Tom &amp; Jerry &lt;3 &amp;amp; &quot;quoted&quot; &#39;s",
    "mojibake: cafÃ© and â€œquotesâ€\x9d",
    "don't you're we'll I'd THEY'VE",
    "日本語のテキスト 中文 한국어 ٣ ½ ² Ⅻ ﬁ",
    "  spaced\t\tout\n\nlines  ",
    "<start_of_text> inside <END_OF_TEXT>",
    "",
    "x " * 100,
    "supercalifragilisticexpialidocious " * 20,
]


def test_tokens_are_open_clips():
    expected = open_clip.get_tokenizer("ViT-B-32")(TRICKY).numpy()
    np.testing.assert_array_equal(CLIPTokenizer()(TRICKY), expected)


@pytest.mark.parametrize("name", ["ViT-B-32", "ViT-B-16", "ViT-L-14"])
def test_the_model_configs_are_open_clips(name):
    config, expected = MODELS[name], open_clip.get_model_config(name)
    vision, text = expected["vision_cfg"], expected["text_cfg"]
    assert (config.embed_dim, config.image_size, config.patch_size) == (
        expected["embed_dim"],
        vision["image_size"],
        vision["patch_size"],
    )
    assert (config.vision_width, config.vision_layers) == (vision["width"], vision["layers"])
    assert config.vision_heads == vision["width"] // vision.get("head_width", 64)
    assert (config.text_width, config.text_heads, config.text_layers) == (
        text["width"],
        text["heads"],
        text["layers"],
    )
    assert (config.context_length, config.vocab_size) == (77, 49408)
    assert open_clip.get_model_config(f"{name}-quickgelu")["quick_gelu"] is True


@contextlib.contextmanager
def _quiet():
    """open_clip's warnings while it builds a model silenced, and logging as it was after: a
    `logging.disable` left on silences the whole xdist worker, jax's compile log included."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


@pytest.mark.parametrize("size", [(300, 260), (224, 224), (100, 150), (225, 601)])
def test_preprocessing_is_open_clips_on_tensors(size):
    with _quiet():
        _, _, transform = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
    expected = torch.stack([transform(image) for image in images]).numpy().transpose(0, 2, 3, 1)
    actual = np.asarray(preprocess(jnp.asarray(images.numpy().transpose(0, 2, 3, 1))))
    np.testing.assert_allclose(actual, expected, atol=1e-4)  # normalised: 1e-5 / std


@pytest.fixture(
    scope="module", params=[(False, ".bin"), (True, ".safetensors")], ids=["gelu", "quickgelu"]
)
def reference(request, tmp_path_factory):
    """open_clip's seeded random ViT-B-32 (exact GELU, saved as open_clip_pytorch_model.bin,
    a torch zip) or ViT-B-32-quickgelu (saved as .safetensors), its features of two images
    and of the tricky texts, and dew's model loaded from the file by `CLIP.load`; the arrays
    dew reads are checked to be torch's, bit for bit."""
    quick_gelu, suffix = request.param
    torch.set_num_threads(2)
    torch.manual_seed(0)
    name = "ViT-B-32-quickgelu" if quick_gelu else "ViT-B-32"
    with _quiet():
        model, _, transform = open_clip.create_model_and_transforms(name, pretrained=None)
    model.eval()
    state = model.state_dict()
    folder = tmp_path_factory.mktemp(name)
    if suffix == ".bin":
        path = folder / "open_clip_pytorch_model.bin"
        torch.save(state, path)
    else:
        path = folder / "open_clip_model.safetensors"
        safetensors_torch.save_file({k: v.contiguous() for k, v in state.items()}, path)
    loaded = load_torch_state_dict(path)  # what CLIP.load reads (tested in test_clip_model.py)
    path.unlink()
    assert sorted(loaded) == sorted(state)  # safetensors sorts its keys
    for key, value in state.items():
        np.testing.assert_array_equal(loaded[key], value.numpy())
    images = torch.rand(2, 3, 300, 260, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        image_features = model.encode_image(torch.stack([transform(x) for x in images])).numpy()
        text_features = model.encode_text(open_clip.get_tokenizer(name)(TRICKY)).numpy()
    config = dataclasses.replace(MODELS["ViT-B-32"], quick_gelu=quick_gelu)
    return CLIP(loaded, config), images, image_features, text_features


def test_image_features_are_open_clips(reference):
    model, images, expected, _ = reference
    actual = encode_image(model, jnp.asarray(images.numpy().transpose(0, 2, 3, 1)))
    assert np.abs(expected).max() > 1.0  # not near zero
    np.testing.assert_allclose(np.asarray(actual), expected, atol=1e-5, rtol=0)


def test_text_features_are_open_clips(reference):
    model, _, _, expected = reference
    actual = encode_text(model, jnp.asarray(CLIPTokenizer()(TRICKY)))
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(np.asarray(actual), expected, atol=1e-5, rtol=0)


def test_clip_score_is_the_clamped_mean_of_open_clips_cosines(reference):
    model, images, image_features, text_features = reference
    pairs = Images(jnp.asarray(images.numpy().transpose(0, 2, 3, 1)), prompts=tuple(TRICKY[:2]))
    metric = metrics.clip_score(model)
    cosines = torch.nn.functional.cosine_similarity(
        torch.from_numpy(image_features), torch.from_numpy(text_features[:2])
    )
    state = metric(pairs)
    np.testing.assert_allclose(state.total, float((100 * cosines).sum()), atol=1e-3)
    expected = max(float((100 * cosines).mean()), 0.0)  # torchmetrics' compute
    np.testing.assert_allclose(metric.finalize(state), expected, atol=1e-3)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_a_torchscript_archive_loads_as_openais_pt_files_would(tmp_path):
    # OpenAI's CLIP .pt files are torch.jit archives of a half-precision QuickGELU model with
    # open_clip's parameter names. Here: a small open_clip CLIP, scripted and saved so (the
    # real files are not fetched by the tests).
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(3)
    vision = CLIPVisionCfg(layers=2, width=32, patch_size=8, image_size=32, head_width=16)
    reference = open_clip.model.CLIP(
        16, vision, CLIPTextCfg(layers=2, width=32, heads=4), quick_gelu=True
    )
    scripted = torch.jit.script(reference.eval().half())
    path = tmp_path / "ViT-tiny.pt"
    scripted.save(path)
    config = dataclasses.replace(
        MODELS["ViT-B-32"],
        embed_dim=16,
        image_size=32,
        patch_size=8,
        vision_width=32,
        vision_layers=2,
        vision_heads=2,
        text_width=32,
        text_layers=2,
        text_heads=4,
    )
    model = CLIP.load(path, model=config, quick_gelu=True)
    loaded = load_torch_state_dict(path)
    expected_state = torch.jit.load(path).state_dict()
    assert sorted(loaded) == sorted(expected_state)
    for key, value in expected_state.items():
        assert loaded[key].dtype == np.float16
        np.testing.assert_array_equal(loaded[key], value.numpy())
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN)[:, None, None]
    std = torch.tensor(open_clip.OPENAI_DATASET_STD)[:, None, None]
    widened = reference.float()  # the half weights, widened as dew widens them
    with torch.no_grad():
        image_features = widened.encode_image((images - mean) / std).numpy()
        text_features = widened.encode_text(open_clip.tokenize(TRICKY[:3])).numpy()
    actual_image = model.encode_image(jnp.asarray(images.numpy().transpose(0, 2, 3, 1)))
    actual_text = model.encode_text(jnp.asarray(CLIPTokenizer()(TRICKY[:3])))
    np.testing.assert_allclose(np.asarray(actual_image), image_features, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(actual_text), text_features, atol=1e-5, rtol=0)


@settings(max_examples=300, deadline=None, database=None)
@given(
    text=st.text(
        st.characters(exclude_categories=("Cs",)) | st.sampled_from("&;#<> '\t\nÃ©"), max_size=60
    )
)
def test_tokens_are_open_clips_on_any_text(text):
    expected = _open_clip_tokenizer()([text]).numpy()
    np.testing.assert_array_equal(tokenize([text]), expected)


@functools.cache
def _open_clip_tokenizer():
    return open_clip.get_tokenizer("ViT-B-32")
