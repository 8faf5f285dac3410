"""dew._json: what dew reads back is held to the depth it writes, and a document nested past it is
one `ValueError` naming the file, never a `RecursionError`."""

import json

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from dew._json import MAX_DEPTH, VALUE_DEPTH, check_depth, loads, plain, read_json
from dew.config._toml import loads_toml, read_toml
from dew.telemetry.records import RunRecord, record_from_json


def _nested(depth: int, leaf=1):
    """`leaf` inside `depth` lists and mappings, alternating (a list outermost)."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 == 0 else {"k": value}
    return value


def _reference_depth(value) -> int:
    """How deep `value` nests, counted recursively (the tests keep it shallow enough)."""
    if isinstance(value, dict):
        return 1 + max(map(_reference_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_reference_depth, value), default=0)
    return 0


@pytest.mark.parametrize("brackets", ["[", '{"a": '])
def test_a_document_nested_100000_deep_is_one_error_naming_the_file(tmp_path, brackets):
    path = tmp_path / "deep.json"
    path.write_text(brackets * 100_000)
    with pytest.raises(ValueError, match="it nests") as caught:
        read_json(path, "run.json")
    message = str(caught.value)
    assert message == (
        f"{path} is not valid run.json: it nests lists and mappings more than {MAX_DEPTH} deep, "
        "past dew's limit."
    )
    assert "\n" not in message
    with pytest.raises(RecursionError):  # what json alone does with it: the test can fail
        json.loads(path.read_text())


@given(depth=st.integers(0, 2 * MAX_DEPTH), shape=st.sampled_from(["list", "mixed"]))
@settings(max_examples=60)
def test_documents_read_back_exactly_up_to_the_limit_and_none_past_it(depth, shape):
    value = _nested(depth) if shape == "mixed" else json.loads("[" * depth + "]" * depth or "1")
    text = json.dumps(value)
    assert _reference_depth(value) == depth
    if depth <= MAX_DEPTH:
        assert loads(text, "line 1") == json.loads(text)
        assert check_depth(value, "the value") is value
    else:
        with pytest.raises(
            ValueError, match=rf"^line 1 is not valid JSON: it nests .* {MAX_DEPTH}"
        ):
            loads(text, "line 1")


def test_what_dew_writes_it_reads_back_and_it_writes_nothing_deeper():
    deepest = _nested(VALUE_DEPTH)
    assert plain(deepest, "the artifact") == deepest
    record = RunRecord(
        model={"name": "m", "kwargs": {"layers": _nested(VALUE_DEPTH - 3)}}, data={}, optim={}
    )
    assert record_from_json(record.to_json()) == record  # read back with its wrapping levels
    with pytest.raises(ValueError, match=rf"^the artifact nests .* more than {VALUE_DEPTH} deep"):
        plain(_nested(VALUE_DEPTH + 1), "the artifact")


def test_deep_toml_is_one_error_naming_the_file(tmp_path):
    for name, text in {
        "arrays": "a = " + "[" * 100_000,
        "tables": "a = " + "{b = " * 100_000,
        "headers": "[" + ".".join(["a"] * MAX_DEPTH) + "]\nx = 1\n",  # the root is one more
    }.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        with pytest.raises(ValueError, match=rf"^{path} is not valid TOML: it nests .*{MAX_DEPTH}"):
            read_toml(path)
    assert loads_toml("[" + ".".join(["a"] * (MAX_DEPTH - 1)) + "]\nx = 1\n", "t")["a"]["a"]
    (tmp_path / "latin.toml").write_bytes(b'a = "\xe9"\n')
    with pytest.raises(ValueError, match=r"latin\.toml is not valid TOML: it is not UTF-8"):
        read_toml(tmp_path / "latin.toml")


def test_an_integer_past_pythons_digit_limit_is_one_error_naming_the_file(tmp_path):
    json_path, toml_path = tmp_path / "big.json", tmp_path / "big.toml"
    json_path.write_text("1" * 5000)
    toml_path.write_text("a = " + "1" * 5000)
    with pytest.raises(ValueError, match=r"big\.json is not valid run\.json: Exceeds the limit"):
        read_json(json_path, "run.json")
    with pytest.raises(ValueError, match=r"big\.toml is not valid TOML: Exceeds the limit"):
        read_toml(toml_path)
