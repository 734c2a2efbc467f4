"""API key authorizer entry point: API Gateway REQUEST authorizer events -> the API key as the
usage identifier (asyncinfer.openai_api.authorizer)."""

from asyncinfer.openai_api.authorizer import handler

__all__ = ["handler"]
