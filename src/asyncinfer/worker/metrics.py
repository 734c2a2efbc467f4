"""Job metrics of the worker as CloudWatch embedded metric format (EMF) lines, through Powertools
Metrics: ``JobsSucceeded``, ``JobsFailed`` (count) and ``QueueSeconds``, ``RunSeconds`` (seconds),
namespace ``asyncinfer``, dimension ``Model``, the names the CDK dashboard and alarms read.
CloudWatch Logs extracts EMF from the container's log stream. Emitted only in AWS
(``ASYNCINFER_COMPUTE`` set); the local stack stays readable."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from asyncinfer.jobview import render_job

NAMESPACE = "asyncinfer"


def emit_job_metrics(record: dict[str, Any]) -> None:
    """Emit the metrics of one terminal job record."""
    model = record["model"]
    view = render_job(record)
    name = "JobsSucceeded" if record["status"] == "succeeded" else "JobsFailed"
    points: list[tuple[str, MetricUnit, float]] = [(name, MetricUnit.Count, 1)]
    for key, metric_id in (("queue_seconds", "QueueSeconds"), ("run_seconds", "RunSeconds")):
        value = view["metrics"].get(key)
        if value is not None:
            points.append((metric_id, MetricUnit.Seconds, float(value)))
    for metric_name, unit, value in points:
        with single_metric(name=metric_name, unit=unit, value=value, namespace=NAMESPACE) as metric:
            metric.add_dimension(name="Model", value=model)
