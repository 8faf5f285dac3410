"""Run telemetry: typed records a run reports to its tracker."""

from dew.telemetry import records as records

__all__ = ["records"]
