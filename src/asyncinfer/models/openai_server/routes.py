"""The routes of ``asyncinfer serve-openai`` (as vLLM's OpenAI server has them): ``GET /health``,
``/v1/models``, ``/metrics``; ``POST /v1/chat/completions`` and ``/v1/completions`` (streaming
or whole), or ``POST /v1/embeddings`` for an ``embeddings`` entry. Bad requests get OpenAI's
error body with the field in ``param``."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from asyncinfer.models.base import WorkItem
from asyncinfer.models.openai_server.protocol import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    BadRequest,
    embeddings_input_of,
    input_of,
)
from asyncinfer.models.openai_server.requests import Request
from asyncinfer.models.openai_server.streaming import StreamingHandler, failure_of, usage_of

log = logging.getLogger("asyncinfer.serve_openai")


class Routes(StreamingHandler):
    """One connection's requests (a thread of :class:`~.server.EngineServer` each)."""

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
        finally:
            req.close()

    def _vectors(self, req: Request, rid: str) -> None:
        """Answer a ``/v1/embeddings`` request as OpenAI does (``data`` of ``{"object":
        "embedding", "index", "embedding"}``; ``usage`` counts no tokens: the kind has none)."""
        if not self._await(req, rid):
            return
        out = req.result
        if not isinstance(out, dict):
            self._error(*failure_of(out))
            return
        data = [
            {"object": "embedding", "index": i, "embedding": v}
            for i, v in enumerate(out.get("embeddings") or [])
        ]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        self._json(
            200, {"object": "list", "data": data, "model": self.server.model, "usage": usage}
        )

    def _whole(self, req: Request, rid: str, chat: bool) -> None:
        """Answer with one ``chat.completion`` (or ``text_completion``) once the job is done."""
        if not self._await(req, rid):
            return
        out = req.result
        if not isinstance(out, dict):
            self._error(*failure_of(out))
            return
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
            "usage": usage_of(out),
        }
        self._json(200, body)
