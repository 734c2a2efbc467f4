"""API Lambda entry point: API Gateway REST proxy events -> asyncinfer's REST API."""

from asyncinfer.api.app import handler

__all__ = ["handler"]
