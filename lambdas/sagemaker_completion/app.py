"""SNS (SageMaker async success and error topics) -> job record transition and job event.
Logic: :mod:`asyncinfer.sagemaker.completion`."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer import job_metrics
from asyncinfer.observability import instrument, powertools
from asyncinfer.sagemaker.completion import Completion

logger, tracer, metrics = powertools("sagemaker-completion")
_completion: Completion | None = None


def emit(name: str, value: float, unit: str, model: str) -> None:
    """One job metric with the ``Model`` dimension only (:mod:`asyncinfer.job_metrics`): the
    metric the failure-rate alarm and the dashboard read. Powertools' ``single_metric`` would add
    its ``service`` dimension here, making a metric those never see."""
    job_metrics.emit(name, value, unit, model)


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Handle every SNS record; an exception makes Lambda retry the whole (one-record) event."""
    global _completion
    if _completion is None:
        _completion = Completion.from_env(logger=logger, emit=emit)
    return _completion.handle_sns_event(event)
