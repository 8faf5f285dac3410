"""Property-test your own metrics: hypothesis strategies for every artifact type
and a checker for the metric laws.

`check_metric_laws(metric, strategy)` asserts, over many generated artifacts:

- **identity**: `merge(init(), c)` and `merge(c, init())` finalize like `c`;
- **associativity**: `merge(merge(a, b), c)` finalizes like `merge(a, merge(b, c))`;
- **batch-split invariance** (unless `split_invariant=False`): merging the
  contributions of any partition of an artifact's rows finalizes like the whole
  artifact's contribution;
- for device metrics, that the compiled (`eqx.filter_jit`) path agrees with the
  eager one.

```python
>>> from dew import metrics
>>> from dew.testing import check_metric_laws, token_scores
>>> check_metric_laws(metrics.perplexity(), token_scores(), max_examples=5)

```

This module imports Hypothesis: install it with the small `dew-ml[testing]` extra (`pip install
"dew-ml[testing]"`), not the `test` extra of dew's own test suite.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dew.artifacts import (
    Artifact,
    ClassScores,
    Clips,
    Images,
    RegressionScores,
    Representations,
    TokenRows,
    TokenScores,
    concatenate_rows,
)
from dew.metrics import Metric

__all__ = [
    "assert_scores_close",
    "check_metric_laws",
    "class_scores",
    "clips",
    "images",
    "regression_scores",
    "representations",
    "token_rows",
    "token_scores",
]

SearchStrategy = st.SearchStrategy


def _floats(low: float, high: float) -> SearchStrategy[float]:
    return st.floats(low, high, width=32, allow_nan=False, allow_infinity=False)


def _float_array(shape: tuple[int, ...], low: float, high: float) -> SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, shape, elements=_floats(low, high))


def _rows_strategy(rows: int | SearchStrategy[int]) -> SearchStrategy[int]:
    return st.just(rows) if isinstance(rows, int) else rows


@st.composite
def token_scores(
    draw: Callable,
    rows: int | SearchStrategy[int] = st.integers(1, 5),
    positions: int | SearchStrategy[int] = st.sampled_from([1, 3, 8]),
    with_correct: bool = True,
) -> TokenScores:
    """`TokenScores` with losses in [0, 12] nats, 0/1 or fractional target weights
    (every row counts its first position) and, by default, per-position correctness."""
    n = draw(_rows_strategy(rows))
    m = draw(_rows_strategy(positions))
    losses = draw(_float_array((n, m), 0.0, 12.0))
    weights = draw(
        st.one_of(
            hnp.arrays(np.float32, (n, m), elements=st.sampled_from([0.0, 1.0])),
            _float_array((n, m), 0.0, 1.0),
        )
    )
    weights[:, 0] = 1.0
    correct = draw(hnp.arrays(np.bool_, (n, m))) if with_correct else None
    return TokenScores(
        jnp.asarray(losses),
        jnp.asarray(weights),
        None if correct is None else jnp.asarray(correct),
    )


@st.composite
def regression_scores(
    draw: Callable,
    rows: int | SearchStrategy[int] = st.integers(1, 6),
    values: int | SearchStrategy[int] = st.sampled_from([1, 3]),
    with_predictions: bool = True,
) -> RegressionScores:
    """`RegressionScores` with losses in [0, 10], 0/1 or fractional row weights (the
    first row always counts) and, by default, means and targets in [-5, 5] with
    standard deviations in [0.0625, 3], `values` per row."""
    n = draw(_rows_strategy(rows))
    m = draw(_rows_strategy(values))
    losses = draw(_float_array((n,), 0.0, 10.0))
    weights = draw(
        st.one_of(
            hnp.arrays(np.float32, (n,), elements=st.sampled_from([0.0, 1.0])),
            _float_array((n,), 0.0, 1.0),
        )
    )
    weights[0] = 1.0
    if not with_predictions:
        return RegressionScores(jnp.asarray(losses), jnp.asarray(weights))
    mean, targets = (draw(_float_array((n, m), -5.0, 5.0)) for _ in range(2))
    std = draw(_float_array((n, m), 0.0625, 3.0))
    return RegressionScores(
        jnp.asarray(losses),
        jnp.asarray(weights),
        jnp.asarray(mean),
        jnp.asarray(std),
        jnp.asarray(targets),
    )


@st.composite
def images(
    draw: Callable,
    rows: int | SearchStrategy[int] = st.integers(1, 4),
    size: int | SearchStrategy[int] = st.sampled_from([11, 16]),
    channels: int | SearchStrategy[int] = st.sampled_from([1, 3]),
    paired: bool = True,
    classes: int | None = None,
) -> Images:
    """`Images` with values in [0, 1], square, at least 11 pixels a side (SSIM's
    window), and by default a reference row per generated row that is either the
    generated row plus noise or, now and then, identical (a perfect PSNR). With `classes`,
    each row carries a conditioning label in `[0, classes)` (`Images.labels`)."""
    n = draw(_rows_strategy(rows))
    side = draw(_rows_strategy(size))
    c = draw(_rows_strategy(channels))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    generated = rng.random((n, side, side, c), dtype=np.float32)
    labels = _labels(rng, n, classes)
    if not paired:
        return Images(jnp.asarray(generated), labels=labels)
    noise = draw(st.sampled_from([0.0, 0.01, 0.1, 0.3]))
    reference = np.clip(generated + noise * rng.standard_normal(generated.shape), 0.0, 1.0)
    return Images(jnp.asarray(generated), jnp.asarray(reference.astype(np.float32)), labels=labels)


def _labels(rng: np.random.Generator, rows: int, classes: int | None) -> Any:
    if classes is None:
        return None
    return jnp.asarray(rng.integers(0, classes, rows).astype(np.int32))


@st.composite
def clips(
    draw: Callable,
    rows: int | SearchStrategy[int] = st.integers(1, 3),
    frames: int | SearchStrategy[int] = st.sampled_from([1, 3]),
    size: int | SearchStrategy[int] = st.just(11),
    channels: int | SearchStrategy[int] = st.sampled_from([1, 3]),
    classes: int | None = None,
) -> Clips:
    """`Clips` of videos in [0, 1] with a noisy (sometimes identical) reference per row;
    with `classes`, a conditioning label per row in `[0, classes)` (`Clips.labels`)."""
    n = draw(_rows_strategy(rows))
    t = draw(_rows_strategy(frames))
    side = draw(_rows_strategy(size))
    c = draw(_rows_strategy(channels))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    generated = rng.random((n, t, side, side, c), dtype=np.float32)
    noise = draw(st.sampled_from([0.0, 0.02, 0.2]))
    reference = np.clip(generated + noise * rng.standard_normal(generated.shape), 0.0, 1.0)
    labels = _labels(rng, n, classes)
    return Clips(jnp.asarray(generated), jnp.asarray(reference.astype(np.float32)), labels)


@st.composite
def representations(
    draw: Callable,
    rows: int | SearchStrategy[int] = st.sampled_from([2, 5, 12]),
    dim: int | SearchStrategy[int] = st.sampled_from([1, 4]),
    num_classes: int = 3,
) -> Representations:
    """`Representations` whose features cluster by label (so probes can learn)."""
    n = draw(_rows_strategy(rows))
    d = draw(_rows_strategy(dim))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    labels = rng.integers(0, num_classes, size=n).astype(np.int32)
    centres = rng.standard_normal((num_classes, d)) * 3.0
    features = centres[labels] + rng.standard_normal((n, d))
    return Representations(jnp.asarray(features.astype(np.float32)), jnp.asarray(labels))


@st.composite
def token_rows(
    draw: Callable,
    rows: int | SearchStrategy[int] = st.integers(1, 4),
    length: int | SearchStrategy[int] = st.integers(1, 12),
    vocab_size: int = 16,
) -> TokenRows:
    """`TokenRows` of int32 IDs in `[0, vocab_size)`."""
    n = draw(_rows_strategy(rows))
    m = draw(_rows_strategy(length))
    tokens = draw(hnp.arrays(np.int32, (n, m), elements=st.integers(0, vocab_size - 1)))
    return TokenRows(jnp.asarray(tokens))


@st.composite
def class_scores(
    draw: Callable,
    rows: int | SearchStrategy[int] = st.integers(1, 6),
    classes: int | SearchStrategy[int] = st.sampled_from([2, 3, 5]),
    weighted: bool | None = None,
) -> ClassScores:
    """`ClassScores` with logits in [-4, 4] (now and then tied within a row), labels in
    `[0, classes)` and, unless `weighted` says (`True`: always, `False`: never), either no
    weights or 0/1 or fractional row weights (the first row always counts)."""
    n = draw(_rows_strategy(rows))
    c = draw(_rows_strategy(classes))
    logits = draw(_float_array((n, c), -4.0, 4.0))
    if draw(st.booleans()):  # ties: the argmax and top-k break them by class index
        logits = np.round(logits)
    labels = draw(hnp.arrays(np.int32, (n,), elements=st.integers(0, c - 1)))
    with_weights = draw(st.booleans()) if weighted is None else weighted
    if not with_weights:
        return ClassScores(jnp.asarray(logits), jnp.asarray(labels))
    weights = draw(
        st.one_of(
            hnp.arrays(np.float32, (n,), elements=st.sampled_from([0.0, 1.0])),
            _float_array((n,), 0.0, 1.0),
        )
    )
    weights[0] = 1.0
    return ClassScores(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights))


def _tolerances(value: Any) -> tuple[float, float]:
    dtype = np.asarray(value).dtype
    if dtype == np.float64:
        return 1e-10, 1e-12
    return 2e-5, 1e-6


def assert_scores_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    what: str = "value",
) -> None:
    """Assert two metric values agree within their dtype's tolerance; NaN equals NaN
    and an infinity equals only the same infinity. Mappings of values (what a
    `MetricSet` finalizes to) agree when they hold the same names, in the same order,
    and each value agrees."""
    if isinstance(actual, Mapping) or isinstance(expected, Mapping):
        if not (isinstance(actual, Mapping) and isinstance(expected, Mapping)):
            raise AssertionError(f"{what}: {actual!r} and {expected!r} are not both mappings")
        if list(actual) != list(expected):
            raise AssertionError(f"{what}: names {list(actual)} != {list(expected)}")
        for name, value in expected.items():
            assert_scores_close(actual[name], value, rtol=rtol, atol=atol, what=f"{what} ({name})")
        return
    default_rtol, default_atol = _tolerances(expected)
    np.testing.assert_allclose(
        np.asarray(actual, np.float64),
        np.asarray(expected, np.float64),
        rtol=default_rtol if rtol is None else rtol,
        atol=default_atol if atol is None else atol,
        equal_nan=True,
        err_msg=what,
    )


def _shown(value: Any) -> str:
    """A value as a failure message shows it: arrays by their numbers (long ones
    summarised), mappings of values name by name."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{name!r}: {_shown(item)}" for name, item in value.items()) + "}"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    array = np.asarray(value)
    text = np.array2string(array, threshold=48, edgeitems=3, separator=", ")
    return " ".join(text.split())


def _shown_artifact(artifact: Artifact) -> str:
    """An artifact with the numbers of its arrays (what `repr` shows only as shapes)."""
    if not dataclasses.is_dataclass(artifact):
        return repr(artifact)
    fields = (
        f"{field.name}={_shown(getattr(artifact, field.name))}"
        for field in dataclasses.fields(artifact)
    )
    return f"{type(artifact).__name__}({', '.join(fields)})"


class _Law:
    """One law of `check_metric_laws`: it compares two finalized values and, when they
    differ, raises an `AssertionError` that names the law, the example and both values
    before the comparison's own (NumPy's) text."""

    def __init__(self, rtol: float | None, atol: float | None) -> None:
        self.rtol, self.atol = rtol, atol

    def check(
        self,
        law: str,
        claim: str,
        example: Mapping[str, Any],
        left: tuple[str, Any],
        right: tuple[str, Any],
    ) -> None:
        (left_name, left_value), (right_name, right_value) = left, right
        try:
            assert_scores_close(left_value, right_value, rtol=self.rtol, atol=self.atol, what=claim)
        except AssertionError as error:
            shown = "\n".join(
                f"  {name} = {_shown_artifact(value) if isinstance(value, Artifact) else value}"
                for name, value in example.items()
            )
            width = max(len(left_name), len(right_name))
            raise AssertionError(
                f"the {law} law broke ({claim}) on this example:\n{shown}\n"
                f"  {left_name:<{width}} = {_shown(left_value)}\n"
                f"  {right_name:<{width}} = {_shown(right_value)}\n"
                f"{str(error).strip()}"
            ) from None


def check_metric_laws(
    metric: Metric,
    strategy: SearchStrategy[Artifact],
    *,
    split_invariant: bool = True,
    max_examples: int = 25,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Assert the monoid laws of `metric` over artifacts drawn from `strategy`.

    **Arguments:**

    - `metric`: the metric under test.
    - `strategy`: a hypothesis strategy of the artifacts it reads (see this module).
    - `split_invariant`: also check batch-split invariance. Metrics whose value
      depends on how rows are batched (the batch probes) pass `False`.
    - `max_examples`: how many examples hypothesis tries.
    - `rtol`, `atol`: tolerances; by default those of the values' dtype.

    **Raises:** `AssertionError` whose message names the law that broke (identity,
    associativity, batch-split invariance, compiled-vs-eager), the example hypothesis
    shrank the failure to (the artifacts with their numbers, and the cuts), and the two
    finalized values that differ, before NumPy's comparison text.
    """

    law = _Law(rtol, atol)
    statistics = eqx.filter_jit(metric.__call__) if not metric.host else metric.__call__
    merge = eqx.filter_jit(metric.merge) if not metric.host else metric.merge
    checked_eager = []

    @settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
        report_multiple_bugs=False,
    )
    @given(data=st.data())
    def laws(data):
        a, b, c = (data.draw(strategy, label=label) for label in ("a", "b", "c"))
        stats_a, stats_b, stats_c = statistics(a), statistics(b), statistics(c)
        expected = metric.finalize(stats_a)
        finalized_a = ("finalize(a)", expected)

        if not metric.host and not checked_eager:
            law.check(
                "compiled-vs-eager",
                "jit agrees with eager",
                {"a": a},
                ("finalize(metric(a)), eager", metric.finalize(metric(a))),
                ("finalize(metric(a)), compiled", expected),
            )
            checked_eager.append(True)

        law.check(
            "identity",
            "init() is a left unit",
            {"a": a},
            ("finalize(merge(init(), a))", metric.finalize(merge(metric.init(), stats_a))),
            finalized_a,
        )
        law.check(
            "identity",
            "init() is a right unit",
            {"a": a},
            ("finalize(merge(a, init()))", metric.finalize(merge(stats_a, metric.init()))),
            finalized_a,
        )

        law.check(
            "associativity",
            "merge is associative",
            {"a": a, "b": b, "c": c},
            (
                "finalize(merge(merge(a, b), c))",
                metric.finalize(merge(merge(stats_a, stats_b), stats_c)),
            ),
            (
                "finalize(merge(a, merge(b, c)))",
                metric.finalize(merge(stats_a, merge(stats_b, stats_c))),
            ),
        )

        if split_invariant:
            rows = a.num_rows
            cuts = sorted(data.draw(st.lists(st.integers(0, rows), max_size=3), label="cuts"))
            bounds = [0, *cuts, rows]
            parts = [a.rows(start, stop) for start, stop in itertools.pairwise(bounds)]
            parts = [part for part in parts if part.num_rows > 0]
            merged = metric.init()
            for part in parts:
                merged = merge(merged, statistics(part))
            example = {"a": a, "cut at rows": cuts}
            law.check(
                "batch-split invariance",
                f"a's {len(parts)} parts merge to a's value",
                example,
                ("finalize(merge of the parts)", metric.finalize(merged)),
                finalized_a,
            )
            whole = concatenate_rows(parts)
            law.check(
                "batch-split invariance",
                "concatenated parts score as a",
                example,
                ("finalize(concatenated parts)", metric.finalize(statistics(whole))),
                finalized_a,
            )

    laws()
