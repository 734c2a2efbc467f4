"""SNS (SageMaker async success and error topics) -> job record transition and job event.
Logic: :mod:`asyncinfer.sagemaker.completion`."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.observability import NAMESPACE, instrument, powertools
from asyncinfer.sagemaker.completion import Completion

logger, tracer, metrics = powertools("sagemaker-completion")
_completion: Completion | None = None


def emit(name: str, value: float, unit: str, model: str) -> None:
    """One EMF metric with the ``Model`` dimension (the dashboard's job metrics)."""
    with single_metric(name=name, unit=MetricUnit(unit), value=value, namespace=NAMESPACE) as m:
        m.add_dimension(name="Model", value=model)


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Handle every SNS record; an exception makes Lambda retry the whole (one-record) event."""
    global _completion
    if _completion is None:
        _completion = Completion.from_env(logger=logger, emit=emit)
    return _completion.handle_sns_event(event)
