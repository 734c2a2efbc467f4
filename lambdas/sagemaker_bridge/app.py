"""SQS (each model's job queue) -> SageMaker InvokeEndpointAsync."""

from asyncinfer.functions.sagemaker_bridge import handler

__all__ = ["handler"]
