"""SQS (each model's job queue) -> SageMaker InvokeEndpointAsync, with partial batch failures.
Logic: :mod:`asyncinfer.sagemaker.bridge`."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.sagemaker.bridge import Bridge

logger = Logger()
tracer = Tracer()
metrics = Metrics()
_bridge: Bridge | None = None


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Returns ``{"batchItemFailures": [{"itemIdentifier": message_id}, ...]}``."""
    global _bridge
    if _bridge is None:
        _bridge = Bridge.from_env(logger=logger, metrics=metrics)
    return _bridge.handle_sqs_event(event)
