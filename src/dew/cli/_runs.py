"""`dew runs`: a table (or JSON) of the runs under a folder, their hyperparameters that differ,
their final metrics in one column order, and each sweep's best trial (decision 0023)."""

import argparse
import dataclasses
import json
import math
import pathlib
import re
import sys
from typing import Any

from dew.cli._console import higher_is_better, value_text
from dew.naming import Split, parse_metric_tag, parse_parameter_path

_FILTER = re.compile(r"^(?P<key>[^=~<>]+?)(?P<op>=|~|<|>)(?P<value>.*)$")
_FILTER_FORMS = "KEY=VALUE, KEY~REGEX, KEY<NUMBER or KEY>NUMBER"
_HIDDEN_PARAMS = ("trainer.name", "trainer.checkpoint_dir")  # the run column says them


@dataclasses.dataclass
class _Row:
    run: str
    status: str
    step: int | None
    metrics: dict[str, tuple[int, float]]  # tag -> (step, value): the last, or a sweep's best
    params: dict[str, Any]
    best_trial: dict[str, Any] | None = None  # a sweep's: index, overrides, value, direction


def _param_name(key: str) -> str | None:
    """params.json's `config/optim/learning_rate` as the `--set` path `optim.learning_rate`;
    `None` for a key outside `config`."""
    try:
        section, *keys = parse_parameter_path(key)
    except (TypeError, ValueError):
        return None
    if section != "config" or not keys:
        return None
    return ".".join(part for part in keys if part != "kwargs")


def _direction(folder: pathlib.Path) -> str:
    """A sweep journal's direction, from the ledger `dew sweep` keeps beside it ("minimize"
    without one); a ledger that is not what a sweep writes raises, naming what is wrong."""
    from dew.config.sweep._ledger import read_ledger

    ledger = folder.parent / "ledger.json"
    return read_ledger(ledger).direction if ledger.exists() else "minimize"


def _row(name: str, folder: pathlib.Path, journal: Any) -> _Row:
    status, ended = "-", None
    trials = []
    for _, _, record in journal.records:  # the latest fit decides: a resumed one runs
        if record.type == "fit_started":
            status, ended = "running or killed", None
        elif record.type == "fit_ended":
            status, ended = record.status, record.step
        elif record.type == "trial_finished":
            trials.append(record)
    named = ((_param_name(key), value) for key, value in journal.params.items())
    params = {
        name: value for name, value in named if name is not None and name not in _HIDDEN_PARAMS
    }
    metrics = {tag: series[-1] for tag, series in journal.scalars.items() if series}
    last = max((step for series in journal.scalars.values() for step, _ in series), default=None)
    if ended is not None:  # the step the fit ended at, logged or not
        last = ended if last is None else max(last, ended)
    row = _Row(name, status, last, metrics, params)
    if trials:  # a sweep's journal: its best trial, not its last
        direction = _direction(folder)
        sign = -1.0 if direction == "maximize" else 1.0
        scored = [trial for trial in trials if not math.isnan(trial.value)]
        row.status = f"sweep, {len(trials)} trials"
        row.step = None
        if scored:
            top = min(scored, key=lambda trial: sign * trial.value)
            row.best_trial = {
                "index": top.trial,
                "overrides": dict(top.overrides),
                "value": top.value,
                "direction": direction,
            }
            for tag in metrics:
                metrics[tag] = (top.trial, top.value)
    return row


def _collect(root: pathlib.Path) -> tuple[list[_Row], int]:
    from dew.tracking import read_journal

    rows, unreadable = [], 0
    for journal_file in sorted(root.rglob("scalars.jsonl")):
        folder = journal_file.parent
        name = str(folder.relative_to(root)) or "."
        try:
            rows.append(_row(name, folder, read_journal(folder)))
        except (OSError, ValueError) as error:  # the journal, or a sweep's ledger
            unreadable += 1
            print(f"dew runs: {name}: {error}", file=sys.stderr)
            rows.append(_Row(name, "unreadable", None, {}, {}))
    return rows, unreadable


def _tag(rows: list[_Row], metric: str) -> str | None:
    """The tag a bare name or full tag names: itself, else a validation tag with that bare
    name, else a training one."""
    tags = {tag for row in rows for tag in row.metrics}
    if metric in tags:
        return metric
    for split in (Split.VALIDATION, Split.TRAIN):
        matches = sorted(tag for tag in tags if _names(tag, split, metric))
        if matches:
            return matches[0]
    return None


def _names(tag: str, split: Split, metric: str) -> bool:
    """Whether `tag` is a metric tag of `metric` on `split` (a journal's odd key is not)."""
    try:
        parsed = parse_metric_tag(tag)
    except (TypeError, ValueError):
        return False
    return parsed.split is split and parsed.metric == metric


def _cell(row: _Row, key: str) -> Any:
    """A row's value under a filter key: run, status, step, a metric or a hyperparameter."""
    if key in ("run", "status", "step"):
        return getattr(row, key)
    if key in row.metrics:
        return row.metrics[key][1]
    return row.params.get(key)


@dataclasses.dataclass(frozen=True)
class _Filter:
    """One `--filter`: `KEY=VALUE` (as the table shows it), `KEY~REGEX` (searched for),
    `KEY<NUMBER` or `KEY>NUMBER`; a run lacking KEY never matches."""

    text: str
    key: str
    op: str
    wanted: str

    @classmethod
    def parse(cls, text: str, rows: list[_Row]) -> "_Filter":
        match = _FILTER.match(text)
        if match is None or not match["key"].strip():
            raise ValueError(f"--filter {text!r} is not one of {_FILTER_FORMS}.")
        key, op, wanted = match["key"].strip(), match["op"], match["value"]
        keys = {"run", "status", "step"} | {k for row in rows for k in (*row.metrics, *row.params)}
        key = _tag(rows, key) or key
        if rows and key not in keys:
            raise ValueError(
                f"--filter {text!r}: no listed run has {key!r}; the keys are "
                f"{', '.join(sorted(keys))}."
            )
        if op in "<>":
            try:
                float(wanted)
            except ValueError:
                raise ValueError(
                    f"--filter {text!r}: {op} needs a number, got {wanted!r} ({_FILTER_FORMS})."
                ) from None
        elif op == "~":
            try:
                re.compile(wanted)
            except re.error as error:
                raise ValueError(f"--filter {text!r}: {wanted!r} is no regex ({error}).") from None
        return cls(text, key, op, wanted)

    def matches(self, row: _Row) -> bool:
        value = _cell(row, self.key)
        if value is None:
            return False
        if self.op == "=":
            return _shown(value) == self.wanted
        if self.op == "~":
            return re.search(self.wanted, _shown(value)) is not None
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        bound = float(self.wanted)
        return value < bound if self.op == "<" else value > bound


def _filtered(rows: list[_Row], filters: list[str]) -> list[_Row]:
    for check in [_Filter.parse(text, rows) for text in filters]:
        rows = [row for row in rows if check.matches(row)]
    return rows


def _sorted(rows: list[_Row], sort: str, reverse: bool = False) -> list[_Row]:
    """Best first by `sort`'s direction (`reverse`: worst first); runs without it last."""
    tag = _tag(rows, sort)
    if tag is None:
        tags = sorted({tag for row in rows for tag in row.metrics})
        raise ValueError(
            f"--sort {sort!r}: no listed run has that metric; their metrics are "
            f"{', '.join(tags) or 'none'} (a bare name or a full tag)."
        )
    sign = -1.0 if higher_is_better(tag) else 1.0  # best first
    if reverse:
        sign = -sign
    having = [row for row in rows if tag in row.metrics and not math.isnan(row.metrics[tag][1])]
    rest = [row for row in rows if row not in having]
    return sorted(having, key=lambda row: sign * row.metrics[tag][1]) + rest


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _differing(rows: list[_Row]) -> list[str]:
    """The hyperparameters whose values differ across the listed runs (with run.json)."""
    keyed = [row for row in rows if row.params]
    keys = list(dict.fromkeys(key for row in keyed for key in row.params))
    return [key for key in keys if len({_shown(row.params.get(key)) for row in keyed}) > 1]


def _columns(rows: list[_Row]) -> tuple[list[str], list[str]]:
    tags = sorted({tag for row in rows for tag in row.metrics})
    return _differing(rows), tags


def _json_rows(rows: list[_Row]) -> list[dict[str, Any]]:
    from dew.telemetry.records import encode_json_value

    params, tags = _columns(rows)
    return [
        encode_json_value(
            {
                "run": row.run,
                "status": row.status,
                "step": row.step,
                "hyperparameters": {key: row.params.get(key) for key in params},
                "metrics": {
                    tag: {"value": row.metrics[tag][1], "step": row.metrics[tag][0]}
                    for tag in tags
                    if tag in row.metrics
                },
                **({"best_trial": row.best_trial} if row.best_trial is not None else {}),
            }
        )
        for row in rows
    ]


def _table(rows: list[_Row]) -> list[str]:
    params, tags = _columns(rows)
    headers = ["run", "status", "step", *params, *tags]
    sweeps = any(row.best_trial is not None for row in rows)
    if sweeps:
        headers.append("best trial")
    cells = []
    for row in rows:
        line = [row.run, row.status, _shown(row.step)]
        line += [_shown(row.params.get(key)) if row.params else "-" for key in params]
        for tag in tags:
            if tag not in row.metrics:
                line.append("-")
                continue
            at, value = row.metrics[tag]
            shown = value_text(value)
            if row.best_trial is None and at != row.step:  # logged before the last step
                shown += f" (step {at})"
            line.append(shown)
        if sweeps:
            trial = row.best_trial
            line.append(
                "-"
                if trial is None
                else f"{trial['index']}  "
                + "  ".join(f"{path}={_shown(value)}" for path, value in trial["overrides"].items())
            )
        cells.append(line)
    widths = [max(len(line[i]) for line in [headers, *cells]) for i in range(len(headers))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *cells]
    ]


def _runs(args: argparse.Namespace) -> int:
    """List the runs under a folder. A run whose journal cannot be read is listed as
    `unreadable`, its error printed to standard error, and the exit status is 1."""
    root = pathlib.Path(args.folder)
    if not root.is_dir():
        raise FileNotFoundError(f"no folder {str(root)!r} to list runs from.")
    if args.reverse and args.sort is None:
        raise ValueError("--reverse reverses --sort METRIC; give one, e.g. --sort loss --reverse.")
    rows, unreadable = _collect(root)
    rows = _filtered(rows, args.filter)
    if args.sort is not None:
        rows = _sorted(rows, args.sort, args.reverse)
    if args.json:
        print(json.dumps(_json_rows(rows), indent=1, allow_nan=False))
    elif not rows:
        print(f"no runs under {root}" + (" match the filters" if args.filter else ""))
    else:
        for line in _table(rows):
            print(line)
    return 1 if unreadable else 0
