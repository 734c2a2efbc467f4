"""Scheduled every minute (EventBridge): publish backlog-per-task metrics for ECS scaling.
Logic: :mod:`asyncinfer.scaling.backlog`."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.core.observability import instrument, powertools
from asyncinfer.scaling.backlog import BacklogConfig, publish_backlog_metrics

logger, tracer, metrics = powertools("backlog-metric")


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Measure every model's queue and service; print the metrics as EMF; return
    ``{"models": [...]}``."""
    points = publish_backlog_metrics(BacklogConfig.from_env())
    logger.info("backlog", extra={"models": points})
    return {"models": points}
