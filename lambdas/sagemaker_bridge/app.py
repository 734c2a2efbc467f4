"""SQS (each model's job queue) -> SageMaker InvokeEndpointAsync, with partial batch failures.
Logic: :mod:`asyncinfer.sagemaker.bridge`."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.observability import instrument, powertools
from asyncinfer.sagemaker.bridge import Bridge

logger, tracer, metrics = powertools("sagemaker-bridge")
_bridge: Bridge | None = None


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Returns ``{"batchItemFailures": [{"itemIdentifier": message_id}, ...]}``."""
    global _bridge
    if _bridge is None:
        _bridge = Bridge.from_env(logger=logger, metrics=metrics)
    return _bridge.handle_sqs_event(event)
