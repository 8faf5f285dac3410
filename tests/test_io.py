"""dew.io: PyTorch and safetensors weight files read into NumPy without torch."""

import functools
import hashlib
import json
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import tempfile
import tracemalloc
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


@pytest.mark.parity  # torch writes the files it is compared with
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


@pytest.mark.parity  # torch writes the files it is compared with
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


@pytest.mark.parity  # torch writes the files it is compared with
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


@pytest.mark.parity  # torch writes the files it is compared with
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


@pytest.mark.parity  # torch writes the files it is compared with
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
    from safetensors.numpy import save_file

    arrays = {k: a for k, (_, a) in SAFETENSORS_ARRAYS.items()}
    arrays["f8_e4m3"] = np.array([0.5, -448.0], ml_dtypes.float8_e4m3fn)
    arrays["f8_e5m2"] = np.array([[1.0], [-57344.0]], ml_dtypes.float8_e5m2)
    arrays["i8"] = np.array([-128, 127], np.int8)
    path = tmp_path / "package.safetensors"
    save_file(arrays, path, metadata={"format": "np"})
    loaded = load_torch_state_dict(path)
    assert {k: _bits(v) for k, v in loaded.items()} == {k: _bits(a) for k, a in arrays.items()}
    assert all(array.flags.c_contiguous and array.flags.writeable for array in loaded.values())


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


@pytest.mark.parity  # torch writes the files it is compared with
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
    with pytest.raises(ValueError, match=r"greedy\.pth.*declares 2,147,483,647 float32 elem"):
        load_torch_state_dict(path)


# -- hostile files: every storage's size and every view's bounds checked against the file ------
#
# Each file is built here from PyTorch's formats, opcode by opcode, so that it asks for what
# torch never writes. Every one is refused in one line naming the file, the format and the
# tensor, before anything near what it asks for is allocated.


def _op_int(value: int) -> bytes:
    """A pickle's opcodes pushing the int `value` (BININT1/BININT2/BININT or LONG1)."""
    return pickle.dumps(value, protocol=2)[2:-1]


def _op_str(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _op_ints(values) -> bytes:
    return b"(" + b"".join(_op_int(value) for value in values) + b"t"


def _op_tensor(key, numel, size, stride, offset=0, storage=b"FloatStorage", view=b"") -> bytes:
    """`torch._utils._rebuild_tensor_v2(<storage key: numel elements>, offset, size, stride,
    False, {})`, the storage as its persistent id (a view: `view`, a tuple's opcodes)."""
    pid = b"(" + _op_str("storage") + b"ctorch\n" + storage + b"\n" + _op_str(key)
    pid += _op_str("cpu") + _op_int(numel) + view + b"tQ"
    arguments = pid + _op_int(offset) + _op_ints(size) + _op_ints(stride) + b"\x89}"
    return b"ctorch._utils\n_rebuild_tensor_v2\n(" + arguments + b"tR"


def _op_state_dict(tensors: dict[str, bytes]) -> bytes:
    """A protocol-2 pickle of a dict from name to the tensor opcodes given."""
    items = b"".join(_op_str(name) + tensor for name, tensor in tensors.items())
    return b"\x80\x02}(" + items + b"u."


def _zip_pth(path, body: bytes, records: dict[str, bytes], compression=zipfile.ZIP_STORED):
    """A torch zip archive (what torch >= 1.6 writes) holding the pickle `body`."""
    name = path.stem
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        archive.writestr(f"{name}/data.pkl", body)
        archive.writestr(f"{name}/byteorder", "little")
        for key, data in records.items():
            archive.writestr(f"{name}/data/{key}", data)
        archive.writestr(f"{name}/version", "3\n")
    return path


def _legacy_pth(path, body: bytes, storages: dict[str, bytes], itemsize=4):
    """A legacy torch pickle stream (torch < 1.6) holding the pickle `body`, then each
    storage's element count and bytes."""
    headers = (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True})
    data = b"".join(pickle.dumps(value, protocol=2) for value in headers) + body
    data += pickle.dumps(list(storages), protocol=2)
    for raw in storages.values():
        data += struct.pack("<q", len(raw) // itemsize) + raw
    path.write_bytes(data)
    return path


def _refused(path, *phrases, form=None) -> str:
    """The one line `load_torch_state_dict` refuses `path` with (it names the file, the
    format read and every phrase), checked to come before any allocation near what the
    file asks for: the peak NumPy and Python allocate meanwhile (tracemalloc) stays under
    1 MiB past the objects unpickling the file takes (32 bytes for each byte at most)."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="Cannot read weights file") as caught:
            load_torch_state_dict(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"Cannot read weights file {str(path)!r}")
    if form is not None:
        assert f"{str(path)!r} as {form}: " in message
    for phrase in phrases:
        assert phrase in message
    # What unpickling a pickle takes (its objects: tens of bytes each) is not what it asks.
    assert peak < 32 * path.stat().st_size + 2**20, f"{peak:,} bytes allocated: {message}"
    return message


def test_the_hand_built_files_read_as_torch_writes_them(tmp_path):
    # The builders are right: valid files read back as the arrays they hold.
    data = np.arange(12, dtype=np.float32)
    body = _op_state_dict(
        {
            "w": _op_tensor("0", 12, (3, 4), (4, 1)),
            "t": _op_tensor("0", 12, (4, 3), (1, 4)),
            "tied": _op_tensor("0", 12, (3, 4), (4, 1)),
            "tail": _op_tensor("0", 12, (2,), (1,), offset=10),
            "wide": _op_tensor("0", 12, (1, 2), (10**30, 1), offset=5),  # size 1: any stride
        }
    )
    expected = {
        "w": data.reshape(3, 4),
        "t": data.reshape(3, 4).T,
        "tied": data.reshape(3, 4),
        "tail": data[10:],
        "wide": data[5:7].reshape(1, 2),
    }
    for path in (
        _zip_pth(tmp_path / "hand.pth", body, {"0": data.tobytes()}),
        _zip_pth(tmp_path / "packed.pth", body, {"0": data.tobytes()}, zipfile.ZIP_DEFLATED),
        _legacy_pth(tmp_path / "legacy.pth", body, {"0": data.tobytes()}),
    ):
        loaded = load_torch_state_dict(path)
        assert {k: _bits(v) for k, v in loaded.items()} == {
            k: _bits(np.ascontiguousarray(v)) for k, v in expected.items()
        }
        assert loaded["tied"] is loaded["w"]  # tied weights stay one array, as in torch
        assert loaded["t"] is not loaded["w"]


FORMS = {"zip": (_zip_pth, "a torch zip archive"), "legacy": (_legacy_pth, "a legacy torch pickle")}


@pytest.mark.parametrize("form", FORMS)
def test_a_411_byte_file_asking_for_256_mib_is_refused_without_allocating_it(tmp_path, form):
    # One float, read as 2**26 of them through a stride of 0: a 256 MiB copy.
    write, name = FORMS[form]
    body = _op_state_dict({"w": _op_tensor("0", 1, (2**26,), (0,))})
    path = write(tmp_path / "expand.pth", body, {"0": np.ones(1, np.float32).tobytes()})
    assert path.stat().st_size < 700
    message = _refused(
        path,
        "tensor 'w' of shape (67108864,) (268,435,456 bytes) brings the arrays read to "
        "268,435,456 bytes, more than the",
        "views of one storage that overlap (a stride of 0",
        form=name,
    )
    assert message.endswith("save the tensors with .clone() or .contiguous().")


def test_peak_memory_stays_flat_reading_a_hostile_file(tmp_path):
    # The same 411-byte file in a fresh process: its peak RSS grows by no more than 50 MiB
    # over the same process reading a valid file first (the import and the reader's own).
    body = _op_state_dict({"w": _op_tensor("0", 1, (2**26,), (0,))})
    hostile = _zip_pth(tmp_path / "expand.pth", body, {"0": np.ones(1, np.float32).tobytes()})
    valid = _zip_pth(
        tmp_path / "valid.pth",
        _op_state_dict({"w": _op_tensor("0", 1, (1,), (1,))}),
        {"0": np.ones(1, np.float32).tobytes()},
    )
    script = (
        "import resource, sys\n"
        "from dew.io import load_torch_state_dict\n"
        "load_torch_state_dict(sys.argv[1])\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    load_torch_state_dict(sys.argv[2])\n"
        "except ValueError as error:\n    print(error, file=sys.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(valid), str(hostile)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "brings the arrays read to 268,435,456 bytes" in result.stderr
    assert int(result.stdout) < 50 * 1024  # KiB: ru_maxrss counts kibibytes on Linux


@pytest.mark.parametrize("form", FORMS)
def test_a_storage_declaring_more_than_the_file_is_refused_before_it_is_read(tmp_path, form):
    # 2**34 float32 elements (64 GiB) declared for 16 bytes, viewed whole.
    write, name = FORMS[form]
    body = _op_state_dict({"w": _op_tensor("0", 2**34, (2**34,), (1,))})
    path = write(tmp_path / "greedy.pth", body, {"0": np.ones(4, np.float32).tobytes()})
    _refused(path, "tensor 'w'", "68,719,476,736 bytes", "more than the", form=name)


def test_a_compressed_record_unpacking_past_the_file_is_refused(tmp_path):
    # 32 MiB of zeros deflated into a file of about 32 KiB: torch stores records unpacked.
    numel = 2**23
    body = _op_state_dict({"w": _op_tensor("0", numel, (numel,), (1,))})
    records = {"0": bytes(4 * numel)}
    path = _zip_pth(tmp_path / "bomb.pth", body, records, zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 64 * 1024
    _refused(path, "tensor 'w'", "33,554,432 bytes", form="a torch zip archive")


@pytest.mark.parametrize("form", FORMS)
def test_overlapping_views_copied_past_the_files_size_are_refused(tmp_path, form):
    # 64 views of one 256 KiB storage, each starting one element further: 16 MiB of copies.
    write, name = FORMS[form]
    numel = 2**16
    tensors = {
        f"layer.{index}": _op_tensor("0", numel, (numel - 64,), (1,), offset=index)
        for index in range(64)
    }
    records = {"0": np.arange(numel, dtype=np.float32).tobytes()}
    path = write(tmp_path / "many.pth", _op_state_dict(tensors), records)
    message = _refused(path, "brings the arrays read to", form=name)
    assert "tensor 'layer.1' of shape (65472,)" in message
    # The same views, as tied weights (one view under several names), read as one array.
    tied = {f"layer.{index}": _op_tensor("0", numel, (numel - 64,), (1,)) for index in range(64)}
    loaded = load_torch_state_dict(write(tmp_path / "tied.pth", _op_state_dict(tied), records))
    assert len({id(array) for array in loaded.values()}) == 1


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("tensor", "phrases"),
    [
        (
            _op_tensor("0", 4, (5,), (1,)),
            ["tensor 'w' of shape (5,) reaches element 4 of storage '0', which holds 4"],
        ),
        (
            _op_tensor("0", 4, (2,), (1,), offset=3),
            ["tensor 'w' of shape (2,) reaches element 4 of storage '0'"],
        ),
        (
            _op_tensor("0", 4, (2, 2), (3, 1)),
            ["tensor 'w' of shape (2, 2) reaches element 4 of storage '0'"],
        ),
        (_op_tensor("0", 4, (2,), (1, 1)), ["tensor 'w' has size (2,) but stride (1, 1)"]),
        (_op_tensor("0", 4, (-2,), (1,)), ["tensor 'w' has size (-2,), not ints >= 0"]),
        (_op_tensor("0", 4, (1,) * 65, (1,) * 65), ["tensor 'w' has size (1, 1, 1"]),
        (_op_tensor("0", 4, (0, 2**62), (1, 1)), ["tensor 'w' has shape (0, 4611686018427387904)"]),
        (_op_tensor("0", -4, (0,), (1,)), ["size of storage '0' of tensor 'w' is -4"]),
        (_op_tensor("0", 2**62, (1,), (1,)), ["storage '0' of tensor 'w' declares 4,611,68"]),
    ],
)
def test_a_view_outside_what_numpy_or_its_storage_holds_names_the_tensor(
    tmp_path, form, tensor, phrases
):
    write, name = FORMS[form]
    path = write(tmp_path / "bad.pth", _op_state_dict({"w": tensor}), {"0": bytes(16)})
    _refused(path, *phrases, form=name)


def test_a_legacy_storage_view_outside_its_root_names_the_tensor(tmp_path):
    # torch < 1.0's storage views: (view key, offset, size) inside a root storage.
    view = b"(" + _op_str("v") + _op_int(4) + _op_int(3) + b"t"
    body = _op_state_dict({"w": _op_tensor("0", 6, (3,), (1,), view=view)})
    path = _legacy_pth(tmp_path / "views.pth", body, {"0": bytes(24)})
    _refused(path, "storage view 'v' of tensor 'w' (elements 4 to 7) lies outside storage '0'")


@pytest.mark.parametrize(
    ("body", "phrases"),
    [
        # A memo index sizes the unpickler's memo: 2**31 - 1 would be 16 GiB of pointers.
        (b"\x80\x02Nr\xff\xff\xff\x7f.", ["stores memo entry 2147483647 after 2 opcodes"]),
        # bytearray is allowed (torch pickles use it), but never of a size the file picks.
        (b"\x80\x02cbuiltins\nbytearray\n(\x8a\x06\x00\x00\x00\x00\x00\x01tR.", ["bytearray"]),
        # A length (2**40) the unpickler would allocate before finding it past the end.
        (b"\x80\x04\x8e" + struct.pack("<Q", 2**40) + b".", ["damaged, truncated or malformed"]),
        (b"\x80\x09N.", ["damaged, truncated or malformed"]),  # no such protocol
        (_op_state_dict({"w": _op_tensor("0", 4, (2,) * 10**5, (1,))}), ["tensor 'w' has size"]),
        (
            b"\x80\x02}(" + _op_str("w") + b"ctorch._utils\n_rebuild_tensor_v2\n((C\x02\xff\xfe"
            b"ctorch\nFloatStorage\n" + _op_str("0") + _op_str("cpu") + b"K\x04tQK"
            b"\x00(K\x04t(K\x01t\x89}tRu.",
            ["holds a b'\\xff\\xfe' record; only storages are read"],  # bytes, not ASCII
        ),
    ],
)
def test_a_pickle_asking_its_reader_to_allocate_is_refused_before_it_runs(tmp_path, body, phrases):
    path = _zip_pth(tmp_path / "ask.pth", body, {"0": bytes(16)})
    _refused(path, *phrases, form="a torch zip archive")


@pytest.mark.parametrize("form", FORMS)
def test_a_storage_whose_data_is_shorter_than_declared_names_the_tensor(tmp_path, form):
    # 64 elements declared for storage "0" (which the file's size allows), 4 present.
    write, name = FORMS[form]
    body = _op_state_dict(
        {"w": _op_tensor("0", 64, (4,), (1,)), "big": _op_tensor("1", 256, (256,), (1,))}
    )
    records = {"0": bytes(16), "1": bytes(1024)}
    phrase = {
        "zip": "storage '0' of tensor 'w' is shorter than its 64 elements (256 bytes): its record",
        "legacy": "storage '0' of tensor 'w' holds 4 elements, but its record declares 64",
    }[form]
    _refused(write(tmp_path / "short.pth", body, records), phrase, form=name)


def _safetensors_file(header, data: bytes = b"", length=None) -> bytes:
    """A safetensors file of the JSON `header` (a value, or its bytes) and `data`."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SIXTEEN = np.arange(4, dtype=np.float32).tobytes()
HOSTILE_SAFETENSORS = {
    "overlap": (
        _safetensors_file(
            {"a": _entry("F32", [4], 0, 16), "b": _entry("F32", [2], 8, 16)}, SIXTEEN
        ),
        "invalid offset for tensor `b`",
    ),
    "same_bytes_twice": (
        _safetensors_file(
            {"a": _entry("F32", [4], 0, 16), "b": _entry("F32", [4], 0, 16)}, SIXTEEN
        ),
        "invalid offset for tensor `",
    ),
    "gap": (
        _safetensors_file({"a": _entry("F32", [3], 4, 16)}, SIXTEEN),
        "invalid offset for tensor `a`",
    ),
    "past_the_end": (
        _safetensors_file({"a": _entry("F32", [8], 0, 32)}, SIXTEEN),
        "incomplete metadata, file not fully covered",
    ),
    "tiny_file_huge_shape": (
        _safetensors_file({"a": _entry("F32", [2**40], 0, 2**42)}, SIXTEEN),
        "incomplete metadata, file not fully covered",
    ),
    "header_past_the_file": (
        _safetensors_file({"a": _entry("F32", [4], 0, 16)}, SIXTEEN, length=10_000),
        "invalid header length",
    ),
    "header_past_the_limit": (
        _safetensors_file({"a": _entry("F32", [4], 0, 16)}, SIXTEEN, length=2**40),
        "header too large",
    ),
    "bytes_not_the_shape": (
        _safetensors_file({"a": _entry("F32", [3], 0, 16)}, SIXTEEN),
        "invalid shape, data type, or offset for tensor",
    ),
    "trailing_bytes": (
        _safetensors_file({"a": _entry("F32", [4], 0, 16)}, SIXTEEN + b"xx"),
        "incomplete metadata, file not fully covered",
    ),
    "negative_shape": (
        _safetensors_file({"a": _entry("F32", [-4], 0, 16)}, SIXTEEN),
        "invalid value: integer `-4`, expected usize",
    ),
    "text_shape": (
        _safetensors_file({"a": _entry("F32", ["a"], 0, 16)}, SIXTEEN),
        'invalid type: string "a", expected usize',
    ),
    "100_dimensions": (
        _safetensors_file({"a": _entry("F32", [1] * 99 + [4], 0, 16)}, SIXTEEN),
        "tensor 'a' has 100 dimensions; NumPy arrays have at most 64",
    ),
    "metadata_not_strings": (
        _safetensors_file({"__metadata__": {"a": 1}, "a": _entry("F32", [4], 0, 16)}, SIXTEEN),
        "invalid type: integer `1`, expected a string",
    ),
    "header_not_utf8": (
        _safetensors_file(b'{"\xff": 1}', SIXTEEN),
        "invalid UTF-8 in header",
    ),
    "header_nested_100000_deep": (
        _safetensors_file(b'{"a": ' + b"[" * 100_000),
        "invalid JSON in header: recursion limit exceeded",
    ),
    "unknown_dtype": (
        _safetensors_file({"a": _entry("F99", [4], 0, 16)}, SIXTEEN),
        "unknown variant `F99`, expected one of `BOOL`",
    ),
}


@pytest.mark.parametrize("case", HOSTILE_SAFETENSORS)
def test_a_hostile_safetensors_file_is_one_line_naming_the_tensor(tmp_path, case):
    data, phrase = HOSTILE_SAFETENSORS[case]
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(data)
    message = _refused(path, phrase, form="safetensors")
    assert "pickle" not in message


def test_a_file_named_safetensors_is_read_as_safetensors_whatever_it_holds(tmp_path):
    # Its header length begins with 0x80, a pickle's first byte: still not "a pickle".
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", 0x80) + b"[1, 2]" + b" " * (0x80 - 6))
    message = _refused(path, "invalid type: sequence, expected struct", form="safetensors")
    assert "pickle" not in message
    pickled = tmp_path / "pickled.safetensors"
    pickled.write_bytes(pickle.dumps({"w": 1}, protocol=2))
    _refused(pickled, "the safetensors package refuses it (header too large)", form="safetensors")


@functools.cache
def _valid_files() -> dict[str, bytes]:
    """Small valid files of each format, written without torch, as bytes."""
    data = np.arange(12, dtype=np.float32)
    body = _op_state_dict(
        {"w": _op_tensor("0", 12, (3, 4), (4, 1)), "t": _op_tensor("0", 12, (4, 3), (1, 4))}
    )
    with tempfile.TemporaryDirectory() as folder:
        directory = pathlib.Path(folder)
        return {
            "zip.pth": _zip_pth(directory / "a.pth", body, {"0": data.tobytes()}).read_bytes(),
            "legacy.pth": _legacy_pth(
                directory / "b.pth", body, {"0": data.tobytes()}
            ).read_bytes(),
            "x.safetensors": _safetensors_bytes({"w": ("F32", data), "b": ("I64", np.arange(3))}),
        }


@given(
    data=st.data(),
    name=st.sampled_from(["zip.pth", "legacy.pth", "x.safetensors"]),
    cut=st.none() | st.integers(0, 2000),
)
@settings(max_examples=150, deadline=None)
def test_a_damaged_file_reads_or_is_one_line_naming_it_never_another_error(
    tmp_path_factory, data, name, cut
):
    directory = tmp_path_factory.mktemp("damaged")
    original = _valid_files()[name]
    edits = data.draw(
        st.lists(st.tuples(st.integers(0, len(original) - 1), st.integers(0, 255)), max_size=4)
    )
    damaged = bytearray(original)
    for position, value in edits:
        damaged[position] = value
    path = directory / name
    path.write_bytes(bytes(damaged[:cut]))
    tracemalloc.start()
    try:
        load_torch_state_dict(path)
    except ValueError as error:
        message = str(error)
        assert message.startswith(f"Cannot read weights file {str(path)!r}"), message
        assert "\n" not in message
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 2**20


@pytest.mark.parity  # torch writes the files it is compared with
@pytest.mark.parametrize("form", FORMATS)
def test_tied_and_expanded_tensors_torch_writes_read_as_torch_load_reads_them(form, tmp_path):
    # The array budget refuses only what a file could not hold: torch's own tied weights
    # (one storage under two names) and a small expanded (stride 0) tensor read back.
    torch = pytest.importorskip("torch")
    embedding = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    tensors = {"embed": embedding, "head": embedding, "bias": torch.ones(1).expand(8)}
    path = tmp_path / "tied.pth"
    torch.save(tensors, path, _use_new_zipfile_serialization=FORMATS[form])
    loaded = load_torch_state_dict(path)
    expected = torch.load(path)
    assert {k: _bits(v) for k, v in loaded.items()} == {
        k: _torch_bits(v) for k, v in expected.items()
    }
    assert expected["head"].data_ptr() == expected["embed"].data_ptr()
    assert loaded["head"] is loaded["embed"]
