"""`dew runs`: a table (or JSON) of the runs under a folder, their hyperparameters that differ,
their final metrics in one column order, and each sweep's best trial (decision 0023); one table
per kind of run (its objective and model), within the terminal's width, `--columns` to choose
(decision 0033)."""

import argparse
import dataclasses
import difflib
import json
import math
import pathlib
import re
import sys
import textwrap
from typing import Any

from dew._directions import MAXIMIZE
from dew._throughput import THROUGHPUT
from dew.cli._console import direction, value_text
from dew.cli._table import Table, output_width
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
    kind: tuple[Any, Any] | None = None  # its objective's and model's names: its table
    directions: dict[str, str | None] = dataclasses.field(default_factory=dict)  # by tag


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


_TRIAL = re.compile(r"trial-(?P<index>[0-9]+)")
_READ: dict[tuple[pathlib.Path, int, int], Any] = {}  # one read of each ledger per listing


def _ledger(folder: pathlib.Path) -> Any:
    """The ledger `dew sweep` keeps beside a sweep's journal and its trials' folders, read
    and checked (`None`: none); a ledger that is not what a sweep writes raises, naming
    what is wrong."""
    from dew.config.sweep._ledger import read_ledger

    path = folder.parent / "ledger.json"
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    key = (path, status.st_mtime_ns, status.st_size)
    if key not in _READ:
        _READ.clear()
        _READ[key] = read_ledger(path)
    return _READ[key]


def _pruned_at(folder: pathlib.Path) -> int | None:
    """The step a sweep's pruner stopped the trial in `folder` (`<sweep>/trial-<i>`) at,
    as the sweep's ledger records it; `None` for any other run (decision 0055)."""
    match = _TRIAL.fullmatch(folder.name)
    if match is None or not (folder.parent / "ledger.json").is_file():
        return None
    trial = _ledger(folder).state.finished.get(int(match["index"]))
    if trial is None or not trial.pruned:
        return None
    return max(trial.reports, default=0)


def _kind(params: dict[str, Any]) -> tuple[Any, Any] | None:
    """A run's kind, the table it is listed in: its objective's and its model's names
    (`None`: a journal without its configuration)."""
    if params.get("model.name") is None:
        return None
    return (params.get("objective.name"), params["model.name"])


def _configured_kind(config: Any) -> tuple[Any, Any] | None:
    """The kind of a configuration as a sweep's ledger holds it (its sections nested)."""
    sections = config if isinstance(config, dict) else {}
    return _kind(
        {
            f"{name}.name": sections[name].get("name")
            for name in ("objective", "model")
            if isinstance(sections.get(name), dict)
        }
    )


def _row(
    name: str, folder: pathlib.Path, summary: Any, history: Any, params: dict[str, Any]
) -> _Row:
    """A run's row from its scalars journal's `summary` (each tag's greatest step and its
    value there, decision 0046), its records journal's `history` and its `params`."""
    from dew._run_folder import latest_step

    metrics = summary.metrics()
    fits = history.fits()
    status = "-"
    if fits:  # the latest fit decides: a resumed one runs
        ended = fits[-1].ended
        status = "running or killed" if ended is None else ended.status
    declared: dict[tuple[str, str], str | None] = {}  # (stage, bare name): its direction
    for started in history.fit_started():
        for metric, way in started.metric_directions.items():
            declared[started.stage, metric] = way
    trials = [record for _, _, record in history.records if record.type == "trial_finished"]
    named = ((_param_name(key), value) for key, value in params.items())
    params = {
        name: value for name, value in named if name is not None and name not in _HIDDEN_PARAMS
    }
    last = latest_step(summary, history)  # the step the fit ended at, logged or not
    pruned_at = _pruned_at(folder) if not trials else None
    if pruned_at is not None:  # stopped by its sweep's pruner, not completed
        status = f"pruned (step {pruned_at})"
    row = _Row(name, status, last, metrics, params, kind=_kind(params))
    row.directions = {tag: declared[key] for tag in metrics if (key := _key(tag)) in declared}
    if trials:  # a sweep's journal: its best trial, not its last; its kind, its trials'
        ledger = _ledger(folder)  # None: no ledger ("minimize", the sweep's default)
        if ledger is not None:
            row.kind = row.kind or _configured_kind(ledger.data.get("config"))
        way = "minimize" if ledger is None else ledger.direction
        sign = -1.0 if way == MAXIMIZE else 1.0
        pruned = (
            set()
            if ledger is None
            else {t.index for t in ledger.state.finished.values() if t.pruned}
        )
        scored = [t for t in trials if not math.isnan(t.value) and t.trial not in pruned]
        scored.sort(key=lambda trial: trial.trial)  # of trials that tie, the first is the best
        row.status = f"sweep, {len(trials)} trials"
        row.directions = dict.fromkeys(metrics, way)  # its score's: the ledger's
        if pruned:
            row.status += f", {len(pruned)} pruned"
        row.step = None
        if scored:
            top = min(scored, key=lambda trial: sign * trial.value)
            row.best_trial = {
                "index": top.trial,
                "overrides": dict(top.overrides),
                "value": top.value,
                "direction": way,
            }
            for tag in metrics:
                metrics[tag] = (top.trial, top.value)
    return row


def _collect(root: pathlib.Path) -> tuple[list[_Row], int]:
    """Each run's row, read from its journal's summary (and the scalars past it), its
    records journal and its parameters: never its whole scalars journal (decision 0046)."""
    from dew._run_folder import SCALARS, RunFolder
    from dew.tracking._journal import read_params
    from dew.tracking._summary import summarize

    rows, unreadable = [], 0
    for journal_file in sorted(root.rglob(SCALARS)):
        folder = journal_file.parent
        name = str(folder.relative_to(root)) or "."
        try:
            summary, history = summarize(folder), RunFolder(folder).history()
            rows.append(_row(name, folder, summary, history, read_params(folder)))
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


def _key(tag: str) -> tuple[str, str] | None:
    """A metric tag's stage and bare metric name (`None`: a journal's odd key)."""
    try:
        parsed = parse_metric_tag(tag)
    except (TypeError, ValueError):
        return None
    return parsed.stage, parsed.metric


def _metric(tag: str) -> str:
    """A metric tag's bare metric name (a journal's odd key as it is)."""
    try:
        return parse_metric_tag(tag).metric
    except (TypeError, ValueError):
        return tag


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
    # The direction a listed run's journal records for the tag (decision 0064), else the
    # guess from its name (a run recorded before metrics declared theirs).
    recorded = (row.directions[tag] for row in rows if tag in row.directions)
    sign = -1.0 if next(recorded, direction(tag)) == MAXIMIZE else 1.0  # best first
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


_FIXED = ("run", "status", "step")
_BEST = "best trial"


def _chosen(rows: list[_Row], text: str | None) -> list[str] | None:
    """`--columns a,b,c`: the columns named (a metric by bare name or tag, a hyperparameter
    by its `--set` path, or `status`, `step`, `best trial`), in that order; `None` without
    it. A name no listed run has is an error naming the columns there are."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    params = {key for row in rows for key in row.params}
    tags = {tag for row in rows for tag in row.metrics}
    known = [*_FIXED, *sorted(params), *sorted(tags), _BEST]
    chosen = []
    for name in names:
        column = name if name in (*_FIXED, _BEST) or name in params else _tag(rows, name)
        if not name or (rows and column is None):
            bare = sorted({_metric(tag) for tag in tags})
            near = difflib.get_close_matches(name, [*bare, *known], n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(
                f"--columns names {name!r}, which no listed run has{hint}; the columns are "
                f"{', '.join(known)} (a metric by bare name or tag)."
            )
        if column is not None and column != "run" and column not in chosen:
            chosen.append(column)
    return chosen


def _json_rows(rows: list[_Row], chosen: list[str] | None) -> list[dict[str, Any]]:
    from dew.telemetry.records import encode_json_value

    params, tags = _columns(rows)
    if chosen is not None:
        params = [column for column in chosen if any(column in row.params for row in rows)]
        tags = [column for column in chosen if column.count("/") == 2]
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


def _text(row: _Row, column: str) -> str:
    """`row`'s cell under `column`: run, status, step, a metric (with `(step M)` when logged
    before the run's last step), a hyperparameter, or a sweep's best trial and point."""
    if column in _FIXED:
        return _shown(getattr(row, column))
    if column == _BEST:
        trial = row.best_trial
        if trial is None:
            return "-"
        point = "  ".join(f"{path}={_shown(value)}" for path, value in trial["overrides"].items())
        return f"{trial['index']}  {point}"
    if column in row.metrics:
        at, value = row.metrics[column]
        late = row.best_trial is None and at != row.step  # logged before the last step
        return value_text(value) + (f" (step {at})" if late else "")
    if column.count("/") == 2 or not row.params:
        return "-"
    return _shown(row.params.get(column))


def _table(rows: list[_Row], chosen: list[str] | None, sort: str | None) -> Table:
    """One table of `rows`: the `--columns` chosen, else run, status, step, the
    hyperparameters that differ among them, their metrics and a sweep's best trial. To fit a
    width, columns are kept in this order: the run, its step and status, the `--sort` metric
    (else the first validation metric), the hyperparameters, the other validation metrics,
    the training metrics, the training throughput (decision 0087), the best trial."""
    if chosen is None:
        params, tags = _columns(rows)
        sweeps = [_BEST] if any(row.best_trial is not None for row in rows) else []
        headers = [*_FIXED, *params, *tags, *sweeps]
        metrics = sorted(
            tags,
            key=lambda tag: (
                tag != sort,
                "/validation/" not in tag,
                _metric(tag) in THROUGHPUT,  # a run's speed after what it learned
            ),
        )
        order = ["run", "step", "status", *metrics[:1], *params, *metrics[1:], *sweeps]
    else:
        headers = order = ["run", *chosen]
    cells = [[_text(row, column) for column in headers] for row in rows]
    priority = [headers.index(column) for column in order]
    return Table(headers, cells, priority, cut=headers.index(_BEST) if _BEST in headers else None)


def _kind_heading(kind: tuple[Any, Any] | None, count: int) -> str:
    runs = f"{count} run{'s' if count != 1 else ''}"
    if kind is None:
        return f"without a recorded configuration: {runs}"
    objective, model = kind
    return f"objective {objective or '-'}, model {model}: {runs}"


def _grouped(rows: list[_Row]) -> list[tuple[tuple[Any, Any] | None, list[_Row]]]:
    """The rows in one group per kind, the groups in the order of their first row."""
    groups: dict[Any, list[_Row]] = {}
    for row in rows:
        groups.setdefault(row.kind, []).append(row)
    return list(groups.items())


def _printed(rows: list[_Row], chosen: list[str] | None, sort: str | None) -> list[str]:
    """The lines `dew runs` prints: a table per kind of run (a heading above each when
    there are several), each within the output's width unless `--columns` chose them, with
    a line naming the columns it left out."""
    width = None if chosen is not None else output_width()
    groups = _grouped(rows)
    lines: list[str] = []
    for kind, members in groups:
        if len(groups) > 1:
            lines += [*([""] if lines else []), _kind_heading(kind, len(members))]
        table, left = _table(members, chosen, sort).lines(width)
        lines += table
        if left:
            note = (
                f"({len(left)} more column{'s' if len(left) != 1 else ''} past {width} "
                f"characters: {', '.join(left)}; choose with --columns)"
            )
            lines += [note] if width is None else textwrap.wrap(note, width, break_on_hyphens=False)
    return lines


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
    chosen = _chosen(rows, args.columns)
    if args.sort is not None:
        rows = _sorted(rows, args.sort, args.reverse)
    if args.json:
        print(json.dumps(_json_rows(rows, chosen), indent=1, allow_nan=False))
    elif not rows:
        print(f"no runs under {root}" + (" match the filters" if args.filter else ""))
    else:
        for line in _printed(rows, chosen, None if args.sort is None else _tag(rows, args.sort)):
            print(line)
    return 1 if unreadable else 0
