"""The transport half of the client's protocol: the steps an operation yields (:class:`Call`:
send this HTTP request; :class:`Sleep`: wait), the retry policy, sending with retries, and
reading an answer into a result or the mapped :class:`~asyncinfer.client.errors.APIError`.

No I/O here: the drivers (:class:`~asyncinfer.client.Client` with ``httpx.Client``,
:class:`~asyncinfer.client.AsyncClient` with ``httpx.AsyncClient``) perform the steps. The
operations themselves are in :mod:`asyncinfer.client._protocol`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx

from asyncinfer.client.errors import (
    ERROR_CLASSES,
    STATUS_CLASSES,
    APIConnectionError,
    APIError,
    InternalServerError,
)

T = TypeVar("T")

#: HTTP statuses retried (for calls that may be retried).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Call:
    """One HTTP request to send. ``url`` is absolute; ``timeout`` in seconds."""

    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    timeout: float = 30.0
    #: True when resending is safe (idempotent call, or a submit with an idempotency key).
    retry: bool = True


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds`` before the next step."""

    seconds: float


Outcome = httpx.Response | httpx.TransportError
Step = Call | Sleep
Operation = Generator[Step, Outcome | None, T]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: before retry ``n`` (0-based) wait a uniform random
    time in ``[0, min(max_delay, base_delay * 2**n)]`` seconds, or the server's ``Retry-After``
    when it asks for longer (capped at ``max_delay``). ``max_retries`` retries at most."""

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        d = random.uniform(0.0, min(self.max_delay, self.base_delay * (2**attempt)))
        if retry_after is not None:
            d = max(d, min(retry_after, self.max_delay))
        return d


# ------------------------------------------------------------------------- responses
def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_from_response(resp: httpx.Response) -> APIError:
    """The exception for an error response: the class of the body's ``error.code`` (spec), else
    of the HTTP status."""
    status = resp.status_code
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    code: str | None = None
    message = ""
    details: list[dict[str, Any]] = []
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code") or "") or None
        message = str(err.get("message") or "")
        raw_details = err.get("details")
        if isinstance(raw_details, list):
            details = [d if isinstance(d, dict) else {"message": str(d)} for d in raw_details]
    elif isinstance(body, dict) and isinstance(body.get("message"), str):
        message = body["message"]  # API Gateway's own errors: {"message": "Forbidden"}
    elif isinstance(body, str):
        message = body.strip()[:500]
    cls = (ERROR_CLASSES.get(code) if code else None) or STATUS_CLASSES.get(status)
    if cls is None:
        cls = InternalServerError if status >= 500 else APIError
    if code is None:
        code = cls.code if cls is not APIError else f"http_{status}"
    return cls(
        message or resp.reason_phrase or f"HTTP {status}",
        status=status,
        code=code,
        details=details,
        body=body,
    )


def send(call: Call, policy: RetryPolicy) -> Generator[Step, Outcome | None, httpx.Response]:
    """Send ``call``, retrying per ``policy``: on 429/5xx and transport errors when
    ``call.retry``; on connect errors (nothing was sent) always. Returns the final response,
    which may be an error response. Raises :class:`APIConnectionError`."""
    resp, _ = yield from send_counted(call, policy)
    return resp


def send_counted(
    call: Call, policy: RetryPolicy
) -> Generator[Step, Outcome | None, tuple[httpx.Response, int]]:
    """:func:`send`, also returning how many times the request was sent."""
    attempt = 0
    while True:
        outcome = yield call
        if isinstance(outcome, httpx.TransportError):
            safe = call.retry or isinstance(outcome, (httpx.ConnectError, httpx.ConnectTimeout))
            if safe and attempt < policy.max_retries:
                yield Sleep(policy.delay(attempt))
                attempt += 1
                continue
            raise APIConnectionError(
                f"{call.method} {call.url}: {type(outcome).__name__}: {outcome}"
            ) from outcome
        assert outcome is not None
        if call.retry and outcome.status_code in RETRY_STATUSES and attempt < policy.max_retries:
            yield Sleep(policy.delay(attempt, _retry_after(outcome)))
            attempt += 1
            continue
        return outcome, attempt + 1


def json_of(resp: httpx.Response) -> Any:
    """The JSON body of a successful response; raises the mapped :class:`APIError` otherwise."""
    if resp.status_code >= 400:
        raise error_from_response(resp)
    try:
        return resp.json()
    except ValueError:
        raise APIError(
            "the response is not JSON",
            status=resp.status_code,
            code="invalid_response",
            body=resp.text,
        ) from None
