"""The progress bar and the console: the lines a loop prints, the bar it draws, and when an
evaluation's counts are worth a line."""

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator, Mapping

from tqdm.auto import tqdm

from dew._processes import is_multiprocess
from dew.naming import Split

__all__ = ["Console", "counts_line", "telling", "verbose_console"]

_VERBOSE = contextvars.ContextVar("dew_verbose_console", default=False)


@contextlib.contextmanager
def verbose_console(verbose: bool = True) -> Iterator[None]:
    """Within this block, a loop that prints (`progress=True`) also prints the lines that
    say nothing in a one-process run with even shards (an evaluation's batch and record
    counts and its event key); `dew train --verbose` sets it."""
    token = _VERBOSE.set(verbose)
    try:
        yield
    finally:
        _VERBOSE.reset(token)


def counts_line(batches: int, records: int, uneven_shards: bool, key: str) -> str:
    """An evaluation's pass counts and event key, as `dew train` and `dew eval` print them."""
    return (
        f"evaluation/coordinated_batches {batches}  evaluation/records {records}  "
        f"evaluation/uneven_shards {uneven_shards}  event key {key}"
    )


def telling(uneven_shards: bool) -> bool:
    """Whether an evaluation's counts line is worth printing: its shards were uneven, the
    run has several processes, or `verbose_console` asks for it."""
    return bool(uneven_shards) or is_multiprocess() or _VERBOSE.get()


class Console:
    """What a loop shows: with `progress`, one printed line per report and, when standard
    error is a terminal, a bar over `total` units of `unit` from `initial` whose postfix
    holds the latest training loss and validation values."""

    def __init__(
        self, progress: bool, *, total: int | None, initial: int = 0, unit: str = "step"
    ) -> None:
        self.progress = progress
        self.postfix: dict[str, str] = {}  # the bar's: the latest loss and validation values
        self.bar = tqdm(
            total=total,
            initial=initial,
            unit=unit,
            disable=not (progress and sys.stderr.isatty()),
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def reported(
        self,
        split: Split,
        step: int,
        tags: Mapping[str, float],
        values: Mapping[str, float],
        note: str,
    ) -> None:
        """Show one report: the bar's postfix, and with `progress` its printed line."""
        if split is Split.VALIDATION:
            self.postfix.update(
                {f"val_{metric}": f"{value:.4f}" for metric, value in values.items()}
            )
        elif "loss" in values and split is Split.TRAIN:
            self.postfix = {**self.postfix, "loss": f"{values['loss']:.4f}"}
        if self.postfix:
            self.bar.set_postfix(self.postfix, refresh=False)
        if self.progress:
            shown = "  ".join(f"{tag} {value:.4f}" for tag, value in tags.items())
            self.print(f"step {step}  {shown}{note}")

    def counts_note(
        self, batches: int, records: int, uneven_shards: bool, key: str | Callable[[], str]
    ) -> str:
        """An evaluation's counts (`counts_line`) as a note under its values, or `""` when
        they say nothing (`telling`). `key` is the event key's text, or what makes it (a
        fetch of the key from the device, made only for a note that is shown)."""
        if not telling(uneven_shards):
            return ""
        text = key() if callable(key) else key
        return f"\n  {counts_line(batches, records, uneven_shards, text)}"

    def print(self, line: str) -> None:
        """Print a line (above the progress bar when one is drawn)."""
        if self.bar.disable:
            print(line)
        else:
            self.bar.write(line)
