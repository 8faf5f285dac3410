"""dew.telemetry.records: frozen records with a stable JSON form that round-trips."""

import dataclasses
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from _checks import rejects
from hypothesis import given
from hypothesis import strategies as st

from dew.telemetry.records import (
    CheckpointRequested,
    FitEnded,
    FitStarted,
    ProfileWindow,
    RunRecord,
    SamplingProtocol,
    TrialFinished,
    package_versions,
    record_from_dict,
    record_from_json,
)

RESERVED = {"NaN", "+Inf", "-Inf"}
texts = st.text(max_size=8).filter(lambda text: text not in RESERVED)
floats = st.floats(allow_nan=True, allow_infinity=True)
leaves = st.one_of(st.none(), st.booleans(), st.integers(), floats, texts)
json_values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(texts, children, max_size=3)
    ),
    max_leaves=12,
)
mappings = st.dictionaries(texts, json_values, max_size=4)
steps = st.integers(0, 2**40)

records = st.one_of(
    st.builds(
        RunRecord,
        model=mappings,
        data=mappings,
        optim=mappings,
        trainer=mappings,
        packages=st.dictionaries(texts, texts, max_size=3),
    ),
    st.builds(FitStarted, stage=texts, start_step=steps, steps=steps),
    st.builds(CheckpointRequested, step=steps, directory=texts),
    st.builds(ProfileWindow, directory=texts, traced_steps=steps, start_step=steps),
    st.builds(
        FitEnded,
        status=st.sampled_from(["completed", "failed", "interrupted"]),
        step=steps,
        error=st.none() | texts,
    ),
    st.builds(TrialFinished, trial=steps, overrides=mappings, value=floats),
    st.builds(
        SamplingProtocol,
        objective=texts,
        solver=texts,
        steps=steps,
        guidance=st.none() | floats,
        seed_domain=st.none() | steps,
        conditioning=st.sampled_from(["class_labels", "unconditional"]),
        generated_rows=steps,
        real_rows=steps,
        event_key=st.none() | texts,
        conditioning_sha256=st.none() | st.text("0123456789abcdef", min_size=64, max_size=64),
        features=st.dictionaries(texts, mappings, max_size=2),
    ),
)


def _same(left, right):
    """Equality that treats NaN as equal to NaN, at any depth."""
    if isinstance(left, float) and isinstance(right, float):
        return (math.isnan(left) and math.isnan(right)) or left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return type(left) is type(right) and left == right


@given(records)
def test_json_round_trip_is_exact(record):
    text = record.to_json()
    back = record_from_json(text)
    assert type(back) is type(record)
    for field in dataclasses.fields(record):
        assert _same(getattr(back, field.name), getattr(record, field.name)), field.name
    assert back.to_json() == text


@given(records)
def test_json_form_is_strict_json(record):
    text = record.to_json()
    json.loads(text, parse_constant=lambda constant: pytest.fail(f"non-standard {constant}"))
    assert json.loads(text)["type"] == record.type


def test_non_finite_floats_are_written_as_strings():
    record = TrialFinished(trial=0, overrides={"x": [float("-inf")]}, value=float("nan"))
    data = json.loads(record.to_json())
    assert data == {
        "type": "trial_finished",
        "trial": 0,
        "overrides": {"x": ["-Inf"]},
        "value": "NaN",
    }
    back = record_from_json(record.to_json())
    assert math.isnan(back.value) and back.overrides == {"x": [-math.inf]}
    perfect = TrialFinished(trial=1, overrides={}, value=float("inf"))
    assert json.loads(perfect.to_json())["value"] == "+Inf"
    assert record_from_json(perfect.to_json()).value == math.inf


def test_the_json_form_is_stable():
    record = FitEnded(status="failed", step=12, error="ValueError: boom")
    assert record.to_json() == (
        '{"error": "ValueError: boom", "status": "failed", "step": 12, "type": "fit_ended"}'
    )


def test_records_are_frozen():
    record = FitStarted(stage="lm", start_step=0, steps=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.steps = 3


def test_values_are_normalised_to_json_types():
    record = TrialFinished(
        trial=2,
        overrides={"lr": np.float32(0.5), "shape": (1, 2), "x": jnp.asarray(3), "n": np.int64(4)},
        value=np.float64(1.25),
    )
    assert record.trial == 2 and type(record.trial) is int
    assert record.overrides == {"lr": 0.5, "shape": [1, 2], "x": 3, "n": 4}
    assert type(record.overrides["n"]) is int
    assert type(record.overrides["lr"]) is float
    assert type(record.value) is float
    assert record_from_json(record.to_json()) == record


def test_run_record_holds_package_versions():
    record = RunRecord(model={"name": "linear"}, data={}, optim={"name": "sgd"})
    assert "jax" in record.packages and "numpy" in record.packages
    assert record.packages == package_versions()
    assert record_from_json(record.to_json()) == record


@pytest.mark.parametrize(
    ("build", "error", "message", "parameter"),
    [
        (
            lambda: FitEnded(status="done", step=1),
            ValueError,
            "FitEnded.status 'done' is not one of 'completed', 'failed', 'interrupted'",
            "status",
        ),
        (
            lambda: FitEnded(status="completed", step=-1),
            ValueError,
            "FitEnded.step must be an integer >= 0",
            "step",
        ),
        (
            lambda: FitStarted(stage="lm", start_step=0.5, steps=1),
            TypeError,
            "FitStarted.start_step must be an integer >= 0, got 0.5",
            "start_step",
        ),
        (
            lambda: TrialFinished(trial=0, overrides={}, value="high"),
            TypeError,
            "TrialFinished.value must be a real number, got 'high'",
            "value",
        ),
        (
            lambda: TrialFinished(trial=0, overrides={"x": "NaN"}, value=1.0),
            ValueError,
            r"trial_finished.overrides\['x'\] is the string 'NaN', which record JSON reserves",
            "overrides",
        ),
        (
            lambda: TrialFinished(trial=0, overrides={1: 2}, value=1.0),
            TypeError,
            "trial_finished.overrides has key 1; record mapping keys must be strings",
            "overrides",
        ),
        (
            lambda: RunRecord(model={"f": object()}, data={}, optim={}),
            TypeError,
            r"run_record.model\['f'\] is <object object at .*> of type object",
            "model",
        ),
        (
            lambda: ProfileWindow(directory="p", traced_steps=-2),
            ValueError,
            "ProfileWindow.traced_steps must be an integer >= 0, got -2",
            "traced_steps",
        ),
    ],
)
def test_bad_record_values_raise_naming_the_field(build, error, message, parameter):
    with rejects(error, message, parameter=parameter):
        build()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"step": 1}, "a record mapping needs a 'type' key"),
        ({"type": "fit_exploded"}, "unknown record type 'fit_exploded'; known types are"),
        (
            {"type": "fit_ended", "status": "completed", "step": 1, "colour": "red"},
            r"'fit_ended' record has unknown fields \['colour'\]",
        ),
    ],
)
def test_bad_record_mappings_raise(data, message):
    with pytest.raises(ValueError, match=message):
        record_from_dict(data)


def test_from_dict_checks_the_class():
    with pytest.raises(TypeError, match="expected a 'fit_started' record, got 'fit_ended'"):
        FitStarted.from_dict(FitEnded(status="completed", step=0).to_dict())
    record = FitStarted(stage="lm", start_step=0, steps=5)
    assert FitStarted.from_dict(record.to_dict()) == record


def test_encoding_turns_array_scalars_into_numbers_and_non_finite_into_strings():
    from dew.telemetry.records import encode_json_value

    value = {"a": np.float32("nan"), "b": (np.int64(2), jnp.asarray(-np.inf)), "c": np.bool_(1)}
    assert encode_json_value(value) == {"a": "NaN", "b": [2, "-Inf"], "c": True}
    assert json.dumps(encode_json_value(value), allow_nan=False)


array_leaves = st.one_of(
    leaves,
    floats.map(np.float64),
    st.integers(-(2**62), 2**62).map(np.int64),
    st.booleans().map(np.bool_),
)
array_values = st.recursive(
    array_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(texts, children, max_size=3),
    ),
    max_leaves=12,
)


@given(array_values)
def test_the_json_normaliser_round_trips_through_strict_json(value):
    from dew import _json

    plain = _json.plain(value, "value")
    text = json.dumps(_json.encode(value, "value"), allow_nan=False)
    assert _same(_json.decode(json.loads(text)), plain)
    assert _same(_json.plain(plain, "value"), plain)  # normalising twice changes nothing


def test_a_file_that_is_not_json_is_named_in_the_error(tmp_path):
    from dew import _json

    path = tmp_path / "thing.json"
    path.write_bytes(b'{"a": ')
    with pytest.raises(ValueError, match=r"thing\.json is not valid JSON: Expecting value"):
        _json.read_json(path)
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"thing\.json is not valid JSON \(the file is empty\)"):
        _json.read_json(path)
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match=r"thing\.json is not valid JSON: it is not UTF-8"):
        _json.read_json(path)
    _json.write_atomic(path, '{"a": 1}\n')
    assert _json.read_json(path) == {"a": 1}
    assert [child.name for child in tmp_path.iterdir()] == ["thing.json"]


def _protocol(**changes):
    fields = {
        "objective": "diffusion",
        "solver": "euler",
        "steps": 20,
        "guidance": 2.0,
        "seed_domain": 0,
        "conditioning": "class_labels",
    }
    return SamplingProtocol(**{**fields, **changes})


def test_sampling_protocol_checks_its_fields():
    record = _protocol()
    assert record.guidance == 2.0 and isinstance(record.guidance, float)
    assert (record.generated_rows, record.real_rows, record.event_key) == (0, 0, None)
    with pytest.raises(ValueError, match="conditioning 'text' is not one of 'class_labels'"):
        _protocol(conditioning="text")
    with rejects(
        ValueError,
        r"SamplingProtocol.real_rows must be an integer >= 0, got -1",
        parameter="real_rows",
    ):
        _protocol(real_rows=-1)
    with rejects(
        TypeError,
        r"SamplingProtocol.guidance must be a real number or None, got 'x'",
        parameter="guidance",
    ):
        _protocol(guidance="x")
    with rejects(
        ValueError,
        r"SamplingProtocol.conditioning_sha256 must be None or a SHA-256 digest \(64 "
        r"lowercase hex digits\), got 'ABC'",
        parameter="conditioning_sha256",
    ):
        _protocol(conditioning_sha256="ABC")


def test_a_sampling_protocol_without_guidance_or_seed_domain_round_trips():
    record = _protocol(
        solver="ancestral",
        guidance=None,
        seed_domain=None,
        conditioning="unconditional",
        features={"fid": {"network": "n", "weights_sha256": None, "reference_rows": None}},
    )
    assert record_from_json(record.to_json()) == record
    assert (record.guidance, record.seed_domain, record.conditioning_sha256) == (None, None, None)


def test_a_sampling_protocol_written_before_its_features_reads_back():
    """Journals from before the record carried features and the conditioning identity."""
    old = {
        "type": "sampling_protocol",
        "objective": "diffusion",
        "solver": "euler",
        "steps": 20,
        "guidance": 1.0,
        "seed_domain": 0,
        "conditioning": "class_labels",
        "generated_rows": 7,
        "real_rows": 7,
        "event_key": "daab523126eb753c",
    }
    record = record_from_dict(old)
    assert record.features == {} and record.conditioning_sha256 is None
