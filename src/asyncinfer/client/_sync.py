"""The synchronous client: the shared protocol (:mod:`._protocol`) over ``httpx.Client``."""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import httpx

from asyncinfer.client._protocol import (
    Call,
    Config,
    Operation,
    Outcome,
    Protocol,
    Sleep,
    T,
    UploadData,
    resolve_config,
    upload_content,
)
from asyncinfer.client.models import Job, JobPage, ModelInfo, WebhookSecret

if TYPE_CHECKING:
    from asyncinfer.client.batch import BatchSummary


class Client:
    """Synchronous client of the asyncinfer API.

    Args:
        base_url: the API's URL (``http://127.0.0.1:8000``, or the API Gateway stage URL);
            default ``ASYNCINFER_URL``, else the ``api_url`` of ``.asyncinfer/local.json``.
        api_key: the API key; default ``ASYNCINFER_API_KEY``, else ``local.json``'s key.
        timeout: per-request timeout, seconds (long-polls add their wait to it).
        max_retries: retries of a call on 429, 5xx and connection errors (idempotent calls and
            submits with an idempotency key only), with exponential backoff and jitter.

    Raises:
        ConfigurationError: no URL or key was found.

    Every call raises :class:`~asyncinfer.client.APIError` subclasses for HTTP errors (by the
    spec's error code: ``NotFoundError``, ``ConflictError``, ``InvalidRequestError``, ...) and
    :class:`~asyncinfer.client.APIConnectionError` when the API cannot be reached. Use it as a
    context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        config: Config | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.config = config or resolve_config(
            base_url, api_key, timeout=timeout, max_retries=max_retries
        )
        self._proto = Protocol(self.config)
        self._http = http_client or httpx.Client(follow_redirects=False)
        self._sleep: Callable[[float], None] = time.sleep

    # ------------------------------------------------------------------ driver
    def _send(self, call: Call) -> Outcome:
        try:
            return self._http.request(
                call.method,
                call.url,
                headers=call.headers,
                params=call.params,
                json=call.json,
                content=call.content,
                timeout=call.timeout,
            )
        except httpx.TransportError as exc:
            return exc

    def _run(self, op: Operation[T]) -> T:
        try:
            step = next(op)
            while True:
                if isinstance(step, Sleep):
                    self._sleep(step.seconds)
                    step = op.send(None)
                else:
                    step = op.send(self._send(step))
        except StopIteration as stop:
            return stop.value

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ jobs
    def submit(
        self,
        model: str,
        input: Any = None,
        *,
        input_url: str | None = None,
        priority: Literal["high", "normal", "low"] | None = None,
        ttl_seconds: int | None = None,
        timeout_seconds: int | None = None,
        webhook: str | Mapping[str, Any] | None = None,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | Literal[False] | None = None,
        **options: Any,
    ) -> Job:
        """Submit a job (``POST /v1/jobs``) and return it (``queued``).

        Args:
            model: a model id of :meth:`models`.
            input: the inline input (a JSON object); or give ``input_url``.
            input_url: an ``s3://`` input, e.g. from :meth:`upload`.
            priority: ``high``, ``normal`` (server default) or ``low``.
            ttl_seconds: longest time queued before the job expires, seconds (10..259200).
            timeout_seconds: longest run time of one attempt, seconds (1..3600).
            webhook: a URL, or ``{"url": ..., "events": [...]}``.
            metadata: up to 16 string values, echoed back.
            idempotency_key: sent as ``Idempotency-Key``; ``None`` generates a uuid4, so the
                submit is retried safely; ``False`` sends none and never retries.
            options: further body fields, sent as they are.

        Raises:
            InvalidRequestError: bad field, unknown model (``details`` names the fields).
            ConflictError: the idempotency key was used with another body.
            PayloadTooLargeError: the body is too large; use :meth:`upload`.
        """
        body = Protocol.submit_body(
            model,
            input,
            input_url=input_url,
            priority=priority,
            ttl_seconds=ttl_seconds,
            timeout_seconds=timeout_seconds,
            webhook=webhook,
            metadata=metadata,
            **options,
        )
        return self._run(self._proto.submit(body, idempotency_key))

    def get(self, job_id: str, *, wait: float = 0.0) -> Job:
        """The job (``GET /v1/jobs/{id}``); with ``wait`` (seconds, 0..20) the server holds the
        answer until the job is terminal or ``wait`` passes. Raises :class:`NotFoundError`."""
        return self._run(self._proto.get(job_id, wait))

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_update: Callable[[Job], None] | None = None,
        poll: float = 20.0,
    ) -> Job:
        """Wait until the job is terminal, with ``?wait=`` long-polls of up to ``poll`` seconds,
        and return it (check ``job.status``: a failed job is returned, not raised).

        Args:
            timeout: seconds to wait in all; ``None`` waits for ever.
            on_update: called with the job after each poll.
            poll: longest single long-poll, seconds (at most 20).

        Raises:
            WaitTimeout: still not terminal after ``timeout`` seconds (``.job``: last seen).
            NotFoundError: no such job.
        """
        return self._run(self._proto.wait(job_id, timeout, poll=poll, on_update=on_update))

    def cancel(self, job_id: str) -> Job:
        """Cancel a job (``POST /v1/jobs/{id}/cancel``): a queued job is ``cancelled`` at once; a
        running one stays ``running`` until the worker stops it at its next step.

        Raises:
            ConflictError: the job is already terminal.
            NotFoundError: no such job.
        """
        return self._run(self._proto.cancel(job_id))

    def list_page(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        """One page of ``GET /v1/jobs`` (newest first; ``limit`` 1..100, server default 20).
        Raises :class:`InvalidRequestError` for an unknown status or a bad cursor."""
        return self._run(
            self._proto.list_page(status=status, model=model, limit=limit, cursor=cursor)
        )

    def list_pages(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        page_size: int = 100,
        cursor: str | None = None,
    ) -> Iterator[JobPage]:
        """Every page of ``GET /v1/jobs``, fetched as the iteration goes."""
        while True:
            page = self.list_page(status=status, model=model, limit=page_size, cursor=cursor)
            yield page
            cursor = page.next_cursor
            if not cursor:
                return

    def list(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        page_size: int = 100,
        limit: int | None = None,
    ) -> Iterator[Job]:
        """The API key's jobs, newest first, fetching pages of ``page_size`` as the iteration
        goes; at most ``limit`` jobs (``None``: all). ``status`` and ``model`` filter."""
        n = 0
        for page in self.list_pages(status=status, model=model, page_size=page_size):
            for job in page.jobs:
                if limit is not None and n >= limit:
                    return
                n += 1
                yield job

    # ------------------------------------------------------------------ other endpoints
    def models(self) -> builtins.list[ModelInfo]:
        """The deployed models (``GET /v1/models``)."""
        return self._run(self._proto.models())

    def health(self) -> dict[str, Any]:
        """``GET /v1/health``: ``{"status": "ok"}`` when the API is up."""
        return self._run(self._proto.health())

    def webhook_secret(self) -> WebhookSecret:
        """The API key's webhook signing secret (``GET /v1/webhooks/secret``; made on first
        use): ``.secret`` (``whsec_...``), and ``.previous_secret`` for 24 h after a rotation."""
        return self._run(self._proto.webhook_secret())

    def rotate_webhook_secret(self) -> WebhookSecret:
        """Make a new signing secret (``POST /v1/webhooks/secret/rotate``); the previous one stays
        valid (and deliveries carry both signatures) for 24 h. Not retried."""
        return self._run(self._proto.webhook_secret(rotate=True))

    def upload(self, data: UploadData) -> str:
        """Upload a large input (``POST /v1/uploads``, then a PUT to the presigned URL) and
        return its ``input_url`` for :meth:`submit`. ``data``: the JSON bytes, a path to a JSON
        file, or a dict/list (serialised). The content is read into memory.

        Raises:
            APIError: code ``upload_failed`` when the storage service refuses the PUT.
        """
        return self._run(self._proto.upload(upload_content(data))).input_url

    # ------------------------------------------------------------------ batches
    def submit_batch(
        self,
        path: str | os.PathLike[str],
        output: str | os.PathLike[str],
        *,
        concurrency: int = 8,
        wait: bool = True,
        progress: bool = False,
        batch_id: str | None = None,
    ) -> BatchSummary:
        """Run a JSONL batch file; see :func:`asyncinfer.client.batch.run_batch`. Runs an
        :class:`AsyncClient` with this client's configuration in ``asyncio.run`` (so it cannot
        be called from a running event loop)."""
        import asyncio

        from asyncinfer.client._async import AsyncClient
        from asyncinfer.client.batch import run_batch

        async def go() -> BatchSummary:
            async with AsyncClient(config=self.config) as ac:
                return await run_batch(
                    ac,
                    path,
                    output,
                    concurrency=concurrency,
                    wait=wait,
                    progress=progress,
                    batch_id=batch_id,
                )

        return asyncio.run(go())
