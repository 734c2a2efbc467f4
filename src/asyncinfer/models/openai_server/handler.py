"""The ``openai-server`` kind's handler: no model in the worker; each job is one streaming request
to an OpenAI-compatible engine (vLLM, SGLang, TGI, llama.cpp's server, ``asyncinfer
serve-openai``) at the entry's ``engine.url`` (or ``Settings.engine_url`` for an ``engine.image``
run beside the worker).

* **Concurrency**: up to the worker's capacity (the entry's ``max_batch_size``) requests in flight,
  one asyncio task each on one event loop thread (``httpx.AsyncClient``, streaming).
* **Readiness and room**: :meth:`OpenAIServerHandler.ready` is ``False`` until the engine's
  ``/health`` (or, where it has none, ``/v1/models``) answers 200, after a connection error until
  it answers again, and while the engine's ``/metrics`` shows requests waiting in its own queue
  (vLLM's ``vllm:num_requests_waiting``, SGLang's ``sglang:num_queue_reqs``, TGI's
  ``tgi_queue_size``). The worker receives no message and the handler takes no job while it is
  ``False``, so jobs wait in SQS, where other workers can get them, not in the engine's queue.
* **Embeddings** (``engine.api: embeddings``): each job is one ``POST /v1/embeddings`` of its
  ``texts``; the output is the ``embeddings`` kind's (``embeddings``, ``dim``).
* **Progress**: tokens so far (one per content chunk; the engine's ``usage`` at the end),
  reported at most every :data:`PROGRESS_INTERVAL` seconds, as the built-in engine does.
* **Cancel, timeout, stop**: the job's task is cancelled within :data:`WATCH_SECONDS`, which
  closes its HTTP stream (the engine aborts the request, as vLLM does on a disconnect).
* **Errors**: connection errors, a broken stream and 5xx (and 408/429) are retryable
  (:class:`TransientError`); other 4xx are permanent (:class:`InvalidInput`, the engine's message).
* **compute_seconds**: the engine's busy time (some request of this worker in flight) split equally
  across the requests in flight at each moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from asyncinfer.core.errors import (
    JobCancelled,
    JobError,
    TransientError,
    WorkerStopping,
)
from asyncinfer.core.settings_parts import ModelSettings
from asyncinfer.models import base
from asyncinfer.models.base import ModelHandler, Result, WorkItem, WorkSource
from asyncinfer.models.openai_server.protocol import (
    embeddings_output_of,
    embeddings_request_of,
    error_of,
    finish_reason,
    gauge,
    request_of,
)
from asyncinfer.models.schemas import EmbeddingInput, GenerationInput

log = logging.getLogger("asyncinfer.models.openai_server")

#: Least time between two progress reports of one job, seconds (as the built-in engine).
PROGRESS_INTERVAL = 1.0
#: How often running jobs are checked for cancel, timeout and stop, seconds.
WATCH_SECONDS = 0.05
#: Longest wait for a result while the most jobs are in flight (a result ends it at once), s.
FULL_WAIT_SECONDS = 1.0
#: Longest wait for the end of a response after its ``data: [DONE]``, seconds.
DRAIN_SECONDS = 1.0
#: How often the engine's health and queue are read, seconds.
POLL_SECONDS = 0.5
#: The engine-queue gauges of the servers we know (summed over their label sets).
QUEUE_GAUGES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read what follows ``data: [DONE]`` (the end of the response) for at most
    :data:`DRAIN_SECONDS`, so that the connection goes back to the pool for the next job (a
    response closed before its end closes its connection: a new one per job, and a new thread
    in a threaded engine). An engine that sends more, or nothing, is left to the close."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in lines:
                pass


class _Job:
    """What one job's request has brought so far."""

    def __init__(self, item: WorkItem) -> None:
        self.item = item
        self.parts: list[str] = []
        self.tokens = 0
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        #: ``data: [DONE]`` came: the answer is whole (a cancel while the rest of the response
        #: is read, :func:`_drain`, no longer changes it).
        self.ended = False
        self.last_progress = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    def output(self, finish: str) -> dict[str, Any]:
        usage = self.usage or {}
        return {
            "text": "".join(self.parts),
            "finish_reason": finish,
            "usage": {
                "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                "completion_tokens": int(usage.get("completion_tokens") or self.tokens),
            },
        }


#: The engine's URL without an entry ``engine.url`` or a part (``Settings.engine_url``'s default).
DEFAULT_ENGINE_URL = "http://127.0.0.1:8000"


class OpenAIServerHandler(ModelHandler):
    """Feeds an OpenAI-compatible engine (see the module docstring).

    Args:
        spec: the entry's spec (``kind: openai-server``, ``engine.model`` the name it serves).
        url: the engine's base URL (default: ``engine.url``, else the part's ``engine_url``,
            ``ASYNCINFER_ENGINE_URL``, else :data:`DEFAULT_ENGINE_URL`).
        settings: the model layer's part (:class:`~asyncinfer.core.settings_parts.ModelSettings`).
        transport: an httpx transport (tests: ``httpx.MockTransport``).
    """

    def __init__(
        self,
        *,
        spec: Any,
        cache_dir: Any = None,
        url: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        settings: ModelSettings | None = None,
    ) -> None:
        super().__init__(spec=spec, cache_dir=cache_dir, settings=settings)
        engine = spec.entry.engine if spec.entry is not None else None
        if url is None:
            if engine is not None and engine.url:
                url = engine.url
            elif settings is not None:
                url = settings.engine_url
            else:
                url = DEFAULT_ENGINE_URL
        self.url = url.rstrip("/")
        self.model = engine.model if engine is not None else spec.id
        self._transport = transport
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._healthy = False
        self._waiting = 0.0
        self._metrics_known = True
        self._jobs: dict[int, _Job] = {}
        self._busy_mark = base.compute_clock()
        self._results: queue.Queue[tuple[WorkItem, Result]] = queue.Queue()
        self._background: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ readiness
    def ready(self) -> bool:
        """Whether the engine can take a job now: healthy, and no request in its own queue."""
        return self._healthy and not self._waiting

    def load(self) -> None:
        """Start the event loop thread and the engine poller (idempotent; does not wait for the
        engine: jobs wait in the queue until :meth:`ready`)."""
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._client = httpx.AsyncClient(
                base_url=self.url,
                transport=self._transport,
                timeout=httpx.Timeout(10.0, read=None),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
            self._background = [loop.create_task(self._poll()), loop.create_task(self._watch())]
            started.set()
            loop.run_forever()

        threading.Thread(target=run, name="engine-client", daemon=True).start()
        started.wait()
        self._loop = loop
        log.info("model %s: engine %s (serves %r)", self.spec.id, self.url, self.model)

    async def _poll(self) -> None:
        assert self._client is not None
        while True:
            healthy = await self._health()
            if healthy != self._healthy:
                log.info("engine %s %s", self.url, "ready" if healthy else "not ready")
            self._healthy = healthy
            if healthy and self._metrics_known:
                await self._read_queue()
            await asyncio.sleep(POLL_SECONDS)

    async def _health(self) -> bool:
        assert self._client is not None
        try:
            r = await self._client.get("/health", timeout=5)
            if r.status_code == 404:
                r = await self._client.get("/v1/models", timeout=5)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def _read_queue(self) -> None:
        assert self._client is not None
        try:
            r = await self._client.get("/metrics", timeout=5)
        except httpx.HTTPError:
            return
        if r.status_code == 404:
            self._metrics_known = False  # an engine without /metrics: in-flight count only
            return
        if r.status_code != 200:
            return
        values = [gauge(r.text, name) for name in QUEUE_GAUGES]
        self._waiting = sum(v for v in values if v is not None)

    # ------------------------------------------------------------------ compute time
    def _account(self) -> None:
        """Charge the time since the last change equally to the jobs in flight (loop thread)."""
        now = base.compute_clock()
        elapsed, self._busy_mark = now - self._busy_mark, now
        base.attribute([j.item for j in self._jobs.values()], elapsed)

    # ------------------------------------------------------------------ one job
    async def _run(self, job: _Job) -> None:
        self._account()
        self._jobs[id(job.item)] = job
        try:
            result: Result = await self._request(job)
        except asyncio.CancelledError:
            # Cancelled while draining an answer that is whole: the job succeeded.
            ended = job.ended and job.finish is not None
            result = job.output(finish_reason(job.finish)) if ended else self._interrupted(job)
        except Exception as exc:  # a bug here must not lose the job
            log.exception("job %s: engine request failed", job.item.job_id)
            result = TransientError(f"{type(exc).__name__}: {exc}"[:500])
        finally:
            self._account()
            self._jobs.pop(id(job.item), None)
        self._results.put((job.item, result))

    async def _request(self, job: _Job) -> Result:
        assert self._client is not None
        inp = job.item.input
        headers = {"X-Request-Id": job.item.job_id}
        if isinstance(inp, EmbeddingInput):
            return await self._embed(job, inp, headers)
        assert isinstance(inp, GenerationInput)
        path, body = request_of(inp, self.model)
        try:
            async with self._client.stream("POST", path, json=body, headers=headers) as resp:
                if resp.status_code >= 400:
                    return error_of(resp.status_code, await resp.aread())
                lines = resp.aiter_lines()
                async for line in lines:
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        job.ended = True
                        await _drain(lines)
                        break
                    failure = self._chunk(job, data)
                    if failure is not None:
                        return failure
        except httpx.HTTPError as exc:
            return self._connection_error(job, exc)
        if job.finish is None:
            return TransientError("the engine's stream ended before a finish_reason")
        return job.output(finish_reason(job.finish))

    async def _embed(self, job: _Job, inp: EmbeddingInput, headers: dict[str, str]) -> Result:
        """One ``/v1/embeddings`` request (an ``engine.api: embeddings`` entry): the job's
        ``texts`` in, ``{"embeddings", "dim"}`` out; an answer of another shape is retryable
        (a broken engine), as a 5xx is."""
        assert self._client is not None
        path, body = embeddings_request_of(inp, self.model)
        try:
            resp = await self._client.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            return self._connection_error(job, exc)
        if resp.status_code >= 400:
            return error_of(resp.status_code, resp.content)
        try:
            return embeddings_output_of(resp.json(), len(inp.texts))
        except ValueError as exc:  # EngineAnswerError, or not JSON at all
            return TransientError(f"engine answer: {exc}"[:500])

    def _connection_error(self, job: _Job, exc: httpx.HTTPError) -> JobError:
        if isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)):
            self._healthy = False  # until /health answers again
        log.warning("job %s: engine connection: %s: %s", job.item.job_id, type(exc).__name__, exc)
        return TransientError(f"engine connection: {type(exc).__name__}: {exc}"[:500])

    def _chunk(self, job: _Job, data: str) -> JobError | None:
        """Take one ``data:`` chunk; a job error when the engine reports one in the stream."""
        try:
            chunk = json.loads(data)
        except ValueError:
            return TransientError(f"the engine sent a chunk that is not JSON: {data[:200]}")
        if not isinstance(chunk, dict):
            return None
        if chunk.get("error"):
            err = chunk["error"]
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) else 500
            return error_of(status, json.dumps({"error": err}).encode())
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece:
                job.parts.append(piece)
                job.tokens += 1
            if choice.get("finish_reason"):
                job.finish = choice["finish_reason"]
        if isinstance(chunk.get("usage"), dict):
            job.usage = chunk["usage"]
        now = time.monotonic()
        if job.item.on_progress is not None and now - job.last_progress >= PROGRESS_INTERVAL:
            job.last_progress = now
            partial = {**job.output("stop"), "finish_reason": None}
            job.item.on_progress(job.tokens, partial)
        return None

    def _interrupted(self, job: _Job) -> Result:
        exc = job.item.interruption()
        if isinstance(exc, JobCancelled) or exc is None:
            embedding = isinstance(job.item.input, EmbeddingInput)  # no partial vectors
            partial = None if embedding else job.output("cancelled")
            return JobCancelled("job was cancelled", partial=partial)
        if isinstance(exc, (JobError, WorkerStopping)):
            return exc
        return TransientError(str(exc))

    async def _watch(self) -> None:
        """Cancel the task of every job that is cancelled, past its deadline or stopping."""
        while True:
            for job in list(self._jobs.values()):
                if job.task is not None and not job.task.done() and job.item.interruption():
                    log.info(
                        "job %s: %s; closing its engine stream",
                        job.item.job_id,
                        job.item.interruption(),
                    )
                    job.task.cancel()
            await asyncio.sleep(WATCH_SECONDS)

    # ------------------------------------------------------------------ the loop
    def _start(self, item: WorkItem) -> None:
        assert self._loop is not None
        job = _Job(item)

        def create() -> None:
            job.task = asyncio.ensure_future(self._run(job))

        self._loop.call_soon_threadsafe(create)

    def serve(self, source: WorkSource, max_batch_size: int) -> None:
        """Keep up to ``max_batch_size`` requests in flight until the source stops and none is
        left; take new jobs only while :meth:`ready`."""
        self.load()
        active = 0
        while True:
            try:
                item, result = self._results.get_nowait()
                source.finish(item, result)
                active -= 1
                continue
            except queue.Empty:
                pass
            if source.stopping and not active:
                return
            if active < max_batch_size and not source.stopping:
                if not self.ready():
                    # Nothing to start; the take still lets the source do its own upkeep (the
                    # worker's pending writes and deletes, its scale-in protection when idle).
                    source.take(0, timeout=0.0)
                else:
                    items = source.take(max_batch_size - active, timeout=0 if active else 0.2)
                    for item in items:
                        self._start(item)
                    active += len(items)
                    if items:
                        continue
            # At capacity there is nothing to do but wait for a result (which wakes this at
            # once): no periodic wake-up then, to leave the cores to a co-located engine.
            wait = FULL_WAIT_SECONDS if active >= max_batch_size else 0.05 if active else 0.2
            try:
                item, result = self._results.get(timeout=wait)
            except queue.Empty:
                continue
            source.finish(item, result)
            active -= 1

    def predict(self, items: list[WorkItem]) -> list[Result]:
        """Run ``items`` concurrently against the engine, at once (an engine that is not up gives
        each a retryable :class:`TransientError`), and return their results in order."""
        self.load()
        for item in items:
            self._start(item)
        got: dict[int, Result] = {}
        while len(got) < len(items):
            item, result = self._results.get()
            got[id(item)] = result
        return [got[id(item)] for item in items]
