"""Exceptions of the client. Every HTTP error of the API is an :class:`APIError` subclass chosen
by the spec's error ``code`` (``{"error": {"code", "message", "details"}}``), with ``.code``,
``.status`` (HTTP status), ``.message`` and ``.details`` (for ``invalid_request``, one
``{"field", "message", "type"}`` object per bad field)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncinfer.client.models import Job


class ClientError(Exception):
    """Base of every exception the client raises on purpose."""


class ConfigurationError(ClientError):
    """No API URL or API key could be found (arguments, ``ASYNCINFER_URL`` /
    ``ASYNCINFER_API_KEY``, or ``.asyncinfer/local.json``)."""


class APIConnectionError(ClientError):
    """The API could not be reached (connection refused or reset, DNS, timeout), after the
    retries the call allows."""


class WaitTimeout(ClientError, TimeoutError):
    """:meth:`Client.wait` gave up before the job reached a terminal status. ``.job`` is the job
    as last seen."""

    def __init__(self, job: Job, timeout: float) -> None:
        super().__init__(f"job {job.id} is still {job.status} after {timeout:g} s")
        self.job = job
        self.timeout = timeout


class WebhookVerificationError(ClientError, ValueError):
    """A webhook request failed verification: a header is missing, the timestamp is outside the
    tolerance, or no signature matches."""


class APIError(ClientError):
    """An HTTP error answered by the API (or by the gateway in front of it).

    Attributes:
        code: the spec's error code (``not_found``, ``conflict``, ...); ``forbidden`` for the
            gateway's 403, ``http_<status>`` when the body carries no code.
        status: the HTTP status.
        message: the error message of the body.
        details: the ``details`` list of the body (may be empty).
    """

    code: str = "api_error"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        details: list[dict[str, Any]] | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code
        self.details: list[dict[str, Any]] = details or []
        self.body = body

    def __str__(self) -> str:
        text = f"{self.code} (HTTP {self.status}): {self.message}"
        fields = [d.get("field") for d in self.details if isinstance(d, dict) and d.get("field")]
        if fields:
            text += f" [fields: {', '.join(str(f) for f in fields)}]"
        return text


class InvalidJSONError(APIError):
    """``invalid_json`` (HTTP 400): the request body was not valid JSON."""

    code = "invalid_json"


class InvalidRequestError(APIError):
    """``invalid_request`` (HTTP 422): schema violation, unknown model or out-of-range value;
    ``details`` names the fields."""

    code = "invalid_request"


class AuthenticationError(APIError):
    """``forbidden`` (HTTP 403): the gateway refused the API key (missing or unknown)."""

    code = "forbidden"


class NotFoundError(APIError):
    """``not_found`` (HTTP 404): no such job for this API key (or no such route)."""

    code = "not_found"


class ConflictError(APIError):
    """``conflict`` (HTTP 409): an idempotency key reused with another body, or a cancel of a
    finished job."""

    code = "conflict"


class PayloadTooLargeError(APIError):
    """``payload_too_large`` (HTTP 413): upload large inputs with :meth:`Client.upload`."""

    code = "payload_too_large"


class RateLimitedError(APIError):
    """``rate_limited`` (HTTP 429), after the retries the call allows."""

    code = "rate_limited"


class InternalServerError(APIError):
    """``internal`` (HTTP 5xx), after the retries the call allows."""

    code = "internal"


#: Exception class per spec error code.
ERROR_CLASSES: dict[str, type[APIError]] = {
    cls.code: cls
    for cls in (
        InvalidJSONError,
        InvalidRequestError,
        AuthenticationError,
        NotFoundError,
        ConflictError,
        PayloadTooLargeError,
        RateLimitedError,
        InternalServerError,
    )
}

#: Exception class per HTTP status, for bodies without a (known) code.
STATUS_CLASSES: dict[int, type[APIError]] = {
    400: InvalidJSONError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    429: RateLimitedError,
}
