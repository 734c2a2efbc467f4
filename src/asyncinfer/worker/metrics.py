"""Job metrics of the worker as CloudWatch embedded metric format (EMF) lines, through the one
definition of the job metrics (:mod:`asyncinfer.core.job_metrics`): ``JobsSucceeded``,
``JobsFailed`` (count), ``QueueSeconds``, ``RunSeconds``, ``ComputeSeconds`` (seconds) and
``CostUSD`` (dollars, for entries with a ``price_per_hour``), namespace ``asyncinfer``, dimension
``Model`` only, the names the CDK dashboard and alarms read. CloudWatch Logs extracts EMF from
the container's log stream. Emitted only in AWS (``ASYNCINFER_COMPUTE`` set); the local stack
stays readable."""

from __future__ import annotations

from collections.abc import Callable

from asyncinfer.core import job_metrics as jm
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.view import render_job

#: job view ``metrics`` key -> job metric name.
VIEW_METRICS: tuple[tuple[str, str], ...] = (
    ("queue_seconds", jm.QUEUE_SECONDS),
    ("run_seconds", jm.RUN_SECONDS),
    ("compute_seconds", jm.COMPUTE_SECONDS),
    ("cost_usd", jm.COST_USD),
)


def job_points(record: JobRecord) -> list[tuple[str, float]]:
    """The ``(metric name, value)`` pairs of one terminal job record: a count of 1 under
    ``JobsSucceeded`` or ``JobsFailed`` (any other terminal status), then each of
    :data:`VIEW_METRICS` that the job's view has (``None`` values are left out)."""
    view = render_job(record)
    name = jm.JOBS_SUCCEEDED if record["status"] == "succeeded" else jm.JOBS_FAILED
    points: list[tuple[str, float]] = [(name, 1.0)]
    for key, metric in VIEW_METRICS:
        value = view["metrics"].get(key)
        if value is not None:
            points.append((metric, float(value)))
    return points


def emit_job_metrics(record: JobRecord, *, write: Callable[[str], object] | None = None) -> None:
    """Emit the metrics of one terminal job record (:func:`job_points`), one EMF line each
    (:func:`asyncinfer.core.job_metrics.emit`; ``write`` defaults to stdout)."""
    model = record["model"]
    for name, value in job_points(record):
        jm.emit(name, value, jm.UNITS[name], model, write=write)
