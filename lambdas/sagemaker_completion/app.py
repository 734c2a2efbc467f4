"""SageMaker async notifications (SNS) -> job transitions and events."""

from asyncinfer.functions.sagemaker_completion import handler

__all__ = ["handler"]
