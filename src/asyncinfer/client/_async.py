"""The asynchronous client: the shared protocol (:mod:`._protocol`) over ``httpx.AsyncClient``."""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import AsyncIterator, Callable, Mapping
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


class AsyncClient:
    """Asynchronous client of the asyncinfer API: the methods of :class:`Client`, as
    coroutines (``list`` and ``list_pages`` are async iterators). Same arguments, defaults and
    exceptions. Use it as an async context manager, or ``await`` :meth:`aclose`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        config: Config | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config or resolve_config(
            base_url, api_key, timeout=timeout, max_retries=max_retries
        )
        self._proto = Protocol(self.config)
        self._http = http_client or httpx.AsyncClient(
            follow_redirects=False, limits=httpx.Limits(max_connections=200)
        )

    # ------------------------------------------------------------------ driver
    async def _send(self, call: Call) -> Outcome:
        try:
            return await self._http.request(
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

    async def _run(self, op: Operation[T]) -> T:
        try:
            step = next(op)
            while True:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    step = op.send(None)
                else:
                    step = op.send(await self._send(step))
        except StopIteration as stop:
            return stop.value

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ jobs
    async def submit(
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
        """Submit a job; see :meth:`Client.submit` (arguments, seconds, errors)."""
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
        return await self._run(self._proto.submit(body, idempotency_key))

    async def get(self, job_id: str, *, wait: float = 0.0) -> Job:
        """The job; ``wait`` seconds (0..20) of long-poll. Raises :class:`NotFoundError`."""
        return await self._run(self._proto.get(job_id, wait))

    async def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_update: Callable[[Job], None] | None = None,
        poll: float = 20.0,
    ) -> Job:
        """Wait until the job is terminal; see :meth:`Client.wait`. ``timeout`` in seconds
        (``None``: for ever). Raises :class:`WaitTimeout`, :class:`NotFoundError`."""
        return await self._run(self._proto.wait(job_id, timeout, poll=poll, on_update=on_update))

    async def cancel(self, job_id: str) -> Job:
        """Cancel a job; see :meth:`Client.cancel`. Raises :class:`ConflictError` for a terminal
        job, :class:`NotFoundError`."""
        return await self._run(self._proto.cancel(job_id))

    async def list_page(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        """One page of ``GET /v1/jobs``; see :meth:`Client.list_page`."""
        return await self._run(
            self._proto.list_page(status=status, model=model, limit=limit, cursor=cursor)
        )

    async def list_pages(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        page_size: int = 100,
        cursor: str | None = None,
    ) -> AsyncIterator[JobPage]:
        """Every page of ``GET /v1/jobs``, fetched as the iteration goes."""
        while True:
            page = await self.list_page(status=status, model=model, limit=page_size, cursor=cursor)
            yield page
            cursor = page.next_cursor
            if not cursor:
                return

    async def list(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        page_size: int = 100,
        limit: int | None = None,
    ) -> AsyncIterator[Job]:
        """The API key's jobs, newest first, page by page; at most ``limit`` (``None``: all)."""
        n = 0
        async for page in self.list_pages(status=status, model=model, page_size=page_size):
            for job in page.jobs:
                if limit is not None and n >= limit:
                    return
                n += 1
                yield job

    # ------------------------------------------------------------------ other endpoints
    async def models(self) -> builtins.list[ModelInfo]:
        """The deployed models (``GET /v1/models``)."""
        return await self._run(self._proto.models())

    async def health(self) -> dict[str, Any]:
        """``GET /v1/health``."""
        return await self._run(self._proto.health())

    async def webhook_secret(self) -> WebhookSecret:
        """The API key's webhook signing secret (``GET /v1/webhooks/secret``; made on first
        use): ``.secret`` (``whsec_...``), and ``.previous_secret`` for 24 h after a rotation."""
        return await self._run(self._proto.webhook_secret())

    async def rotate_webhook_secret(self) -> WebhookSecret:
        """Make a new signing secret (``POST /v1/webhooks/secret/rotate``); the previous one stays
        valid (and deliveries carry both signatures) for 24 h. Not retried."""
        return await self._run(self._proto.webhook_secret(rotate=True))

    async def upload(self, data: UploadData) -> str:
        """Upload a large input and return its ``input_url``; see :meth:`Client.upload`."""
        content = await asyncio.to_thread(upload_content, data)
        return (await self._run(self._proto.upload(content))).input_url

    async def submit_batch(
        self,
        path: str | os.PathLike[str],
        output: str | os.PathLike[str],
        *,
        concurrency: int = 8,
        wait: bool = True,
        progress: bool = False,
        batch_id: str | None = None,
    ) -> BatchSummary:
        """Run a JSONL batch file; see :func:`asyncinfer.client.batch.run_batch`."""
        from asyncinfer.client.batch import run_batch

        return await run_batch(
            self,
            path,
            output,
            concurrency=concurrency,
            wait=wait,
            progress=progress,
            batch_id=batch_id,
        )
