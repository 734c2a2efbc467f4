"""``asyncinfer serve-openai --model ID``: a ``causal-lm`` (or ``embeddings``) entry of the
catalogue behind an OpenAI-compatible HTTP server, so that our own engine can run as the sidecar
of an ``openai-server`` entry, and so that the ``openai-server`` path is tested against a real
model.

Endpoints (as vLLM's OpenAI server has them):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: streaming (server-sent events,
  ``data: {chunk}`` lines, ``data: [DONE]`` last; ``usage`` in the last chunk when
  ``stream_options.include_usage``) or not; ``usage`` and ``finish_reason`` as OpenAI's;
* ``POST /v1/embeddings`` instead, for an ``embeddings`` entry (``input`` a string or a list of
  strings; ``data`` of ``{"index", "embedding"}`` as OpenAI answers);
* ``GET /v1/models``: the one model served (its catalogue id);
* ``GET /health``: 200 once the weights are loaded, 503 before;
* ``GET /metrics``: Prometheus text: ``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting`` (vLLM's names), and our counters.

Jobs run through the handler's public ``serve`` loop (:class:`.requests.RequestSource`, a
:class:`~asyncinfer.models.base.WorkSource`), at most ``max_batch_size`` at once; the rest wait
(``num_requests_waiting``). Streaming granularity is the handler's progress interval (about a
second for :mod:`asyncinfer.models.smollm2`). A client that closes its connection cancels its
request at once (logged as ``stream closed``).
"""

from __future__ import annotations

import json
import logging
import select
import signal
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from asyncinfer.core.errors import InvalidInput, JobError, WorkerStopping
from asyncinfer.core.settings_parts import ModelSettings
from asyncinfer.models.base import ModelHandler, WorkItem
from asyncinfer.models.openai_server.protocol import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    BadRequest,
    embeddings_input_of,
    input_of,
)
from asyncinfer.models.openai_server.requests import Request, RequestSource
from asyncinfer.openai_api.errors import openai_error_body

log = logging.getLogger("asyncinfer.serve_openai")

#: How often a request thread looks at its client's socket and its job's progress, seconds.
POLL_SECONDS = 0.05


class EngineServer(ThreadingHTTPServer):
    """The HTTP server of one model: its handler runs in a thread of its own.

    Args:
        address: ``(host, port)``; port 0 picks a free one (see ``server_address``).
        handler: a built model handler (``load`` is called by :meth:`start_engine`).
        model: the model name served (``/v1/models``, requests' ``model``).
        max_batch_size: most requests running at once.
        embeddings: an ``embeddings`` entry: ``POST /v1/embeddings`` is served (and the
            completions routes are not).
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: ModelHandler,
        model: str,
        max_batch_size: int,
        *,
        embeddings: bool = False,
    ) -> None:
        super().__init__(address, _Handler)
        self.handler = handler
        self.model = model
        self.max_batch_size = max_batch_size
        self.embeddings = embeddings
        self.source = RequestSource()
        self.ready = threading.Event()
        self.created = int(time.time())
        self._engine: threading.Thread | None = None

    def start_engine(self) -> None:
        """Load the weights and run the handler's ``serve`` loop, in a thread; ``/health`` says
        200 once loaded."""

        def run() -> None:
            t0 = time.monotonic()
            self.handler.load()
            self.ready.set()
            log.info("model %s loaded in %.1fs; ready", self.model, time.monotonic() - t0)
            self.handler.serve(self.source, self.max_batch_size)

        self._engine = threading.Thread(target=run, name="engine", daemon=True)
        self._engine.start()

    def stop(self) -> None:
        """Refuse new requests, let the handler's loop end, stop serving."""
        self.source.stop()
        threading.Thread(target=self.shutdown, daemon=True).start()

    def metrics(self) -> str:
        """The ``/metrics`` page (Prometheus text format 0.0.4)."""
        label = f'{{model_name="{self.model}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", "Requests running", self.source.running),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting", self.source.waiting),
            (
                "asyncinfer_engine_running_peak",
                "gauge",
                "Most requests running at once since start",
                self.source.peak_running,
            ),
            ("asyncinfer_engine_requests_total", "counter", "Requests", self.source.total),
            (
                "asyncinfer_engine_streams_closed_total",
                "counter",
                "Requests whose client closed the connection before the end",
                self.source.closed,
            ),
        ]
        out = []
        for name, kind, text, value in rows:
            out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n"


def _client_gone(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (readable with nothing to read, or reset)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class _Handler(BaseHTTPRequestHandler):
    server: EngineServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ------------------------------------------------------------------ plumbing
    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None) -> None:
        self._json(status, openai_error_body(status, message, param=param))

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, body: Any) -> None:
        self._chunk(b"data: " + json.dumps(body).encode() + b"\n\n")

    # ------------------------------------------------------------------ GET
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if self.server.ready.is_set():
                self._json(200, {"status": "ok"})
            else:
                self._error(503, "the model is loading")
        elif path == "/v1/models":
            model = {
                "id": self.server.model,
                "object": "model",
                "created": self.server.created,
                "owned_by": "asyncinfer",
                "max_model_len": None,
            }
            self._json(200, {"object": "list", "data": [model]})
        elif path == "/metrics":
            data = self.server.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._error(404, f"no route {path}")

    # ------------------------------------------------------------------ POST
    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        routes = (EMBEDDINGS_PATH,) if self.server.embeddings else (CHAT_PATH, COMPLETIONS_PATH)
        if path not in routes:
            self._error(404, f"no route {path}")
            return
        chat = path == CHAT_PATH
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            self._error(400, "the body is not JSON")
            return
        if not self.server.ready.is_set() or self.server.source.stopping:
            self._error(503, "the model is not ready")
            return
        try:
            inp = (
                embeddings_input_of(body) if path == EMBEDDINGS_PATH else input_of(body, chat=chat)
            )
            if body.get("model") not in (None, self.server.model):
                self._error(404, f"The model `{body.get('model')}` does not exist.", "model")
                return
        except BadRequest as exc:
            self._error(400, exc.message, exc.param)
            return
        stream = bool(body.get("stream")) and path != EMBEDDINGS_PATH
        usage_chunk = bool((body.get("stream_options") or {}).get("include_usage"))
        # The caller's X-Request-Id (the worker sends the job id) names the request in the log.
        tag = str(self.headers.get("X-Request-Id") or uuid.uuid4().hex)[:80]
        rid = {CHAT_PATH: "chatcmpl-", COMPLETIONS_PATH: "cmpl-"}.get(path, "embd-") + tag
        item = WorkItem(job_id=rid, input=inp, raw_input=body)
        req = self.server.source.submit(item)
        log.info("request %s: %s (%s)", rid, path, "stream" if stream else "whole")
        try:
            if path == EMBEDDINGS_PATH:
                self._vectors(req, rid)
            elif stream:
                self._stream(req, rid, chat, usage_chunk)
            else:
                self._whole(req, rid, chat)
        except (BrokenPipeError, ConnectionResetError):
            self._closed(req, rid)

    def _vectors(self, req: Request, rid: str) -> None:
        """Answer a ``/v1/embeddings`` request as OpenAI does (``data`` of ``{"object":
        "embedding", "index", "embedding"}``; ``usage`` counts no tokens: the kind has none)."""
        if not self._await(req, rid):
            return
        out = req.result
        if not isinstance(out, dict):
            self._error(*self._failure(out))
            return
        data = [
            {"object": "embedding", "index": i, "embedding": v}
            for i, v in enumerate(out.get("embeddings") or [])
        ]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        self._json(
            200, {"object": "list", "data": data, "model": self.server.model, "usage": usage}
        )

    def _closed(self, req: Request, rid: str) -> None:
        """The client went away: cancel its job (at once if still waiting)."""
        self.close_connection = True
        if req.done:
            return
        self.server.source.closed += 1
        if not self.server.source.withdraw(req):
            req.item.cancel_event.set()
        log.info(
            "request %s: stream closed by the client after %d tokens; cancelled", rid, req.tokens
        )

    def _await(self, req: Request, rid: str, on_progress: Any = None) -> bool:
        """Wait for the result, calling ``on_progress(text)`` as text comes; ``False`` when the
        client went away (its job cancelled)."""
        while not req.done:
            req.wait(POLL_SECONDS)
            if not req.done and _client_gone(self.connection):
                self._closed(req, rid)
                return False
            if on_progress is not None and req.partial is not None:
                on_progress(str(req.partial.get("text") or ""))
        return True

    def _failure(self, result: Any) -> tuple[int, str]:
        if isinstance(result, InvalidInput):
            return 400, result.message
        if isinstance(result, WorkerStopping):
            return 503, "the server is stopping"
        if isinstance(result, JobError):
            return 500, f"{result.code}: {result.message}"
        return 500, "no result"

    def _whole(self, req: Request, rid: str, chat: bool) -> None:
        if not self._await(req, rid):
            return
        out = req.result
        if not isinstance(out, dict):
            self._error(*self._failure(out))
            return
        usage = _usage(out)
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": out.get("finish_reason"),
            "logprobs": None,
        }
        if chat:
            choice["message"] = {"role": "assistant", "content": out.get("text", "")}
        else:
            choice["text"] = out.get("text", "")
        body = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.server.model,
            "choices": [choice],
            "usage": usage,
        }
        self._json(200, body)

    def _stream(self, req: Request, rid: str, chat: bool, usage_chunk: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        created = int(time.time())
        sent = [""]

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> None:
            self._event(
                {
                    "id": rid,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created,
                    "model": self.server.model,
                    "choices": choices,
                    **({"usage": usage} if usage is not None else {}),
                }
            )

        def delta(text: str, finish: str | None = None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        def progress(text: str) -> None:
            text = text.rstrip("\ufffd")  # half a character: wait for the rest
            if text.startswith(sent[0]) and len(text) > len(sent[0]):
                chunk([delta(text[len(sent[0]) :])])
                sent[0] = text

        if chat:
            chunk(
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            )
        if not self._await(req, rid, progress):
            return
        out = req.result
        if isinstance(out, dict):
            text = str(out.get("text") or "")
            rest = text[len(sent[0]) :] if text.startswith(sent[0]) else ""
            chunk([delta(rest, str(out.get("finish_reason") or "stop"))])
            if usage_chunk:
                chunk([], _usage(out))
        else:
            status, message = self._failure(out)
            self._event(openai_error_body(status, message))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


def _usage(out: dict[str, Any]) -> dict[str, int]:
    u = out.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def serve_openai(
    model_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int | None = None,
    settings: ModelSettings | None = None,
) -> int:
    """Serve catalogue entry ``model_id`` (``causal-lm``: the completions routes; ``embeddings``:
    ``/v1/embeddings``) until SIGTERM or SIGINT; returns 0, or 2 when the entry is missing or of
    another kind. ``settings``: the model layer's part (the CLI passes the settings'; without
    it the handler's built-in defaults)."""
    from asyncinfer.models.registry import MODELS

    if model_id not in MODELS:
        log.error("model %r is not in the catalogue; known: %s", model_id, ", ".join(MODELS))
        return 2
    spec = MODELS[model_id]
    if spec.kind not in ("causal-lm", "embeddings"):
        log.error(
            "model %r is of kind %s; serve-openai serves causal-lm entries (and embeddings "
            "entries, on /v1/embeddings)",
            model_id,
            spec.kind,
        )
        return 2
    handler = spec.load_handler(settings=settings)
    server = EngineServer(
        (host, port),
        handler,
        model_id,
        max_batch_size or spec.max_batch_size,
        embeddings=spec.kind == "embeddings",
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    log.info("serve-openai: model %s on http://%s:%d/v1", model_id, *server.server_address[:2])
    server.start_engine()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    log.info("serve-openai stopped")
    return 0
