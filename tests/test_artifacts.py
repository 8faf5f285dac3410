"""Artifacts: construction, rows, concatenation, shape errors, and use as pytrees under jit."""

import dataclasses
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from _checks import rejects

from dew.artifacts import (
    Artifact,
    Clips,
    Images,
    RegressionScores,
    Representations,
    TokenRows,
    TokenScores,
    concatenate_rows,
)

RNG = np.random.default_rng(0)


def _floats(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.random(shape, dtype=np.float32))


def _bools(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.random(shape) < 0.5)


def _ints(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.integers(0, 50, shape).astype(np.int32))


def _token_scores(rows: int = 4) -> TokenScores:
    return TokenScores(_floats(rows, 6), _floats(rows, 6), _bools(rows, 6))


def _images(rows: int = 4) -> Images:
    prompts = tuple(f"prompt {i}" for i in range(rows))
    return Images(_floats(rows, 5, 5, 3), _floats(rows, 5, 5, 3), prompts, labels=_ints(rows))


def _clips(rows: int = 4) -> Clips:
    return Clips(_floats(rows, 2, 5, 5, 1), _floats(rows, 2, 5, 5, 1), labels=_ints(rows))


def _representations(rows: int = 4) -> Representations:
    return Representations(_floats(rows, 7), _ints(rows))


def _regression_scores(rows: int = 4) -> RegressionScores:
    return RegressionScores(
        _floats(rows), _floats(rows), _floats(rows, 2), _floats(rows, 2), _floats(rows, 2)
    )


def _token_rows(rows: int = 4) -> TokenRows:
    return TokenRows(_ints(rows, 9), _bools(rows, 9))


FULL_ARTIFACTS = {
    "TokenScores": _token_scores,
    "Images": _images,
    "Clips": _clips,
    "Representations": _representations,
    "TokenRows": _token_rows,
    "RegressionScores": _regression_scores,
}

MINIMAL_ARTIFACTS = {
    "TokenScores": lambda: TokenScores(_floats(3, 2), _floats(3, 2)),
    "Images": lambda: Images(_floats(3, 4, 4, 1)),
    "Clips": lambda: Clips(_floats(3, 1, 4, 4, 3)),
    "Representations": lambda: Representations(_floats(3, 2)),
    "TokenRows": lambda: TokenRows(_ints(3, 5)),
    "RegressionScores": lambda: RegressionScores(_floats(3), _floats(3)),
}


def _assert_same_artifact(actual: Artifact, expected: Artifact) -> None:
    assert type(actual) is type(expected)
    actual_leaves, actual_def = jax.tree.flatten(actual)
    expected_leaves, expected_def = jax.tree.flatten(expected)
    assert actual_def == expected_def
    for got, want in zip(actual_leaves, expected_leaves, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.fixture
def dew_checks_only(monkeypatch):
    """Switch off the test session's runtime type checker (jaxtyping + beartype), so the
    artifacts' own validation runs, as it does for a user without a type checker."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)


# Construction and rows.


@pytest.mark.parametrize("kind", list(FULL_ARTIFACTS))
@pytest.mark.parametrize("rows", [1, 4])
def test_artifact_with_all_fields_reports_its_row_count(kind, rows):
    artifact = FULL_ARTIFACTS[kind](rows)
    assert type(artifact).__name__ == kind
    assert isinstance(artifact, Artifact)
    assert artifact.num_rows == rows


@pytest.mark.parametrize("kind", list(MINIMAL_ARTIFACTS))
def test_artifact_without_optional_fields_is_valid(kind):
    artifact = MINIMAL_ARTIFACTS[kind]()
    assert artifact.num_rows == 3
    required = 2 if kind in ("TokenScores", "RegressionScores") else 1
    assert len(jax.tree.leaves(artifact)) == required


def test_optional_fields_default_to_none():
    assert TokenScores(_floats(1, 2), _floats(1, 2)).correct is None
    images = Images(_floats(1, 4, 4, 1))
    assert images.reference is None
    assert images.prompts is None
    assert Clips(_floats(1, 1, 4, 4, 1)).reference is None
    assert Representations(_floats(1, 2)).labels is None
    assert TokenRows(_ints(1, 2)).mask is None


def test_images_reference_may_have_other_rows_and_size_but_same_channels():
    images = Images(_floats(2, 8, 8, 3), _floats(5, 4, 4, 3))
    assert images.num_rows == 2


@pytest.mark.parametrize("kind", list(FULL_ARTIFACTS))
@pytest.mark.parametrize(("start", "stop"), [(0, 4), (1, 3), (3, 4), (2, 2)])
def test_rows_slices_every_row_field(kind, start, stop):
    artifact = FULL_ARTIFACTS[kind](4)
    part = artifact.rows(start, stop)
    assert type(part) is type(artifact)
    assert part.num_rows == stop - start
    for got, whole in zip(jax.tree.leaves(part), jax.tree.leaves(artifact), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(whole)[start:stop])


def test_images_rows_slices_prompts_with_their_rows():
    images = _images(4)
    part = images.rows(1, 3)
    assert part.prompts == ("prompt 1", "prompt 2")
    np.testing.assert_array_equal(np.asarray(part.reference), np.asarray(images.reference)[1:3])


def test_images_rows_without_reference_or_prompts_keeps_them_absent():
    part = Images(_floats(3, 4, 4, 1)).rows(0, 2)
    assert part.num_rows == 2
    assert part.reference is None
    assert part.prompts is None


# concatenate_rows.


@pytest.mark.parametrize("kind", list(FULL_ARTIFACTS))
def test_concatenating_row_slices_rebuilds_the_artifact(kind):
    artifact = FULL_ARTIFACTS[kind](4)
    parts = [artifact.rows(0, 1), artifact.rows(1, 3), artifact.rows(3, 4)]
    _assert_same_artifact(concatenate_rows(parts), artifact)


@pytest.mark.parametrize("kind", list(MINIMAL_ARTIFACTS))
def test_concatenate_rows_stacks_row_counts(kind):
    artifact = MINIMAL_ARTIFACTS[kind]()
    joined = concatenate_rows([artifact, artifact, artifact])
    assert type(joined) is type(artifact)
    assert joined.num_rows == 9
    for got, one in zip(jax.tree.leaves(joined), jax.tree.leaves(artifact), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.concatenate([np.asarray(one)] * 3))


def test_concatenate_rows_of_one_artifact_is_that_artifact():
    artifact = _token_scores(3)
    _assert_same_artifact(concatenate_rows([artifact]), artifact)


def test_concatenate_rows_of_nothing_raises():
    with pytest.raises(ValueError, match="concatenate_rows needs at least one artifact"):
        concatenate_rows([])


def test_concatenate_rows_of_mixed_types_names_the_types():
    with pytest.raises(TypeError, match=re.escape("['Images', 'TokenScores']")):
        concatenate_rows([_token_scores(2), _images(2)])


def test_concatenate_rows_joins_the_prompts_of_images():
    # An Images holds one prompt per generated row; joining artifacts must keep that.
    first, second = _images(4).rows(0, 2), _images(4).rows(2, 4)
    joined = concatenate_rows([first, second])
    assert joined.num_rows == 4
    assert joined.prompts == (*first.prompts, *second.prompts)


def test_concatenate_rows_joins_the_labels_of_images_and_clips_and_refuses_a_mix():
    for build in (_images, _clips):
        first, second = build(4).rows(0, 3), build(4).rows(3, 4)
        joined = concatenate_rows([first, second])
        np.testing.assert_array_equal(joined.labels, np.concatenate([first.labels, second.labels]))
        bare = dataclasses.replace(second, labels=None)
        with pytest.raises(ValueError, match="the same optional fields in every"):
            concatenate_rows([first, bare])


def test_concatenated_images_keep_one_prompt_per_row():
    one = Images(_floats(1, 4, 4, 1), prompts=("same",))
    joined = concatenate_rows([one, one])
    assert joined.num_rows == 2
    assert joined.prompts == ("same", "same")


# Inconsistent shapes, wrong ranks, wrong dtypes: dew's own messages.

BAD_ARTIFACTS = {
    "token losses rank": (
        lambda: TokenScores(_floats(3), _floats(3)),
        "losses",
        "TokenScores.losses must have 2 axes (rows, positions), got shape (3,).",
    ),
    "token weights shape": (
        lambda: TokenScores(_floats(2, 3), _floats(2, 4)),
        "weights",
        "TokenScores fields must share one shape, got losses (2, 3), weights (2, 4).",
    ),
    "token correct shape": (
        lambda: TokenScores(_floats(2, 3), _floats(2, 3), _bools(3, 3)),
        "correct",
        "got losses (2, 3), weights (2, 3), correct (3, 3).",
    ),
    "images generated rank": (
        lambda: Images(_floats(2, 4, 4)),
        "generated",
        "Images.generated must have 4 axes (rows, height, width, channels), got shape (2, 4, 4).",
    ),
    "images reference rank": (
        lambda: Images(_floats(2, 4, 4, 1), _floats(2, 4, 4)),
        "reference",
        "Images.reference must have 4 axes (rows, height, width, channels), got shape (2, 4, 4).",
    ),
    "images reference channels": (
        lambda: Images(_floats(2, 4, 4, 1), _floats(2, 4, 4, 3)),
        "reference",
        "Images.generated and Images.reference must have the same channels, got "
        "generated (2, 4, 4, 1), reference (2, 4, 4, 3).",
    ),
    "clips generated rank": (
        lambda: Clips(_floats(2, 4, 4, 1)),
        "generated",
        "Clips.generated must have 5 axes (rows, frames, height, width, channels), "
        "got shape (2, 4, 4, 1).",
    ),
    "clips reference frames": (
        lambda: Clips(_floats(2, 3, 4, 4, 1), _floats(2, 2, 4, 4, 1)),
        "reference",
        "Clips.generated and Clips.reference must share frames, height, width and channels, "
        "got generated (2, 3, 4, 4, 1), reference (2, 2, 4, 4, 1).",
    ),
    "clips reference rank": (
        lambda: Clips(_floats(2, 3, 4, 4, 1), _floats(2, 3, 4, 4)),
        "reference",
        "Clips.reference must have 5 axes (rows, frames, height, width, channels), "
        "got shape (2, 3, 4, 4).",
    ),
    "images labels rank": (
        lambda: Images(_floats(2, 4, 4, 1), labels=_ints(2, 1)),
        "labels",
        "Images.labels must have 1 axes (rows), got shape (2, 1).",
    ),
    "images labels rows": (
        lambda: Images(_floats(2, 4, 4, 1), labels=_ints(3)),
        "labels",
        "Images.labels must hold one integer class label per generated row (2), got shape "
        "(3,) and dtype int32.",
    ),
    "clips labels dtype": (
        lambda: Clips(_floats(2, 1, 4, 4, 1), labels=_floats(2)),
        "labels",
        "Clips.labels must hold one integer class label per generated row (2), got shape "
        "(2,) and dtype float32.",
    ),
    "representations features rank": (
        lambda: Representations(_floats(2, 3, 1)),
        "features",
        "Representations.features must have 2 axes (rows, dim), got shape (2, 3, 1).",
    ),
    "representations labels rank": (
        lambda: Representations(_floats(2, 3), _ints(2, 1)),
        "labels",
        "Representations.labels must have 1 axes (rows), got shape (2, 1).",
    ),
    "representations labels rows": (
        lambda: Representations(_floats(2, 3), _ints(3)),
        "labels",
        "Representations.labels must hold one label per row, got features (2, 3), labels (3,).",
    ),
    "token rows rank": (
        lambda: TokenRows(_ints(6)),
        "tokens",
        "TokenRows.tokens must have 2 axes (rows, length), got shape (6,).",
    ),
    "token rows mask shape": (
        lambda: TokenRows(_ints(2, 3), _bools(2, 4)),
        "mask",
        "TokenRows.mask must match tokens, got tokens (2, 3), mask (2, 4).",
    ),
    "regression losses rank": (
        lambda: RegressionScores(_floats(2, 1), _floats(2, 1)),
        "losses",
        "RegressionScores.losses must have 1 axes (rows), got shape (2, 1).",
    ),
    "regression weights rows": (
        lambda: RegressionScores(_floats(2), _floats(3)),
        "weights",
        "RegressionScores.weights must hold one weight per row, got losses (2,), weights (3,).",
    ),
    "regression mean without targets": (
        lambda: RegressionScores(_floats(2), _floats(2), _floats(2, 1)),
        "mean",
        "RegressionScores needs mean and targets together, got only mean (2, 1).",
    ),
    "regression std without mean": (
        lambda: RegressionScores(_floats(2), _floats(2), std=_floats(2, 1)),
        "std",
        "RegressionScores.std needs mean and targets beside it.",
    ),
    "regression targets rows": (
        lambda: RegressionScores(_floats(2), _floats(2), _floats(3, 1), None, _floats(3, 1)),
        "mean",
        "RegressionScores.mean, std and targets must share one shape whose first axis is the "
        "rows of losses, got losses (2,), mean (3, 1), targets (3, 1).",
    ),
    "regression std shape": (
        lambda: RegressionScores(
            _floats(2), _floats(2), _floats(2, 1), _floats(2, 2), _floats(2, 1)
        ),
        "std",
        "got losses (2,), mean (2, 1), std (2, 2), targets (2, 1).",
    ),
}


@pytest.mark.usefixtures("dew_checks_only")
@pytest.mark.parametrize("case", list(BAD_ARTIFACTS))
def test_inconsistent_artifact_raises_value_error_naming_fields_and_shapes(case):
    build, _, message = BAD_ARTIFACTS[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


@pytest.mark.parametrize("case", list(BAD_ARTIFACTS))
def test_inconsistent_artifact_is_rejected_under_the_runtime_type_checker(case):
    build, field, message = BAD_ARTIFACTS[case]
    with rejects(ValueError, re.escape(message), parameter=field):
        build()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bool_])
def test_token_rows_with_non_integer_tokens_raises_naming_the_dtype(dtype):
    tokens = jnp.ones((2, 3), dtype)
    with pytest.raises(
        ValueError,
        match=f"TokenRows.tokens must hold integer token IDs, got dtype {jnp.dtype(dtype)}",
    ):
        TokenRows(tokens)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int32, jnp.uint16])
def test_token_rows_accepts_any_integer_dtype(dtype):
    assert TokenRows(jnp.ones((2, 3), dtype)).num_rows == 2


@pytest.mark.parametrize("prompts", [("one",), ("a", "b", "c")])
def test_images_prompt_count_must_match_generated_rows(prompts):
    message = f"got {len(prompts)} prompt(s) for 2 rows"
    with pytest.raises(ValueError, match=re.escape(message)):
        Images(_floats(2, 4, 4, 1), prompts=prompts)


# Pytrees under jit.


@pytest.mark.parametrize("kind", list(FULL_ARTIFACTS))
def test_artifact_passes_through_jax_jit_as_a_pytree(kind):
    artifact = FULL_ARTIFACTS[kind](4)

    @jax.jit
    def double(value):
        return jax.tree.map(lambda leaf: leaf + leaf, value)

    doubled = double(artifact)
    assert type(doubled) is type(artifact)
    for got, leaf in zip(jax.tree.leaves(doubled), jax.tree.leaves(artifact), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(leaf + leaf))


@pytest.mark.parametrize("kind", list(FULL_ARTIFACTS))
def test_rows_and_num_rows_work_inside_filter_jit(kind):
    artifact = FULL_ARTIFACTS[kind](4)

    @eqx.filter_jit
    def first_rows(value):
        part = value.rows(1, 3)
        return part, part.num_rows

    part, num_rows = first_rows(artifact)
    assert num_rows == 2
    _assert_same_artifact(part, artifact.rows(1, 3))


def test_token_scores_reduce_inside_jit():
    losses = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], jnp.float32)
    weights = jnp.asarray([[1.0, 0.0, 1.0], [0.5, 0.5, 0.0]], jnp.float32)

    @jax.jit
    def weighted_total(scores: TokenScores):
        return jnp.sum(scores.losses * scores.weights)

    assert float(weighted_total(TokenScores(losses, weights))) == pytest.approx(8.5)


def test_images_prompts_are_static_metadata_under_jit():
    images = dataclasses.replace(_images(2), labels=None)
    traces = []

    @jax.jit
    def total(value: Images):
        traces.append(value.prompts)
        return jnp.sum(value.generated)

    total(images)
    total(Images(_floats(2, 5, 5, 3), _floats(2, 5, 5, 3), images.prompts))
    assert traces == [images.prompts]
    total(Images(images.generated, images.reference, ("other", "prompts")))
    assert traces == [images.prompts, ("other", "prompts")]
