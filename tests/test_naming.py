"""dew.naming: tags and parameter paths, their errors and their round trips."""

import string

import pytest
from _checks import rejects
from hypothesis import given
from hypothesis import strategies as st

from dew.naming import (
    ArtifactKind,
    ArtifactTag,
    MetricTag,
    PreviewName,
    Split,
    artifact_tag,
    bare_metric_name,
    check_metric_name,
    check_path_segment,
    flatten_parameters,
    metric_tag,
    metric_tag_pattern,
    parse_artifact_tag,
    parse_metric_tag,
    parse_parameter_path,
    parse_preview_name,
    preview_name,
)

segments = st.text(min_size=1, max_size=12).filter(lambda text: "/" not in text)
splits = st.sampled_from(list(Split))
bad_segments = st.one_of(
    st.just(""),
    st.tuples(st.text(max_size=5), st.text(max_size=5)).map(lambda parts: f"{parts[0]}/{parts[1]}"),
)


def test_split_is_a_string_enum():
    assert Split.TRAIN == "train"
    assert Split.VALIDATION == "validation"
    assert str(Split.VALIDATION) == "validation"
    assert repr(Split.VALIDATION) == "<Split.VALIDATION: 'validation'>"


def test_metric_tag_examples_of_the_naming_scheme():
    tag = metric_tag("mean", Split.VALIDATION, "loss")
    assert tag == "mean/validation/loss"
    assert repr(parse_metric_tag(tag)) == (
        "MetricTag(stage='mean', split=<Split.VALIDATION: 'validation'>, metric='loss')"
    )
    assert metric_tag("lm", "train", "perplexity") == "lm/train/perplexity"


def test_metric_with_separator_message_is_exact():
    with pytest.raises(ValueError, match=r"^metric 'nll/sum' may not contain '/'.$"):
        metric_tag("mean", Split.TRAIN, "nll/sum")


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (("a/b", Split.TRAIN, "loss"), "^stage 'a/b' may not contain '/'.$"),
        (("", Split.TRAIN, "loss"), "^stage may not be empty.$"),
        (("lm", Split.TRAIN, ""), "^metric may not be empty.$"),
        (("lm", "test", "loss"), "^split 'test' is not one of 'train', 'validation'.$"),
        (("lm", "", "loss"), "^split '' is not one of 'train', 'validation'.$"),
    ],
)
def test_metric_tag_rejects_bad_segments(parts, message):
    with pytest.raises(ValueError, match=message):
        metric_tag(*parts)


def test_metric_tag_rejects_non_strings():
    with rejects(TypeError, "stage must be a string, got 3 of type int", parameter="stage"):
        metric_tag(3, Split.TRAIN, "loss")
    with rejects(TypeError, "metric must be a string", parameter="metric"):
        metric_tag("lm", Split.TRAIN, None)


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("lm/loss", "must have three segments stage/split/metric, got 2"),
        ("a/train/b/c", "must have three segments stage/split/metric, got 4"),
        ("loss", "got 1"),
        ("/train/loss", "has an empty stage segment"),
        ("lm//loss", "has an empty split segment"),
        ("lm/train/", "has an empty metric segment"),
        ("lm/test/loss", "split 'test' is not one of 'train', 'validation'"),
    ],
)
def test_parse_metric_tag_rejects_malformed_tags(tag, message):
    with pytest.raises(ValueError, match=message):
        parse_metric_tag(tag)


@given(stage=segments, split=splits, metric=segments)
def test_parse_inverts_metric_tag(stage, split, metric):
    parsed = parse_metric_tag(metric_tag(stage, split, metric))
    assert parsed == (stage, split, metric)
    assert isinstance(parsed, MetricTag)
    assert parsed.split is split


@given(stage=segments, split=splits, metric=segments)
def test_metric_tag_inverts_parse(stage, split, metric):
    tag = metric_tag(stage, split, metric)
    assert metric_tag(*parse_metric_tag(tag)) == tag


@given(
    parts=st.tuples(segments, splits, segments),
    position=st.sampled_from([0, 2]),
    bad=bad_segments,
)
def test_every_invalid_segment_raises(parts, position, bad):
    parts = list(parts)
    parts[position] = bad
    with pytest.raises(ValueError, match="may not"):
        metric_tag(*parts)


@given(stage=segments, metric=segments, split=st.text(max_size=12))
def test_every_invalid_split_raises(stage, metric, split):
    if split in {"train", "validation"}:
        assert metric_tag(stage, split, metric).split("/")[1] == split
    else:
        with pytest.raises(ValueError, match="is not one of 'train', 'validation'"):
            metric_tag(stage, split, metric)


@given(st.text(max_size=30))
def test_parse_accepts_exactly_what_metric_tag_builds(text):
    try:
        parsed = parse_metric_tag(text)
    except ValueError:
        return
    assert metric_tag(*parsed) == text


def _is_path_segment(text):
    try:
        check_path_segment("segment", text)
    except ValueError:
        return False
    return True


path_segments = st.text(min_size=1, max_size=12).filter(_is_path_segment)
preview_names = st.builds(preview_name, path_segments, splits, path_segments)
artifact_parts = st.one_of(
    st.tuples(st.just(ArtifactKind.PREVIEW), preview_names, path_segments),
    st.tuples(st.sampled_from([ArtifactKind.RECORD, ArtifactKind.VALUE]), path_segments, st.none()),
)


def test_preview_names_of_the_naming_scheme():
    assert preview_name("diffusion", Split.VALIDATION, "samples") == "diffusion/validation/samples"
    assert parse_preview_name("lm/train/samples") == PreviewName("lm", Split.TRAIN, "samples")
    with pytest.raises(ValueError, match=r"got 'samples': build it with dew\.naming\.preview"):
        parse_preview_name("samples")
    with pytest.raises(ValueError, match="split 'val' is not one of 'train', 'validation'"):
        parse_preview_name("lm/val/samples")
    with pytest.raises(ValueError, match=r"stage '\.\.' may not be '\.' or '\.\.'"):
        preview_name("..", Split.VALIDATION, "samples")
    with pytest.raises(ValueError, match=r"preview name 'a\\\\b' may not contain a backslash"):
        preview_name("lm", Split.VALIDATION, "a\\b")


@given(stage=path_segments, split=splits, name=path_segments)
def test_parse_preview_name_inverts_preview_name(stage, split, name):
    built = preview_name(stage, split, name)
    assert parse_preview_name(built) == (stage, split, name)
    assert preview_name(*parse_preview_name(built)) == built


@given(st.text(max_size=30))
def test_parse_preview_name_accepts_exactly_what_preview_name_builds(text):
    try:
        parsed = parse_preview_name(text)
    except ValueError:
        return
    assert preview_name(*parsed) == text


def test_artifact_tags_of_the_naming_scheme():
    samples = preview_name("lm", Split.VALIDATION, "samples")
    assert artifact_tag(ArtifactKind.PREVIEW, samples, "0") == "lm/validation/samples/0"
    assert artifact_tag("preview", "jepa/validation/x", "spread") == "jepa/validation/x/spread"
    assert artifact_tag(ArtifactKind.RECORD, "fit_ended") == "reporting/fit_ended"
    assert artifact_tag(ArtifactKind.VALUE, "notes") == "artifacts/notes"
    assert parse_artifact_tag("reporting/fit_ended") == ArtifactTag(
        ArtifactKind.RECORD, "fit_ended"
    )
    assert parse_artifact_tag("reporting/validation/samples/0") == ArtifactTag(
        ArtifactKind.PREVIEW, "reporting/validation/samples", "0"
    )  # a stage named like a kind: the segment count tells


def test_two_stages_previews_never_share_a_tag():
    tags = {
        artifact_tag(ArtifactKind.PREVIEW, preview_name(stage, Split.VALIDATION, "samples"), "0")
        for stage in ("pretrain", "finetune")
    }
    assert tags == {"pretrain/validation/samples/0", "finetune/validation/samples/0"}


@pytest.mark.parametrize(
    ("parts", "error", "message"),
    [
        (("validation", "samples", "0"), ValueError, "artifact kind 'validation' must be one of"),
        ((ArtifactKind.PREVIEW, "lm/validation/samples"), ValueError, "a preview's artifact tag"),
        ((ArtifactKind.PREVIEW, "samples", "0"), ValueError, "a preview's name is stage/split"),
        ((ArtifactKind.RECORD, "fit_ended", "0"), ValueError, "a record's artifact tag has no"),
        ((ArtifactKind.VALUE, "a/b"), ValueError, "artifact name 'a/b' may not contain '/'"),
        ((ArtifactKind.RECORD, ".."), ValueError, r"record type '\.\.' may not be"),
        ((ArtifactKind.PREVIEW, "s/train/x", ""), ValueError, "preview part may not be empty"),
    ],
)
def test_artifact_tag_rejects_bad_parts(parts, error, message):
    with pytest.raises(error, match=message):
        artifact_tag(*parts)


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("validation/samples/0", "must be stage/split/name/part .a preview.*got 3 segments"),
        ("lm/validation/samples/0/1", "got 5 segments"),
        ("reporting/fit_ended/0", "got 3 segments"),
        ("artifacts", "got 1 segments"),
        ("preview/samples", "got 2 segments"),
        ("lm/train", "artifact kind 'lm' must be one of"),
        ("lm/val/samples/0", "split 'val' is not one of"),
        ("artifacts/", "artifact name may not be empty"),
    ],
)
def test_parse_artifact_tag_rejects_malformed_tags(tag, message):
    with pytest.raises(ValueError, match=message):
        parse_artifact_tag(tag)


@given(artifact_parts)
def test_parse_inverts_artifact_tag(parts):
    assert parse_artifact_tag(artifact_tag(*parts)) == parts


tag_like = st.lists(
    st.one_of(
        st.sampled_from(
            ["validation", "train", "preview", "reporting", "artifacts", "", ".", "..", " ", "a\\b"]
        ),
        path_segments,
    ),
    min_size=1,
    max_size=5,
).map("/".join)


@given(tag_like)
def test_artifact_tag_inverts_parse_and_parse_accepts_exactly_what_it_builds(text):
    try:
        parsed = parse_artifact_tag(text)
    except ValueError:
        return
    assert artifact_tag(*parsed) == text


def test_a_metric_tags_bare_name_series_and_pattern():
    assert bare_metric_name("lm/validation/perplexity") == "perplexity"
    assert bare_metric_name("loss") == "loss"
    with pytest.raises(ValueError, match="must have three segments"):
        bare_metric_name("validation/loss")
    assert parse_metric_tag("lm/train/loss").series == "lm/train"
    assert metric_tag_pattern("a.b", [Split.VALIDATION, "train"], "x+y") == (
        r"^a\.b/(train|validation)/x\+y$"
    )
    with pytest.raises(ValueError, match="split 'val' is not one of"):
        metric_tag_pattern("lm", ["val"], "loss")


@given(stage=segments, split=splits, metric=segments, other=segments)
def test_a_metric_tag_pattern_matches_exactly_its_tags(stage, split, metric, other):
    import re

    pattern = re.compile(metric_tag_pattern(stage, [split], metric))
    assert pattern.fullmatch(metric_tag(stage, split, metric))
    for tag in (metric_tag(stage, split, metric + other), metric_tag(other + stage, split, metric)):
        assert not pattern.fullmatch(tag)


def test_check_metric_name():
    assert check_metric_name("point_crps") == "point_crps"
    with pytest.raises(ValueError, match=r"^metric 'a/b' may not contain '/'.$"):
        check_metric_name("a/b")


def test_flatten_parameters_example_of_the_naming_scheme():
    parameters = {
        "optimizer": {"name": "adam", "learning_rate": 1e-3},
        "data": {
            "train": {"samples": 256, "batch_size": 32},
            "validation": {"samples": 64, "batch_size": 64},
        },
    }
    assert list(flatten_parameters(parameters).items()) == [
        ("optimizer/name", "adam"),
        ("optimizer/learning_rate", 0.001),
        ("data/train/samples", 256),
        ("data/train/batch_size", 32),
        ("data/validation/samples", 64),
        ("data/validation/batch_size", 64),
    ]


def test_flatten_parameters_keeps_sequences_as_leaves():
    assert flatten_parameters({"shape": (1, 2), "layers": [3, 4]}) == {
        "shape": (1, 2),
        "layers": [3, 4],
    }


@pytest.mark.parametrize(
    ("parameters", "error", "message"),
    [
        ({"": 1}, ValueError, "^parameter key may not be empty.$"),
        ({"a/b": 1}, ValueError, "^parameter key 'a/b' may not contain '/'.$"),
        ({"data": {"train/x": 1}}, ValueError, "^parameter key 'train/x' under 'data' may not"),
        ({"data": {"train": {"": 1}}}, ValueError, "^parameter key under 'data/train' may not be"),
        ({"data": {3: 1}}, TypeError, "^parameter key 3 under 'data' must be a string, got int"),
    ],
)
def test_flatten_parameters_rejects_bad_keys(parameters, error, message):
    with pytest.raises(error, match=message):
        flatten_parameters(parameters)


def test_flatten_parameters_rejects_non_mappings():
    with rejects(TypeError, "parameters must be a mapping, got", parameter="values"):
        flatten_parameters([("a", 1)])


keys = st.text(alphabet=string.ascii_letters + "_/", max_size=4)
nested = st.recursive(
    st.integers(),
    lambda children: st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)


def _key_paths(values, prefix=()):
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _key_paths(value, (*prefix, key))
        else:
            yield (*prefix, key), value


@given(st.dictionaries(keys, nested, max_size=5))
def test_flatten_parameters_never_merges_two_key_paths(parameters):
    paths = list(_key_paths(parameters))
    if any(key == "" or "/" in key for path, _ in paths for key in path) or any(
        key == "" or "/" in key for key in _all_keys(parameters)
    ):
        with pytest.raises(ValueError, match="parameter key"):
            flatten_parameters(parameters)
        return
    flat = flatten_parameters(parameters)
    assert len(flat) == len(paths)
    assert flat == {"/".join(path): value for path, value in paths}
    assert {parse_parameter_path(path) for path in flat} == {path for path, _ in paths}


def test_parse_parameter_path_refuses_empty_keys():
    assert parse_parameter_path("seed") == ("seed",)
    with pytest.raises(ValueError, match="parameter path 'a//b' has an empty key"):
        parse_parameter_path("a//b")


def _all_keys(values):
    for key, value in values.items():
        yield key
        if isinstance(value, dict):
            yield from _all_keys(value)
