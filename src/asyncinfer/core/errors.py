"""The error taxonomy: one place that says what is retryable, what is permanent, and what each
error means over HTTP.

Two families:

* :class:`ApiError` and its subclasses are raised by the API path. Each carries the spec's error
  ``code`` and ``http_status`` (``../shared/spec/api.md``, "Errors"); the API maps them to responses
  by type, never by message text.
* :class:`JobError` and its subclasses are raised while a worker runs a job. Each carries the job
  error ``code`` of the spec ("Error codes of jobs") and whether another attempt could succeed
  (``retryable``), in the manner of dramatiq's Retry/permanent split.
"""

from __future__ import annotations

from typing import Any, ClassVar


class AsyncInferError(Exception):
    """Base of every error this package raises on purpose."""


# --------------------------------------------------------------------------- API errors
class ApiError(AsyncInferError):
    """An error that becomes an HTTP response ``{"error": {"code", "message", "details"}}``.

    Args:
        message: human-readable text for the ``message`` field.
        details: list of objects for the ``details`` field; for validation errors each is
            ``{"field": "input.max_new_tokens", "message": "...", "type": "..."}``.
    """

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []

    def body(self) -> dict[str, Any]:
        """The response body of the spec: ``{"error": {"code", "message", "details"}}``."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def headers(self) -> dict[str, str]:
        """HTTP headers the response carries besides its content type (none by default)."""
        return {}


class InvalidJson(ApiError):
    """The body is not valid JSON (HTTP 400)."""

    code = "invalid_json"
    http_status = 400


class Unauthorized(ApiError):
    """No API key, or not a valid one, on the ``/openai/v1`` surface (HTTP 401, OpenAI's
    ``invalid_api_key``, so that the ``openai`` SDK raises ``AuthenticationError``; spec
    openai.md). The ``/v1`` surface answers the same case 403 ``forbidden`` (api.md)."""

    code = "invalid_api_key"
    http_status = 401


class InvalidMultipart(ApiError):
    """A ``multipart/form-data`` body that cannot be parsed (HTTP 400)."""

    code = "invalid_multipart"
    http_status = 400


class UnsupportedMediaType(ApiError):
    """A body of a content type the route does not take (HTTP 415, RFC 9110 15.5.16)."""

    code = "unsupported_media_type"
    http_status = 415


class InvalidRequest(ApiError):
    """Schema violation, unknown model or out-of-range value (HTTP 422); ``details`` name fields."""

    code = "invalid_request"
    http_status = 422


class NotFound(ApiError):
    """No such job for this tenant (HTTP 404). Another tenant's job is also 404, never 403."""

    code = "not_found"
    http_status = 404


class MethodNotAllowed(ApiError):
    """The path exists but not with this HTTP method (HTTP 405, RFC 9110 15.5.6); the response
    carries an ``Allow`` header naming the methods it has."""

    code = "method_not_allowed"
    http_status = 405


class Conflict(ApiError):
    """Idempotency key reused with another body, or cancel of a finished job (HTTP 409)."""

    code = "conflict"
    http_status = 409


class PayloadTooLarge(ApiError):
    """The request body is larger than the API accepts (HTTP 413)."""

    code = "payload_too_large"
    http_status = 413


class RateLimited(ApiError):
    """Too many requests (HTTP 429), e.g. more concurrent ``?wait`` long polls than a tenant may
    hold (:mod:`asyncinfer.jobs.waits`).

    Args:
        retry_after: seconds after which a retry may succeed; sent as ``Retry-After``
            (RFC 9110 10.2.3) when given.
    """

    code = "rate_limited"
    http_status = 429

    def __init__(
        self,
        message: str,
        details: list[dict[str, Any]] | None = None,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message, details)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """``Retry-After`` (whole seconds) when the error knows it."""
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


class InternalError(ApiError):
    """A fault of the service, never of the input (HTTP 500)."""

    code = "internal"
    http_status = 500


# --------------------------------------------------------------------------- job errors
class JobError(AsyncInferError):
    """An error that ends or interrupts one attempt at a job.

    ``code`` is the job error code stored in the job's ``error`` field when the job fails.
    ``retryable`` says whether the message goes back to the queue for another attempt
    (``attempts + 1``, until the queue's maxReceiveCount sends it to the dead-letter queue) or the
    job fails at once.
    """

    code: ClassVar[str] = "model_error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def as_dict(self) -> dict[str, str]:
        """The job's ``error`` field: ``{"code": ..., "message": ...}``."""
        return {"code": self.code, "message": self.message}


class InvalidInput(JobError):
    """The model rejects this input (permanent): the job fails at once with ``invalid_input``."""

    code = "invalid_input"


class ModelError(JobError):
    """The model failed on this input in a way another attempt will not fix (permanent)."""

    code = "model_error"


class TransientError(JobError):
    """A failure another attempt may not meet (retryable): throttling, a lost connection."""

    code = "model_error"
    retryable = True


class OutOfMemory(JobError):
    """The batch did not fit in memory (permanent for the jobs in it)."""

    code = "out_of_memory"


class JobTimeout(JobError):
    """The attempt ran past the job's ``timeout_seconds`` (permanent)."""

    code = "timeout"


class JobCancelled(JobError):
    """The job was cancelled while it ran; the worker records ``cancelled``.

    Attributes:
        partial: the output produced before the cancel (kept on the job), or ``None``.
    """

    code = "cancelled"

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial


class JobExpired(JobError):
    """The job's ``ttl_seconds`` passed while it waited for its first attempt (permanent; the job
    becomes ``expired``, never ``failed``: spec, "Job lifecycle")."""

    code = "expired"


class MaxAttempts(JobError):
    """Every attempt the job was given was lost or failed retryably: its message reached the
    dead-letter queue, or its lease lapsed on the last attempt (permanent)."""

    code = "max_attempts"


def job_error(code: str, message: str) -> JobError:
    """The :class:`JobError` of a job error ``code`` (spec, "Error codes of jobs") that came
    from outside the worker (a SageMaker container's failure body): the class of that code, or
    :class:`ModelError` carrying the code as given for one this taxonomy does not name.
    ``as_dict()`` of the result gives ``{"code": code, "message": message}``."""
    for cls in (
        InvalidInput,
        ModelError,
        OutOfMemory,
        JobTimeout,
        JobCancelled,
        JobExpired,
        MaxAttempts,
    ):
        if cls.code == code:
            return cls(message)
    err = ModelError(message)
    err.code = code  # type: ignore[misc]
    return err


class WorkerStopping(AsyncInferError):
    """Raised inside a model run when the worker must give the job back (SIGTERM past the drain
    deadline). Not a job error: the job returns to ``queued`` and its message becomes visible."""


# --------------------------------------------------------------------------- store errors
class TransitionRefused(AsyncInferError):
    """A conditional write found the job in another status or attempt than expected.

    Attributes:
        current: the job record as it is now (``None`` if it does not exist).
    """

    def __init__(self, message: str, current: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.current = current


class SweepFailed(AsyncInferError):
    """One or more steps of a sweep raised (each step runs even when another failed; the sweeper
    Lambda raises this at the end so that its error metric and alarm show the fault)."""


class ConfigError(AsyncInferError):
    """Settings that cannot work together; the message lists every problem at once."""


class CatalogueError(ConfigError):
    """The model catalogue (``models.yaml``, spec ``models.md``) cannot be used.

    Attributes:
        where: the file (or ``"models catalogue"`` for one built in memory).
        problems: every problem, each ``models[i].field: what is wrong`` (with the id if known).
    """

    def __init__(self, where: str, problems: list[str]) -> None:
        self.where = where
        self.problems = list(problems)
        n = len(self.problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"invalid model catalogue {where} ({n} problem{'s' * (n != 1)}):\n{lines}")
