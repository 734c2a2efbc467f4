"""The REST API: Powertools' REST event handler over the job service. ``handler`` (the Lambda
entry point) is :func:`asyncinfer.functions.api.app.handler`, imported on first use so that
``schemas`` can be read without building the resolver."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "handler":
        from asyncinfer.functions.api.app import handler

        return handler
    raise AttributeError(name)
