"""A tracker that keeps everything it is told in memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dew.naming import flatten_parameters
from dew.telemetry.records import Record
from dew.tracking._base import AbstractRunTracker
from dew.tracking._preview import Pieces

__all__ = ["InMemoryTracker"]


class InMemoryTracker(AbstractRunTracker):
    """A tracker that keeps what it is told in memory; for tests and docs.

    - `params`: flattened parameter path to value (`flatten_parameters`).
    - `scalars`: metric tag to a list of `(step, value)` in the order received.
    - `artifacts`: artifact name to a list of `(step, value)` in the order received, each
      value as it was logged (a preview is kept, never rendered). Names and steps are
      checked as every tracker checks them (`AbstractRunTracker.log_artifact`).

    ```python
    >>> tracker = InMemoryTracker()
    >>> tracker.log_params({"optimizer": {"name": "sgd"}})
    >>> tracker.log_metrics({"lm/train/loss": 2.0}, step=5)
    >>> tracker.params, tracker.scalars
    ({'optimizer/name': 'sgd'}, {'lm/train/loss': [(5, 2.0)]})

    ```
    """

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.scalars: dict[str, list[tuple[int, Any]]] = {}
        self.artifacts: dict[str, list[tuple[int | None, Any]]] = {}

    def _describe(self) -> str:
        return "InMemoryTracker"

    def _log_params(self, values: Mapping[str, Any]) -> None:
        self.params.update(flatten_parameters(values))

    def _log_metrics(self, values: Mapping[str, Any], *, step: Any) -> None:
        for tag, value in values.items():
            self.scalars.setdefault(tag, []).append((step, value))

    def _log_record(self, name: str, record: Record, *, step: int | None) -> None:
        self._log_artifact(name, record, step=step)

    def _log_preview(self, name: str, pieces: Pieces, *, step: int | None) -> None:
        self._log_artifact(name, pieces.value, step=step)

    def _log_value(self, name: str, value: Any, *, step: int | None) -> None:
        self._log_artifact(name, value, step=step)

    def _log_artifact(self, name: str, value: Any, *, step: int | None) -> None:
        """Keep any artifact as it was logged (a subclass that fails on one overrides this)."""
        self.artifacts.setdefault(name, []).append((step, value))

    def _close(self) -> None:
        pass
