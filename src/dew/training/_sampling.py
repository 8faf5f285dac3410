"""The `SamplingProtocol` record a fit reports for an objective that generates what it is
scored on: the objective's protocol, completed with what the pass and the metrics know."""

import dataclasses

from dew._pass import PassResult
from dew.metrics import DescribesFeatures, MetricSet
from dew.objectives.base import ReportsSampling
from dew.telemetry.records import SamplingProtocol

__all__ = ["sampling_record"]


def sampling_record(
    objective: ReportsSampling,
    metric_set: MetricSet,
    result: PassResult | None = None,
    event_key: str | None = None,
) -> SamplingProtocol:
    """`objective`'s record of the pass `result` under `event_key` (the fit's record when
    `result` is `None`), with the feature definition of each metric that reads the samples
    through a network and the identity of the pass's conditioning data."""
    features = {
        metric.name: metric.feature_definition()
        for metric in metric_set.flat_metrics
        if isinstance(metric, DescribesFeatures)
    }
    if result is None:
        return dataclasses.replace(objective.sampling_record(0, event_key=None), features=features)
    record = objective.sampling_record(
        result.records, event_key=event_key, batch=result.first_batch
    )
    return dataclasses.replace(
        record, features=features, conditioning_sha256=result.conditioning_sha256
    )
