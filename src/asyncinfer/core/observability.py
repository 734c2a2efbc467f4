"""Powertools Logger, Tracer and Metrics for the Lambdas, built one way everywhere.

Each Lambda module calls :func:`powertools` once at import and wraps its handler with
:func:`instrument`: structured JSON logs with the Lambda context (the job id becomes the
correlation id where a handler knows it), an X-Ray trace of the invocation, and EMF metrics in
namespace ``asyncinfer`` flushed at the end of the invocation. On the local stack the tracer is
off (``POWERTOOLS_TRACE_DISABLED``) and metrics are not printed (``POWERTOOLS_METRICS_DISABLED``;
:func:`single` honours it too, which Powertools' ``single_metric`` does not).

Most invocations (a GET, a cancel) add no metric; Powertools then warns "No application metrics
to publish" at every flush. That warning is expected here and filtered out.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)

NAMESPACE = "asyncinfer"

Handler = Callable[[dict[str, Any], Any], Any]


def powertools(service: str) -> tuple[Logger, Tracer, Metrics]:
    """``(logger, tracer, metrics)`` for ``service``."""
    return (
        Logger(service=service),
        Tracer(service=service),
        Metrics(namespace=NAMESPACE, service=service),
    )


def instrument(
    logger: Logger,
    tracer: Tracer,
    metrics: Metrics,
    *,
    correlation_id_path: str | None = None,
) -> Callable[[Handler], Handler]:
    """Decorate a Lambda handler with the logger's context injection, the tracer and the
    metrics flush (in that order, outermost first)."""

    def wrap(fn: Handler) -> Handler:
        traced = tracer.capture_lambda_handler(metrics.log_metrics(fn))
        return logger.inject_lambda_context(
            traced, correlation_id_path=correlation_id_path, clear_state=True
        )

    return wrap


def single(
    name: str,
    *,
    value: float = 1,
    unit: MetricUnit = MetricUnit.Count,
    dimensions: Mapping[str, str],
) -> None:
    """Print one EMF metric now, with its own ``dimensions`` (Powertools' ``single_metric``, so
    that they do not apply to the invocation's other metrics), in namespace ``asyncinfer``;
    nothing when metrics are disabled (``POWERTOOLS_METRICS_DISABLED``, as on the local
    stack)."""
    if is_metrics_disabled():
        return
    with single_metric(name=name, unit=unit, value=value, namespace=NAMESPACE) as metric:
        for key, val in dimensions.items():
            metric.add_dimension(name=key, value=val)
