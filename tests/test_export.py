"""`dew.export` and `dew export`: a run's parameters as safetensors and its forward function as
StableHLO, each read back in a Python where `import dew` fails (the `safetensors` package's own
NumPy reader, `jax.export.deserialize`), and the record of each export in the run folder."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import ml_dtypes
import numpy as np
import pytest
from _trained_runs import trained
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dew
from dew._safetensors import read_safetensors, safetensors_bytes
from dew.cli import main
from dew.config._load import example_batch
from dew.export import FORMATS, export_run, forward, weight_names


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    folder, _ = trained("tiny_classifier", tmp_path_factory.mktemp("classifier"))
    return dew.load_run(folder)


@pytest.fixture(scope="module")
def language_model(tmp_path_factory):
    folder, _ = trained("tiny_lm", tmp_path_factory.mktemp("lm"))
    return dew.load_run(folder)


@pytest.fixture(scope="module")
def diffusion(tmp_path_factory):
    folder, _ = trained("tiny_diffusion", tmp_path_factory.mktemp("diffusion"))
    return dew.load_run(folder)


class _Nested(eqx.Module):
    layers: tuple
    table: dict
    scale: jax.Array


def test_weight_names_are_the_dotted_pytree_paths():
    key = jax.random.key(0)
    model = _Nested(
        layers=(eqx.nn.Linear(2, 3, key=key), eqx.nn.Linear(3, 1, use_bias=False, key=key)),
        table={"embed": eqx.nn.Embedding(4, 2, key=key)},
        scale=jax.numpy.ones(()),
    )
    params = eqx.filter(model, eqx.is_inexact_array)
    names = weight_names(params)
    assert list(names) == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "table.embed.weight",
        "scale",
    ]
    assert names["layers.1.weight"] is model.layers[1].weight
    with pytest.raises(ValueError, match=r"two arrays of the model are both named 'a\.b'"):
        weight_names({"a.b": np.zeros(1), "a": {"b": np.zeros(1)}})


_DTYPES = st.sampled_from(
    [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_]
)


@given(
    st.dictionaries(
        st.text("abcxyz._0123456789", min_size=1, max_size=12),
        _DTYPES.flatmap(lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_side=4))),
        max_size=5,
    )
)
def test_safetensors_bytes_read_back_by_the_safetensors_package_and_by_dew(
    tmp_path_factory, arrays
):
    from safetensors.numpy import load

    data = safetensors_bytes(arrays, {"step": "3"})
    path = tmp_path_factory.mktemp("bytes") / "model.safetensors"
    path.write_bytes(data)
    for read in (load(data), read_safetensors(path)):
        assert list(read) == list(arrays) or sorted(read) == sorted(arrays)
        for name, array in arrays.items():
            assert read[name].dtype == array.dtype and read[name].shape == array.shape
            np.testing.assert_array_equal(read[name], array)
    assert (len(data) - 8 - sum(array.nbytes for array in arrays.values())) % 8 == 0


def test_safetensors_bytes_hold_bfloat16_float8_and_strided_arrays_as_they_are(tmp_path):
    grid = np.arange(12, dtype=np.float32).reshape(3, 4)
    arrays = {
        "bf16": np.array([1.0, -3.5, 0.0078125], ml_dtypes.bfloat16),
        "f8_e4m3": np.array([[0.5], [-448.0]], ml_dtypes.float8_e4m3fn),
        "f8_e5m2": np.array([57344.0, -0.25], ml_dtypes.float8_e5m2),
        "transposed": grid.T,  # not C-ordered: written as the array it is, not its buffer
        "scalar": np.array(2.5, np.float32),
    }
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(arrays, {}))
    read = read_safetensors(path)
    for name, array in arrays.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape
        assert read[name].tobytes() == np.ascontiguousarray(array).tobytes()
    with pytest.raises(ValueError, match=r'the safetensors package cannot write .*"int4"'):
        safetensors_bytes({"w": np.zeros(2, ml_dtypes.int4)}, {})


_WITHOUT_DEW = """
import sys
sys.modules["dew"] = None  # `import dew` fails from here on
try:
    import dew
except ImportError:
    pass
else:
    raise SystemExit("dew was importable")
"""


def _without_dew(code, tmp_path):
    """Run `code` in a fresh Python where `import dew` fails; its standard output."""
    script = tmp_path / "reader.py"
    script.write_text(_WITHOUT_DEW + textwrap.dedent(code))
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    environment.pop("PYTHONPATH", None)  # nor may it find this checkout's src
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=environment, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow  # a trained run and a subprocess: about 20 s
def test_safetensors_holds_every_parameter_by_its_name_for_a_reader_without_dew(
    classifier, tmp_path
):
    record = export_run(classifier, "safetensors", tmp_path / "out")
    _without_dew(
        f"""
        import json
        import numpy as np
        from safetensors.numpy import load_file
        arrays = load_file({str(tmp_path / "out" / "model.safetensors")!r})
        np.savez({str(tmp_path / "read.npz")!r}, **arrays)
        print(json.dumps(list(arrays)))
        """,
        tmp_path,
    )
    expected = weight_names(classifier.params)
    with np.load(tmp_path / "read.npz") as read:
        assert sorted(read.files) == sorted(expected)
        for name, leaf in expected.items():
            assert read[name].dtype == np.asarray(leaf).dtype
            np.testing.assert_array_equal(read[name], np.asarray(leaf))
    assert "head.weight" in expected and "encoder.blocks.0.attention.qkv.weight" in expected
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model"] == classifier.config.to_dict()["model"]
    assert (config["step"], config["weights"], config["dew_version"]) == (
        2,
        "live",
        dew.__version__,
    )
    assert config["classes"] == ["square", "disc", "bar"]
    assert record["parity"] == {"max_abs_difference": 0.0, "on": "validation", "rows": 6}
    assert json.loads((classifier.folder / "exports.json").read_text())[-1] == record


@pytest.mark.slow  # a trained run and a subprocess: about 30 s
def test_stablehlo_runs_without_dew_at_two_batch_sizes_as_dews_model(classifier, tmp_path):
    record = export_run(classifier, "stablehlo", tmp_path / "out")
    rows = np.asarray(example_batch(classifier)[1]["images"])
    np.savez(tmp_path / "inputs.npz", three=rows[:3], five=np.concatenate([rows, rows])[:5])
    _without_dew(
        f"""
        import jax, numpy as np
        from jax import export
        with open({str(tmp_path / "out" / "model.exported")!r}, "rb") as file:
            exported = export.deserialize(bytearray(file.read()))
        inputs = np.load({str(tmp_path / "inputs.npz")!r})
        outputs = {{name: np.asarray(exported.call(inputs[name])) for name in inputs.files}}
        np.savez({str(tmp_path / "outputs.npz")!r}, **outputs)
        """,
        tmp_path,
    )
    with np.load(tmp_path / "outputs.npz") as outputs, np.load(tmp_path / "inputs.npz") as inputs:
        for name in ("three", "five"):
            expected = np.asarray(jax.vmap(classifier.model)(inputs[name]))
            assert outputs[name].shape == expected.shape == (len(inputs[name]), 3)
            np.testing.assert_allclose(outputs[name], expected, rtol=0, atol=1e-6)
    signature = json.loads((tmp_path / "out" / "signature.json").read_text())
    assert signature["inputs"] == [
        {"name": "images", "shape": ["b", 16, 16, 3], "dtype": "float32"}
    ]
    assert signature["outputs"] == [{"name": "logits", "shape": ["b", 3], "dtype": "float32"}]
    assert (signature["step"], signature["weights"]) == (2, "live")
    assert record["parity"]["max_abs_difference"] <= 1e-6 and record["parity"]["rows"] == 6


@pytest.mark.slow  # two trained runs: about 40 s
@pytest.mark.parametrize("run", ["language_model", "diffusion"])
def test_stablehlo_of_a_language_and_a_diffusion_model_matches_dews(run, request, tmp_path):
    loaded = request.getfixturevalue(run)
    record = export_run(loaded, "stablehlo", tmp_path / "out")
    exported = jax.export.deserialize(bytearray((tmp_path / "out" / "model.exported").read_bytes()))
    function = forward(loaded, example_batch(loaded)[1])
    for rows in (2, 5):
        inputs = [np.concatenate([value] * 5)[:rows] for value in function.inputs]
        expected = np.asarray(function.function(loaded.model, *inputs))
        np.testing.assert_allclose(np.asarray(exported.call(*inputs)), expected, atol=1e-5)
    signature = json.loads((tmp_path / "out" / "signature.json").read_text())
    shapes = [entry["shape"] for entry in signature["inputs"]]
    if run == "language_model":
        assert shapes == [["b", 32]] and signature["outputs"][0]["shape"] == ["b", 32, 16]
        assert record["weights"] == "live"
    else:  # the images, the time and the class label of each row; the EMA weights
        assert shapes == [["b", 16, 16, 3], ["b"], ["b"]]
        assert record["weights"] == "ema" and loaded.weights == "ema"
    assert record["parity"]["max_abs_difference"] <= 1e-5


def test_an_unknown_format_or_an_earlier_export_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(
        ValueError, match=r"^--format must be one of safetensors, stablehlo, got 'onnx'"
    ):
        export_run(tmp_path / "run", "onnx", tmp_path / "out")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"already holds config\.json: export to another folder"):
        export_run(tmp_path / "run", "safetensors", tmp_path / "out")
    assert FORMATS == ("safetensors", "stablehlo")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


@pytest.mark.slow  # the command on a trained run: about 25 s
def test_dew_export_writes_both_formats_and_says_where(classifier, tmp_path, capsys):
    folder = classifier.folder
    for format in FORMATS:
        out = tmp_path / format
        assert main(["export", str(folder), "--format", format, "--out", str(out)]) == 0
        printed = capsys.readouterr().out.splitlines()
        assert printed[0].startswith(f"exported step 2 (live weights) of {folder} as {format}: ")
        assert printed[1].startswith("  parity on 6 rows of the run's data: max abs difference ")
    code = main(
        ["export", str(folder), "--format", "stablehlo", "--out", str(tmp_path / "stablehlo")]
    )
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1
    assert "already holds model.exported, signature.json" in error
    assert main(["export", str(tmp_path / "none"), "--format", "safetensors", "--out", "x"]) == 2
    assert capsys.readouterr().err == f"dew export: no run folder at {tmp_path / 'none'}.\n"
    with pytest.raises(SystemExit) as leaving:
        main(["export", str(folder), "--format", "onnx", "--out", str(tmp_path)])
    assert leaving.value.code == 2
    assert "invalid choice: 'onnx'" in capsys.readouterr().err


@pytest.mark.slow  # a trained run: about 15 s
def test_an_objective_without_a_forward_function_exports_its_parameters_alone(classifier, tmp_path):
    """DPO (and GRPO) train a policy whose forward function `forward` does not choose
    inputs for: its StableHLO export is refused naming what is exported, its safetensors
    export measures parity on the parameters."""
    from dew.nn.backbones.causal_transformer import CausalTransformer
    from dew.objectives.dpo import DPOObjective

    policy = CausalTransformer(4, 16, 1, 2, 32, 8, key=jax.random.key(0))
    loaded = dataclasses.replace(classifier, objective=DPOObjective(policy, policy, beta=0.1))
    with pytest.raises(ValueError, match="trained a DPOObjective \\(export its parameters as"):
        export_run(loaded, "stablehlo", tmp_path / "hlo")
    assert not (tmp_path / "hlo").exists()
    record = export_run(loaded, "safetensors", tmp_path / "st")
    assert record["parity"] == {"max_abs_difference": 0.0, "on": "parameters", "rows": 0}
