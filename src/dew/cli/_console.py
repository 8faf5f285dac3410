"""What `dew train` and `dew sweep` print around a run: the resolved configuration, a model
summary, the end-of-run summary, and a metric's direction (decisions 0023, 0064)."""

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dew._directions import MAXIMIZE, direction_of
from dew._throughput import MFU, THROUGHPUT
from dew.naming import Split, bare_metric_name, parse_metric_tag

Directions = Mapping[str, str | None]
"""Bare metric names and the directions their metrics declare (`MetricSet.directions`, a
`FitStarted` record's `metric_directions`); a name not in it is guessed from (decision 0064)."""


def direction(metric: str, directions: Directions | None = None) -> str | None:
    """The direction of `metric` (a bare name or a full tag): the one `directions` records
    for its bare name, else the guess from the name (`dew._directions.guessed_direction`)."""
    return direction_of(bare_metric_name(metric), directions)


def has_direction(metric: str, directions: Directions | None = None) -> bool:
    """Whether `metric` (a bare name or a full tag) is better higher or lower at all."""
    return direction(metric, directions) is not None


def higher_is_better(metric: str, directions: Directions | None = None) -> bool:
    """Whether a larger value of `metric` (a bare name or a full tag) is better."""
    return direction(metric, directions) == MAXIMIZE


def best(
    series: Sequence[tuple[int, float]], metric: str, directions: Directions | None = None
) -> tuple[int, float] | None:
    """The best `(step, value)` of `series` by `metric`'s direction (the earliest of ties);
    NaN never wins; `None` when nothing is finite or NaN-free to pick."""
    scored = [(step, value) for step, value in series if not math.isnan(value)]
    if not scored:
        return None
    sign = -1.0 if higher_is_better(metric, directions) else 1.0
    return min(scored, key=lambda point: sign * point[1])


def value_text(value: float) -> str:
    """A metric value as the console prints it (four decimals; `nan`, `inf` as Python's)."""
    return f"{value:.4f}"


def summary(history: Mapping[str, Sequence[tuple[int, float]]], step: int | None = None) -> str:
    """Each tag's last value; `(step M)` after one logged at another step than `step`
    (default: the latest step any tag was logged at).

    ```python
    >>> summary({"lm/train/loss": [(2, 3.0), (6, 2.5)], "lm/validation/loss": [(4, 2.75)]})
    'lm/train/loss 2.5000  lm/validation/loss 2.7500 (step 4)'

    ```
    """
    if step is None:
        step = max((series[-1][0] for series in history.values() if series), default=0)
    parts = []
    for tag, series in history.items():
        if series:
            at, value = series[-1]
            parts.append(f"{tag} {value_text(value)}" + (f" (step {at})" if at != step else ""))
    return "  ".join(parts)


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _flat(f"{prefix}.{key}" if prefix else str(key), item)
    else:
        yield prefix, value


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def config_lines(config: Any) -> list[str]:
    """The resolved configuration, one line per section: a builder section's `name` first,
    then every other setting as `key=value` (its keyword arguments without `kwargs.`)."""
    sections = config.to_dict()
    width = max(len(section) for section in sections)
    lines = ["config"]
    for section, settings in sections.items():
        cells = []
        builder = "kwargs" in settings and "name" in settings  # model, data, objective
        for key, value in _flat("", settings):
            key = key.removeprefix("kwargs.")
            cells.append(_shown(value) if builder and key == "name" else f"{key}={_shown(value)}")
        lines.append(f"  {section.ljust(width)}  {' '.join(cells)}")
    return lines


def _count(tree: Any) -> int:
    """The number of array elements in `tree`: its arrays' and `jax.ShapeDtypeStruct`s'."""
    import jax

    return sum(
        math.prod(leaf.shape)
        for leaf in jax.tree.leaves(tree)
        if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct)
    )


def parameter_counts(model: Any) -> list[tuple[str, int]]:
    """The parameter count of each top-level field of an Equinox `model` holding arrays
    (real arrays or `jax.ShapeDtypeStruct`s); a lone field holding every parameter (a
    wrapper such as `stack`) is opened one level, its fields named `stack.<field>`."""
    import equinox as eqx

    def counts(module: Any, prefix: str) -> list[tuple[str, int]]:
        found = []
        for field in dataclasses.fields(module):
            number = _count(getattr(module, field.name))
            if number:
                found.append((prefix + field.name, number))
        return found

    found = counts(model, "")
    if len(found) == 1 and isinstance(getattr(model, found[0][0]), eqx.Module):
        return counts(getattr(model, found[0][0]), found[0][0] + ".") or found
    return found


def model_lines(model: Any) -> list[str]:
    """`model <Class>: N parameters`, then the count of each top-level module."""
    rows = parameter_counts(model)
    lines = [f"model {type(model).__name__}: {_count(model):,} parameters"]
    if rows:
        width = max(len(name) for name, _ in rows)
        digits = max(len(f"{number:,}") for _, number in rows)
        lines += [f"  {name.ljust(width)}  {f'{number:,}'.rjust(digits)}" for name, number in rows]
    return lines


def end_lines(
    history: Mapping[str, Sequence[tuple[int, float]]],
    *,
    step: int,
    trained: int,
    seconds: float,
    directions: Directions | None = None,
) -> list[str]:
    """The end-of-run summary: the final values (`summary`), the time taken and the speed,
    the training throughput's last values where this command's fit logged them
    (`log_throughput`: rates, `mfu` as a percentage; none measured before its first step),
    and each validation metric's last and (where it has a direction: the one `directions`
    records for it, else its name's) best value with their steps."""
    if trained > 0 and seconds > 0:
        speed = f"  {trained} steps in {seconds:.1f} s ({trained / seconds:.2f} steps/s)"
    else:
        speed = f"  nothing to train: the run was at step {step} ({seconds:.1f} s)"
    speeds = {tag: series for tag, series in history.items() if _speed(tag) and series}
    shown = {tag: series for tag, series in history.items() if tag not in speeds}
    # The speed this command measured, beside its steps/s: not an earlier command's, which
    # a rerun with `trainer.log_throughput = false` (or one with nothing to train) left.
    speeds = {tag: series for tag, series in speeds.items() if series[-1][0] > step - trained}
    lines = [f"step {step}  {summary(shown, step)}", speed]
    if speeds:
        lines.append("  throughput  " + "  ".join(_speed_text(tag, s) for tag, s in speeds.items()))
    validation = {
        tag: series
        for tag, series in history.items()
        if series and parse_metric_tag(tag).split is Split.VALIDATION
    }
    if validation:
        width = max(len(tag) for tag in validation)
        for tag, series in validation.items():
            at, value = series[-1]
            top = best(series, tag, directions) if has_direction(tag, directions) else None
            line = f"  {tag.ljust(width)}  last {value_text(value)} (step {at})"
            if top is not None:
                way = "higher" if higher_is_better(tag, directions) else "lower"
                line += f"  best {value_text(top[1])} (step {top[0]}, {way} is better)"
            lines.append(line)
    return lines


def _speed(tag: str) -> bool:
    """Whether `tag` is a training throughput metric (`dew._throughput.THROUGHPUT`)."""
    parts = parse_metric_tag(tag)
    return parts.split is Split.TRAIN and parts.metric in THROUGHPUT


def _speed_text(tag: str, series: Sequence[tuple[int, float]]) -> str:
    """A throughput metric's last value as the summary shows it: a rate with thousands
    separators, `mfu` as a percentage, and its step."""
    at, value = series[-1]
    metric = parse_metric_tag(tag).metric
    text = f"{value:.2%}" if metric == MFU else f"{value:,.1f}"
    return f"{tag} {text} (step {at})"


def point_value(config: Any, path: str) -> str:
    """The value at a sweep space's dotted `path` of `config` (a section's builder keyword
    may be named without its `kwargs.`), as the console shows it."""
    settings = dict(_flat("", config.to_dict()))
    section, _, rest = path.partition(".")
    for key in (path, f"{section}.kwargs.{rest}"):
        if key in settings:
            return _shown(settings[key])
    return "?"
