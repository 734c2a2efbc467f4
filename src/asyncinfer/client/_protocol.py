"""The protocol of the API, without I/O: what to send, how to read the answer, when to retry.

Every operation is a generator that yields :class:`Call` (send this HTTP request; the driver sends
back an ``httpx.Response`` or the ``httpx.TransportError`` it raised) or :class:`Sleep` (wait this
many seconds) and returns its result. :class:`~asyncinfer.client.Client` drives them with
``httpx.Client`` and ``time.sleep``, :class:`~asyncinfer.client.AsyncClient` with
``httpx.AsyncClient`` and ``asyncio.sleep``: one implementation, two transports.

The steps, the retry policy and reading answers are in :mod:`asyncinfer.client._transport`, the
configuration in :mod:`asyncinfer.client._config`; both are re-exported here, where they were
first defined.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from asyncinfer import __version__
from asyncinfer.client._config import LOCAL_JSON, Config, resolve_config
from asyncinfer.client._transport import (
    RETRY_STATUSES,
    Call,
    Operation,
    Outcome,
    RetryPolicy,
    Sleep,
    Step,
    T,
    error_from_response,
    json_of,
    send,
    send_counted,
)
from asyncinfer.client.errors import APIError, PayloadTooLargeError, RateLimitedError, WaitTimeout
from asyncinfer.client.models import Job, JobPage, ModelInfo, Upload, WebhookSecret

__all__ = [
    "LOCAL_JSON",
    "MAX_LONG_POLL",
    "RATE_LIMITED_POLL_SECONDS",
    "RETRY_STATUSES",
    "Call",
    "Config",
    "Operation",
    "Outcome",
    "Protocol",
    "RetryPolicy",
    "Sleep",
    "Step",
    "T",
    "UploadData",
    "error_from_response",
    "form_body",
    "json_of",
    "resolve_config",
    "send",
    "send_counted",
    "upload_content",
]

#: Longest ``?wait=`` the API holds a request, seconds (spec: 0..20).
MAX_LONG_POLL = 20.0
#: How long :meth:`wait` sleeps between plain reads while its long polls are refused 429
#: (the service's bound on concurrent ``?wait`` polls per key), seconds.
RATE_LIMITED_POLL_SECONDS = 2.0


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
