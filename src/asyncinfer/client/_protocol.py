"""The protocol of the API, without I/O: what to send, how to read the answer, when to retry.

Every operation is a generator that yields :class:`Call` (send this HTTP request; the driver sends
back an ``httpx.Response`` or the ``httpx.TransportError`` it raised) or :class:`Sleep` (wait this
many seconds) and returns its result. :class:`~asyncinfer.client.Client` drives them with
``httpx.Client`` and ``time.sleep``, :class:`~asyncinfer.client.AsyncClient` with
``httpx.AsyncClient`` and ``asyncio.sleep``: one implementation, two transports.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx

from asyncinfer import __version__
from asyncinfer.client.errors import (
    ERROR_CLASSES,
    STATUS_CLASSES,
    APIConnectionError,
    APIError,
    ConfigurationError,
    InternalServerError,
    PayloadTooLargeError,
    RateLimitedError,
    WaitTimeout,
)
from asyncinfer.client.models import Job, JobPage, ModelInfo, Upload, WebhookSecret

T = TypeVar("T")

#: Where the local stack writes its URL and key (``asyncinfer local --state-dir``), relative to
#: the working directory.
LOCAL_JSON = Path(".asyncinfer") / "local.json"
#: Longest ``?wait=`` the API holds a request, seconds (spec: 0..20).
MAX_LONG_POLL = 20.0
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


#: How long :meth:`wait` sleeps between plain reads while its long polls are refused 429
#: (the service's bound on concurrent ``?wait`` polls per key), seconds.
RATE_LIMITED_POLL_SECONDS = 2.0


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


@dataclass(frozen=True)
class Config:
    """Where the API is and how to call it. ``timeout`` is the per-request timeout in seconds
    (long-polls add their ``wait`` to it)."""

    base_url: str
    api_key: str
    timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)


def _read_local_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve_config(
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    timeout: float = 30.0,
    max_retries: int = 3,
    local_json: str | os.PathLike[str] | None = None,
) -> Config:
    """The client's configuration: arguments first, then ``ASYNCINFER_URL`` /
    ``ASYNCINFER_API_KEY``, then the local stack's ``.asyncinfer/local.json`` (its key only
    when its ``api_url`` is the URL in use). Raises :class:`ConfigurationError`."""
    url = base_url or os.environ.get("ASYNCINFER_URL") or None
    key = api_key or os.environ.get("ASYNCINFER_API_KEY") or None
    if url is None or key is None:
        local = _read_local_json(Path(local_json) if local_json else LOCAL_JSON)
        if url is None and local.get("api_url"):
            url = str(local["api_url"])
        if key is None and local.get("api_key") and url == local.get("api_url"):
            key = str(local["api_key"])
    if not url:
        raise ConfigurationError(
            "no API URL: pass base_url, set ASYNCINFER_URL, or start the local stack "
            "(asyncinfer local writes .asyncinfer/local.json)"
        )
    if not key:
        raise ConfigurationError("no API key: pass api_key or set ASYNCINFER_API_KEY")
    return Config(
        base_url=url.rstrip("/"),
        api_key=key,
        timeout=timeout,
        retry=RetryPolicy(max_retries=max_retries),
    )


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


# ------------------------------------------------------------------------- operations
class Protocol:
    """Builds the calls of each API operation for one :class:`Config`."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        retry: bool = True,
    ) -> Call:
        hdrs = {
            "x-api-key": self.config.api_key,
            "accept": "application/json",
            "user-agent": f"asyncinfer-python/{__version__}",
        }
        if json_body is not None:
            hdrs["content-type"] = "application/json"
        hdrs.update(headers or {})
        clean = {k: str(v) for k, v in (params or {}).items() if v is not None}
        return Call(
            method=method,
            url=self.config.base_url + path,
            headers=hdrs,
            params=clean or None,
            json=json_body,
            timeout=self.config.timeout if timeout is None else timeout,
            retry=retry,
        )

    def _json(self, call: Call) -> Generator[Step, Outcome | None, Any]:
        resp = yield from send(call, self.config.retry)
        return json_of(resp)

    @staticmethod
    def _job_path(job_id: str) -> str:
        if not job_id:
            raise ValueError("job id is empty")
        return "/v1/jobs/" + quote(job_id, safe="")

    # -- jobs
    @staticmethod
    def submit_body(
        model: str,
        input: Any = None,
        *,
        input_url: str | None = None,
        priority: str | None = None,
        ttl_seconds: int | None = None,
        timeout_seconds: int | None = None,
        webhook: str | Mapping[str, Any] | None = None,
        metadata: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The ``POST /v1/jobs`` body; options left ``None`` are omitted (server defaults)."""
        body: dict[str, Any] = {"model": model}
        if input is not None:
            body["input"] = input
        if input_url is not None:
            body["input_url"] = input_url
        if priority is not None:
            body["priority"] = priority
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        if webhook is not None:
            body["webhook"] = {"url": webhook} if isinstance(webhook, str) else dict(webhook)
        if metadata is not None:
            body["metadata"] = dict(metadata)
        body.update({k: v for k, v in extra.items() if v is not None})
        return body

    def submit(
        self, body: dict[str, Any], idempotency_key: str | Literal[False] | None
    ) -> Operation[Job]:
        key = str(uuid.uuid4()) if idempotency_key is None else idempotency_key
        headers = {"idempotency-key": key} if key else {}
        call = self._call("POST", "/v1/jobs", json_body=body, headers=headers, retry=bool(key))
        return Job.model_validate((yield from self._json(call)))

    def get(self, job_id: str, wait: float = 0.0) -> Operation[Job]:
        wait = max(0.0, min(MAX_LONG_POLL, wait))
        params = {"wait": f"{wait:.3f}".rstrip("0").rstrip(".")} if wait > 0 else None
        call = self._call(
            "GET", self._job_path(job_id), params=params, timeout=self.config.timeout + wait
        )
        return Job.model_validate((yield from self._json(call)))

    def wait(
        self,
        job_id: str,
        timeout: float | None,
        poll: float = MAX_LONG_POLL,
        on_update: Callable[[Job], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Operation[Job]:
        deadline = None if timeout is None else clock() + max(0.0, timeout)
        while True:
            hold = poll if deadline is None else min(poll, max(0.0, deadline - clock()))
            try:
                job = yield from self.get(job_id, wait=hold)
            except RateLimitedError:
                # Every long-poll slot of this key is in use (the service bounds concurrent
                # ?wait polls per key, after the retries above): read without waiting, then
                # sleep, so the wait goes on.
                job = yield from self.get(job_id)
                if not job.is_terminal and hold > 0:
                    yield Sleep(min(hold, RATE_LIMITED_POLL_SECONDS))
            if on_update is not None:
                on_update(job)
            if job.is_terminal:
                return job
            if deadline is not None and clock() >= deadline:
                raise WaitTimeout(job, timeout or 0.0)

    def cancel(self, job_id: str) -> Operation[Job]:
        call = self._call("POST", self._job_path(job_id) + "/cancel")
        policy = self.config.retry
        resp, sent = yield from send_counted(call, policy)
        if resp.status_code == 409 and sent > 1:
            # A retried cancel may have landed the first time: the job is then cancelled.
            job = yield from self.get(job_id)
            if job.status == "cancelled":
                return job
        return Job.model_validate(json_of(resp))

    def list_page(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Operation[JobPage]:
        params = {"status": status, "model": model, "limit": limit, "cursor": cursor}
        call = self._call("GET", "/v1/jobs", params=params)
        return JobPage.model_validate((yield from self._json(call)))

    # -- other endpoints
    def models(self) -> Operation[list[ModelInfo]]:
        data = yield from self._json(self._call("GET", "/v1/models"))
        return [ModelInfo.model_validate(m) for m in data.get("models", [])]

    def health(self) -> Operation[dict[str, Any]]:
        data = yield from self._json(self._call("GET", "/v1/health"))
        return dict(data)

    def webhook_secret(self, rotate: bool = False) -> Operation[WebhookSecret]:
        if rotate:
            call = self._call("POST", "/v1/webhooks/secret/rotate", retry=False)
        else:
            call = self._call("GET", "/v1/webhooks/secret")
        data = yield from self._json(call)
        if isinstance(data, dict) and isinstance(data.get("secret"), str):
            return WebhookSecret.model_validate(data)
        raise APIError("no secret in the response", status=200, code="invalid_response", body=data)

    def upload(self, content: bytes) -> Operation[Upload]:
        data = yield from self._json(self._call("POST", "/v1/uploads"))
        upload = Upload.model_validate(data)
        if upload.max_bytes is not None and len(content) > upload.max_bytes:
            raise PayloadTooLargeError(
                f"input is {len(content)} bytes; the service takes at most {upload.max_bytes}",
                status=413,
                body=data,
            )
        timeout = max(self.config.timeout, 60.0 + len(content) / 1_000_000)
        # presigned: no API key goes to the storage service
        if upload.upload_form is not None:  # S3 itself holds the size cap of its policy
            body, content_type = form_body(upload.upload_form.fields, content)
            call = Call(
                method="POST",
                url=upload.upload_form.url,
                headers={"content-type": content_type},
                content=body,
                timeout=timeout,
            )
        else:  # a server before upload forms
            call = Call(
                method="PUT",
                url=upload.upload_url,
                headers={"content-type": "application/json"},
                content=content,
                timeout=timeout,
            )
        resp = yield from send(call, self.config.retry)
        if resp.status_code >= 300:
            raise APIError(
                f"upload {call.method} failed: {resp.text[:300]}",
                status=resp.status_code,
                code="upload_failed",
                body=resp.text,
            )
        return upload


def form_body(fields: Mapping[str, str], content: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body of an S3 POST upload: ``fields`` first, then the file as
    field ``file`` (S3 ignores fields after it). Returns ``(body, content type)``."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="input.json"\r\nContent-Type: application/json\r\n\r\n'.encode()
        + content
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


UploadData = bytes | str | os.PathLike[str] | Mapping[str, Any] | list[Any]


def upload_content(data: UploadData) -> bytes:
    """The bytes to upload: ``bytes`` as is, a path's file content, a dict or list as JSON."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, Mapping | list):
        return json.dumps(data, separators=(",", ":")).encode()
    return Path(data).read_bytes()
