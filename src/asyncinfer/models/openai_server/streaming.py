"""How ``asyncinfer serve-openai`` waits for one request's job and streams it: server-sent events
(``data: {chunk}`` lines, ``data: [DONE]`` last) in HTTP/1.1 chunked encoding, a chunk per
progress report of the job, and a client that closes its connection cancelling the job at once.

:class:`StreamingHandler` is the base of the server's request handler (:class:`~.routes.Routes`);
it holds what the routes share: JSON answers, OpenAI's error body, the wait for a result.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from asyncinfer.core.errors import InvalidInput, JobError, WorkerStopping
from asyncinfer.models.openai_server.requests import Request
from asyncinfer.openai_api.errors import openai_error_body

if TYPE_CHECKING:
    from collections.abc import Callable

    from asyncinfer.models.openai_server.server import EngineServer

log = logging.getLogger("asyncinfer.serve_openai")

#: How long a request thread sleeps at most when nothing happens, seconds: it wakes at once for
#: its job's progress and result and for its client closing the connection.
WAKE_SECONDS = 1.0
#: How often a request thread looks at its client's socket when that socket cannot wake it (the
#: client sent more than the request: readable without being closed), seconds.
POLL_SECONDS = 0.05


def client_gone(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (readable with nothing to read, or reset). Looked at
    with a selector, not ``select.select`` (which refuses descriptors past FD_SETSIZE, 1,024)."""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ)
            if not selector.select(0):
                return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):  # reset, or closed under us
        return True


def usage_of(out: dict[str, Any]) -> dict[str, int]:
    """OpenAI's ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``) of a job
    output's ``usage``."""
    u = out.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def failure_of(result: Any) -> tuple[int, str]:
    """``(HTTP status, message)`` of a job's failed result, by its error type."""
    if isinstance(result, InvalidInput):
        return 400, result.message
    if isinstance(result, WorkerStopping):
        return 503, "the server is stopping"
    if isinstance(result, JobError):
        return 500, f"{result.code}: {result.message}"
    return 500, "no result"


class StreamingHandler(BaseHTTPRequestHandler):
    """The request handler's plumbing: JSON answers, waiting for a job, streaming it."""

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

    # ------------------------------------------------------------------ waiting
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

    def _await(
        self, req: Request, rid: str, on_progress: Callable[[str], None] | None = None
    ) -> bool:
        """Wait for the result, calling ``on_progress(text)`` as text comes; ``False`` when the
        client went away (its job cancelled)."""
        watch = True  # the client's socket wakes this thread (polled once it has sent more)
        while not req.done:
            readable = req.wait_for(
                self.connection if watch else None, WAKE_SECONDS if watch else POLL_SECONDS
            )
            if not req.done and (readable or not watch):
                if client_gone(self.connection):
                    self._closed(req, rid)
                    return False
                watch = watch and not readable  # data, not a close: poll from now on
            if on_progress is not None and req.partial is not None:
                on_progress(str(req.partial.get("text") or ""))
        return True

    # ------------------------------------------------------------------ streaming
    def _stream(self, req: Request, rid: str, chat: bool, usage_chunk: bool) -> None:
        """Answer with server-sent events: the role (chat), a delta per progress report, the
        rest of the text with the finish reason, ``usage`` if asked, ``[DONE]``."""
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
                chunk([], usage_of(out))
        else:
            status, message = failure_of(out)
            self._event(openai_error_body(status, message))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")
