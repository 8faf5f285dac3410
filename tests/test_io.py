"""dew.io: PyTorch and safetensors weight files read into NumPy without torch."""

import hashlib
import json
import os
import pickle
import struct
import zipfile

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

from dew.io import ALLOWED_GLOBALS, check_sha256, load_torch_state_dict, sha256_of

FORMATS = {"zip": True, "legacy": False}  # format -> torch.save's _use_new_zipfile_serialization


def _bits(array: np.ndarray) -> tuple:
    """What bit-identity compares: dtype, shape and the raw bytes."""
    return array.dtype.name, array.shape, np.ascontiguousarray(array).tobytes()


def _torch_bits(tensor) -> tuple:
    import torch

    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        raw = tensor.view(torch.int16).numpy().tobytes()
        return "bfloat16", tuple(tensor.shape), raw
    array = tensor.numpy()
    return array.dtype.name, array.shape, array.tobytes()


@pytest.fixture(scope="module")
def tensors():
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    base = torch.arange(24.0).reshape(4, 6)
    shared = torch.randn(10, generator=generator, dtype=torch.float64)
    return {
        "float32": torch.randn(3, 4, generator=generator),
        "float64": torch.randn(5, generator=generator, dtype=torch.float64),
        "float16": torch.randn(2, 3, generator=generator).half(),
        "bfloat16": torch.randn(7, generator=generator).bfloat16(),
        "int64": torch.arange(-3, 5),
        "int32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "uint8": torch.arange(250, 256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "special": torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]),
        "transposed": base.t(),
        "sliced": base[1:, 2:],
        "stepped": base[::2, ::3],
        "whole": base,
        "shared_head": shared[:4],
        "shared_tail": shared[6:],
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "parameter": torch.nn.Parameter(torch.ones(2, 2)),
    }


@pytest.mark.parametrize("form", FORMATS)
def test_both_pth_formats_read_bit_identically_to_torch_load(tensors, form, tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / f"{form}.pth"
    torch.save(tensors, path, _use_new_zipfile_serialization=FORMATS[form])
    expected = torch.load(path)
    loaded = load_torch_state_dict(path)
    assert list(loaded) == list(expected)
    assert {k: _bits(v) for k, v in loaded.items()} == {
        k: _torch_bits(v) for k, v in expected.items()
    }
    assert loaded["bfloat16"].dtype == ml_dtypes.bfloat16
    assert loaded["transposed"].flags.c_contiguous and loaded["transposed"].flags.writeable
    assert loaded["scalar"].shape == ()


@pytest.mark.parametrize("form", FORMATS)
def test_a_modules_state_dict_and_a_checkpoint_read(form, tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    plain, wrapped = tmp_path / "plain.pth", tmp_path / "checkpoint.pth"
    torch.save(model.state_dict(), plain, _use_new_zipfile_serialization=FORMATS[form])
    checkpoint = {"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}
    torch.save(checkpoint, wrapped, _use_new_zipfile_serialization=FORMATS[form])
    expected = {k: _torch_bits(v) for k, v in model.state_dict().items()}
    assert {k: _bits(v) for k, v in load_torch_state_dict(plain).items()} == expected
    assert {k: _bits(v) for k, v in load_torch_state_dict(wrapped).items()} == expected


class _RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _malicious_files(tmp_path):
    """The same payload in every place a reader could meet it."""
    marker = tmp_path / "ran"
    payload = pickle.dumps({"weight": _RunsACommand(marker)}, protocol=2)
    bare = tmp_path / "bare.pth"
    bare.write_bytes(payload)
    legacy = tmp_path / "legacy.pth"  # valid legacy headers, then the payload
    legacy.write_bytes(
        b"".join(
            pickle.dumps(v, protocol=2)
            for v in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True})
        )
        + payload
    )
    archive = tmp_path / "archive.pth"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/version", "3\n")
    return marker, {"bare": bare, "legacy": legacy, "zip": archive}


def test_a_malicious_pickle_is_refused_before_it_runs(tmp_path):
    marker, files = _malicious_files(tmp_path)
    for path in files.values():
        with pytest.raises(ValueError, match=r"names the global (posix|os|nt)\.system") as caught:
            load_torch_state_dict(path)
        assert str(path) in str(caught.value)
    assert not marker.exists()
    # The payload does run when unpickled plainly: the test can fail.
    pickle.loads(files["bare"].read_bytes())
    assert marker.exists()


def test_the_allow_list_holds_only_tensor_rebuilding_globals():
    modules = {module for module, _ in ALLOWED_GLOBALS}
    assert modules == {
        "collections",
        "torch",
        "torch._utils",
        "torch._tensor",
        "torch.nn.parameter",
        "builtins",
    }
    assert ("builtins", "eval") not in ALLOWED_GLOBALS
    assert ("torch", "load") not in ALLOWED_GLOBALS


def test_a_pickle_calling_an_allowed_global_oddly_is_a_clear_error(tmp_path):
    # OrderedDict is allowed; calling a storage marker (not callable) is not.
    path = tmp_path / "odd.pth"
    path.write_bytes(b"\x80\x02ctorch\nFloatStorage\n)R.")
    with pytest.raises(ValueError, match=r"odd\.pth"):
        load_torch_state_dict(path)


@pytest.mark.parametrize("form", FORMATS)
def test_a_truncated_file_is_a_clear_error(tensors, form, tmp_path):
    torch = pytest.importorskip("torch")
    whole = tmp_path / "whole.pth"
    torch.save(tensors, whole, _use_new_zipfile_serialization=FORMATS[form])
    data = whole.read_bytes()
    for cut in (4, 20, len(data) // 3, len(data) // 2, len(data) - 8, len(data) - 1):
        path = tmp_path / f"cut{cut}.pth"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=rf"cut{cut}\.pth.*(truncated|damaged)"):
            load_torch_state_dict(path)


def test_a_view_reaching_past_its_storage_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "short.pth"
    torch.save({"w": torch.zeros(4)}, path, _use_new_zipfile_serialization=False)
    # Rewrite the tensor's size 4 as 9 in the pickle (storage numel stays 4).
    data = path.read_bytes()
    index = data.index(b"K\x04\x85q")  # BININT1 4, TUPLE1: the size tuple (4,)
    path.write_bytes(data[:index] + b"K\x09" + data[index + 2 :])
    with pytest.raises(ValueError, match="reaches element 8 of storage"):
        load_torch_state_dict(path)


def test_missing_and_unknown_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothing\.pth"):
        load_torch_state_dict(tmp_path / "nothing.pth")
    text = tmp_path / "notes.pth"
    text.write_text("these are not weights\n")
    with pytest.raises(ValueError, match=r"notes\.pth.*not a torch zip archive"):
        load_torch_state_dict(text)


def test_a_file_that_is_not_a_flat_state_dict_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "mixed.pth"
    torch.save({"w": torch.zeros(2), "epoch": 3}, path)
    with pytest.raises(ValueError, match=r"not a flat state dict.*'epoch': 'int'"):
        load_torch_state_dict(path)


def _safetensors_bytes(arrays: dict[str, tuple[str, np.ndarray]], metadata=None) -> bytes:
    """A safetensors file written by hand from the format's spec."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (code, array) in arrays.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the spec allows padding the header with spaces
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


SAFETENSORS_ARRAYS = {
    "f32": ("F32", np.arange(12, dtype=np.float32).reshape(3, 4) / 7),
    "f64": ("F64", np.array([np.pi, -np.inf, np.nan])),
    "f16": ("F16", np.array([[1.5, -2.25]], np.float16)),
    "bf16": ("BF16", np.array([1.0, 3.5, -0.125], ml_dtypes.bfloat16)),
    "i64": ("I64", np.array([-(2**62), 7])),
    "u8": ("U8", np.arange(5, dtype=np.uint8)),
    "b": ("BOOL", np.array([True, False])),
    "scalar": ("F32", np.array(2.5, np.float32)),
    "empty": ("F32", np.zeros((0, 2), np.float32)),
}


def test_safetensors_written_by_hand_read_identically(tmp_path):
    path = tmp_path / "hand.safetensors"
    path.write_bytes(_safetensors_bytes(SAFETENSORS_ARRAYS, metadata={"format": "np"}))
    loaded = load_torch_state_dict(path)
    assert {k: _bits(v) for k, v in loaded.items()} == {
        k: _bits(a) for k, (_, a) in SAFETENSORS_ARRAYS.items()
    }


def test_safetensors_written_by_the_package_read_identically(tmp_path):
    numpy_io = pytest.importorskip("safetensors.numpy")
    arrays = {k: a for k, (_, a) in SAFETENSORS_ARRAYS.items() if k != "bf16"}
    path = tmp_path / "package.safetensors"
    numpy_io.save_file(arrays, str(path))
    loaded = load_torch_state_dict(path)
    assert {k: _bits(v) for k, v in loaded.items()} == {k: _bits(a) for k, a in arrays.items()}


def test_bad_safetensors_are_clear_errors(tmp_path):
    good = _safetensors_bytes({"w": ("F32", np.ones(4, np.float32))})
    cases = {
        "truncated": good[:-3],
        "header_too_long": struct.pack("<Q", 10**6) + good[8:],
        "bad_dtype": good.replace(b'"F32"', b'"F99"'),
        "bad_offsets": good.replace(b"[0, 16]", b"[0, 12]"),
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=rf"{name}\.safetensors"):
            load_torch_state_dict(path)


def test_sha256_helpers(tmp_path):
    path = tmp_path / "blob.bin"
    data = os.urandom(3 << 20)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    assert sha256_of(path) == digest
    check_sha256(path, digest[:8])
    check_sha256(path, digest[:8].upper())
    other = "0" * 8 if not digest.startswith("0" * 8) else "1" * 8
    with pytest.raises(ValueError, match=rf"blob\.bin.*{digest[:8]}.*{other}"):
        check_sha256(path, other)


def test_the_zip_reader_needs_no_torch(tmp_path):
    # A torch-style archive written by hand (what torch >= 1.6 writes), read without torch.
    array = np.arange(6, dtype=np.float32)
    # Build the pickle opcodes directly: _rebuild_tensor_v2(storage, 0, (2, 3), (3, 1), False, {}).
    pid = (
        b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
        b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQ"
    )
    body = (
        b"\x80\x02ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00w"
        b"ctorch._utils\n_rebuild_tensor_v2\n("
        + pid
        + b"K\x00K\x02K\x03\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)RtRu."
    )
    path = tmp_path / "hand.pth"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hand/data.pkl", body)
        z.writestr("hand/byteorder", "little")
        z.writestr("hand/data/0", array.tobytes())
    loaded = load_torch_state_dict(path)
    assert _bits(loaded["w"]) == _bits(array.reshape(2, 3))


def test_a_legacy_storage_view_reads_as_a_slice_of_its_root(tmp_path):
    # torch < 1.0 wrote shared storages as views: (view key, offset, size) in the storage
    # record. Written by hand: {"w": a (3,) tensor on view "v" = root "0"[2:5]}.
    root = np.arange(6, dtype=np.float32) * 1.5
    pid = (
        b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000"
        b"X\x03\x00\x00\x00cpuK\x06(X\x01\x00\x00\x00vK\x02K\x03ttQ"
    )
    body = (
        b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n("
        + pid
        + b"K\x00K\x03\x85K\x01\x85\x89}tRs."
    )
    headers = (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True})
    path = tmp_path / "views.pth"
    path.write_bytes(
        b"".join(pickle.dumps(value, protocol=2) for value in headers)
        + body
        + pickle.dumps(["0"], protocol=2)
        + struct.pack("<q", 6)
        + root.tobytes()
    )
    assert _bits(load_torch_state_dict(path)["w"]) == _bits(root[2:5])


_DTYPE_CODES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64}


@given(
    arrays=st.dictionaries(
        st.text("abc._", min_size=1, max_size=6),
        st.sampled_from(sorted(_DTYPE_CODES)).flatmap(
            lambda code: hnp.arrays(
                _DTYPE_CODES[code], hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)
            ).map(lambda array: (code, array))
        ),
        max_size=4,
    )
)
@settings(max_examples=40)
def test_any_safetensors_file_reads_back_bit_identically(tmp_path_factory, arrays):
    path = tmp_path_factory.mktemp("any") / "any.safetensors"
    path.write_bytes(_safetensors_bytes(arrays))
    loaded = load_torch_state_dict(path)
    assert {k: _bits(v) for k, v in loaded.items()} == {k: _bits(a) for k, (_, a) in arrays.items()}


@given(
    array=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5)),
    data=st.data(),
)
@settings(max_examples=25)
def test_any_strided_view_reads_back_as_torch_load_reads_it(tmp_path_factory, array, data):
    torch = pytest.importorskip("torch")
    index = tuple(
        slice(data.draw(st.integers(0, n - 1)), None, data.draw(st.integers(1, 3)))
        for n in array.shape
    )
    view = torch.from_numpy(array)[index]
    if data.draw(st.booleans()) and view.ndim > 1:
        view = view.transpose(0, -1)
    directory = tmp_path_factory.mktemp("views")
    for form, zip_format in FORMATS.items():
        path = directory / f"{form}.pth"
        torch.save(
            {"view": view, "whole": torch.from_numpy(array)},
            path,
            _use_new_zipfile_serialization=zip_format,
        )
        loaded = load_torch_state_dict(path)
        assert _bits(loaded["view"]) == _torch_bits(torch.load(path)["view"])


def test_a_storage_claiming_more_elements_than_the_file_holds_is_refused(tmp_path):
    # 2**31 - 1 float32 elements claimed, 24 bytes present: refused before any allocation.
    pid = (
        b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
        b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ\xff\xff\xff\x7ftQ"
    )
    body = (
        b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n("
        + pid
        + b"K\x00K\x06\x85K\x01\x85\x89}tRs."
    )
    path = tmp_path / "greedy.pth"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("greedy/data.pkl", body)
        z.writestr("greedy/data/0", np.zeros(6, np.float32).tobytes())
    with pytest.raises(ValueError, match=r"greedy\.pth.*shorter than its 2147483647 elements"):
        load_torch_state_dict(path)
