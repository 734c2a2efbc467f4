"""The one definition of the job metrics: what the worker and the SageMaker completion Lambda
publish, and what the CDK app's alarms and dashboard read (``infra/components/monitoring.py``
imports these names, so a metric and the alarm on it cannot drift apart).

Metrics: ``JobsSucceeded``, ``JobsFailed`` (Count), ``QueueSeconds``, ``RunSeconds``,
``ComputeSeconds`` (Seconds; a job's share of its worker's compute time, shared/spec/models.md
"What a job shows") and ``CostUSD`` (unit ``None``: US dollars, ``ComputeSeconds`` x the entry's
``price_per_hour`` / 3600; only for entries with a price), and a worker's start-up split
(``WeightsDownloadSeconds``, ``ModelLoadSeconds``, ``FirstTokenSeconds``; Seconds), namespace
``asyncinfer``, exactly one dimension, ``Model``. CloudWatch matches a metric by its full
dimension set, so an extra dimension (Powertools adds ``service`` whenever
``POWERTOOLS_SERVICE_NAME`` is set, as in every Lambda) makes a different metric that alarms
keyed on ``Model`` alone never see; :func:`emf_line` writes the EMF document itself for that
reason.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from aws_lambda_powertools.metrics.functions import is_metrics_disabled

NAMESPACE = "asyncinfer"
#: The only dimension of a job metric.
DIMENSION = "Model"
JOBS_SUCCEEDED = "JobsSucceeded"
JOBS_FAILED = "JobsFailed"
QUEUE_SECONDS = "QueueSeconds"
RUN_SECONDS = "RunSeconds"
COMPUTE_SECONDS = "ComputeSeconds"
COST_USD = "CostUSD"
#: A worker's time to ready, split (issue 13 item 4): one point per worker start
#: (``WeightsDownloadSeconds``, ``ModelLoadSeconds``) and per worker's first job
#: (``FirstTokenSeconds``: from ready to its first output token).
DOWNLOAD_SECONDS = "WeightsDownloadSeconds"
LOAD_SECONDS = "ModelLoadSeconds"
FIRST_TOKEN_SECONDS = "FirstTokenSeconds"
#: metric name -> CloudWatch unit.
UNITS: dict[str, str] = {
    JOBS_SUCCEEDED: "Count",
    JOBS_FAILED: "Count",
    QUEUE_SECONDS: "Seconds",
    RUN_SECONDS: "Seconds",
    COMPUTE_SECONDS: "Seconds",
    COST_USD: "None",  # CloudWatch has no currency unit
    DOWNLOAD_SECONDS: "Seconds",
    LOAD_SECONDS: "Seconds",
    FIRST_TOKEN_SECONDS: "Seconds",
}


def emf_line(name: str, value: float, model: str, *, timestamp_ms: int | None = None) -> str:
    """One CloudWatch Embedded Metric Format document (a JSON line) for job metric ``name`` of
    ``model``, with the ``Model`` dimension only. Raises ``KeyError`` for an unknown name."""
    unit = UNITS[name]
    doc = {
        "_aws": {
            "Timestamp": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [[DIMENSION]],
                    "Metrics": [{"Name": name, "Unit": unit}],
                }
            ],
        },
        DIMENSION: model,
        name: value,
    }
    return json.dumps(doc, separators=(",", ":"))


def emit(
    name: str, value: float, unit: str, model: str, *, write: Callable[[str], object] | None = None
) -> None:
    """Print one job metric as EMF on stdout (CloudWatch Logs extracts it). ``unit`` must be
    the metric's unit in :data:`UNITS` (``ValueError`` otherwise); ``write`` defaults to a
    flushed ``print``. Nothing is written when ``POWERTOOLS_METRICS_DISABLED`` is set."""
    if UNITS.get(name) != unit:
        raise ValueError(f"job metric {name!r} has unit {UNITS.get(name)!r}, not {unit!r}")
    if is_metrics_disabled():  # POWERTOOLS_METRICS_DISABLED, as on the local stack
        return
    line = emf_line(name, value, model)
    if write is None:
        print(line, file=sys.stdout, flush=True)
    else:
        write(line)
