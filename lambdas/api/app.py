"""API Lambda: API Gateway REST proxy events -> asyncinfer's REST API."""

from asyncinfer.functions.api import handler

__all__ = ["handler"]
