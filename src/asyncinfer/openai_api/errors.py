"""OpenAI's error body on the ``/openai/v1`` surface (spec openai.md, "Base path and auth"):
``{"error": {"message", "type", "param", "code"}}`` with the HTTP statuses of api.md, so that the
``openai`` SDK raises its own exception classes (``BadRequestError`` for 400,
``AuthenticationError`` 401, ``NotFoundError`` 404, ``ConflictError`` 409,
``UnprocessableEntityError`` 422,
``RateLimitError`` 429, ``InternalServerError`` 5xx). Errors are mapped by type, never by text.
"""

from __future__ import annotations

from typing import Any

from asyncinfer.core.errors import ApiError

#: OpenAI's ``error.type`` per HTTP status (its API reference, "Error codes").
_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The body ``{"error": {"message", "type", "param", "code"}}`` for an HTTP ``status``.

    ``type`` follows OpenAI's names (``invalid_request_error``, ``authentication_error``,
    ``rate_limit_error``; ``server_error`` for 5xx).
    ``param`` names the offending field where known.
    """
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def from_api_error(err: ApiError) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of an :class:`~asyncinfer.core.errors.ApiError` on this surface: the same
    status as api.md, the spec's error ``code`` as OpenAI's ``code``, and the first detail's field
    (dotted) as ``param``."""
    param = None
    if err.details:
        field = err.details[0].get("field")
        param = str(field) if field else None
    return err.http_status, openai_error_body(
        err.http_status, err.message, param=param, code=err.code
    )


def gateway_error_body(status: int, code: str, message: str) -> dict[str, Any]:
    """The body of an error API Gateway answers itself (a gateway response: throttling, a
    missing or wrong key, a body over 10 MB), readable on both surfaces: api.md's
    ``{"error": {"code", "message", "details"}}`` with OpenAI's ``type`` and ``param`` added
    (gateway responses are per API, not per path). The local gateway sends the same."""
    body = openai_error_body(status, message, code=code)
    body["error"]["details"] = []
    return body
