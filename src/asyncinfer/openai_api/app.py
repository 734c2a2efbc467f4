"""The ``/openai/v1`` surface (spec openai.md): a Powertools resolver of its own, which the API
Lambda's :func:`asyncinfer.functions.api.app.handler` hands every request under ``/openai/`` to.

A second resolver rather than routers in the ``/v1`` app, because the two surfaces differ in
what every route shares: the error body (OpenAI's ``{"error": {"message", "type", "param",
"code"}}`` here, :mod:`asyncinfer.openai_api.errors`), the bodies taken (``multipart/form-data``
here; strict JSON only on ``/v1``, :mod:`asyncinfer.functions.api.body`), and the OpenAPI document
(``/v1/openapi.json`` describes ``/v1`` only; this surface is OpenAI's, described by its API
reference and ``docs/openai.md``).

Routers mount here under :data:`PREFIX`: Files (:mod:`.routes_files`) and, next to it, Batches.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.core.errors import ApiError, NotFound
from asyncinfer.functions.api.body import request_error
from asyncinfer.openai_api.errors import from_api_error
from asyncinfer.openai_api.routes_batches import router as batches_router
from asyncinfer.openai_api.routes_files import router as files_router

#: A child of the API Lambda's logger (same service, same correlation id).
logger = Logger(service="asyncinfer-api", child=True)

#: The base path of the surface (spec openai.md, "Base path and auth").
PREFIX = "/openai/v1"

app = APIGatewayRestResolver(enable_validation=True)
app.include_router(files_router, prefix=PREFIX)
app.include_router(batches_router, prefix=PREFIX)


def error_response(exc: ApiError) -> Response:
    """OpenAI's error body for ``exc`` at its HTTP status, with the error's own headers
    (``Retry-After`` of a 429)."""
    status, body = from_api_error(exc)
    return Response(status, "application/json", body, exc.headers())


@app.exception_handler(ApiError)
def on_api_error(exc: ApiError) -> Response:
    if exc.http_status >= 500:
        logger.exception("api error")
    return error_response(exc)


@app.exception_handler(RequestValidationError)
def on_validation_error(exc: RequestValidationError) -> Response:
    return error_response(request_error(list(exc.errors())))


@app.not_found
def on_not_found(exc: NotFoundError) -> Response:
    """No route for this method and path: 404, as OpenAI answers an unknown URL."""
    event = app.current_event
    return error_response(NotFound(f"Invalid URL ({event.http_method} {event.path})"))


@app.exception_handler(Exception)
def on_unexpected(exc: Exception) -> Response:
    logger.exception("unexpected error")
    return error_response(ApiError("internal error"))


def handle(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Answer one proxy event of the ``/openai/v1`` surface (called by the API Lambda's
    handler, which has already turned ``HEAD`` into ``GET``)."""
    return app.resolve(event, context)
