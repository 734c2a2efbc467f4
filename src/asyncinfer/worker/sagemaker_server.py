"""The SageMaker serving contract of the worker image (``serve``): ``GET /ping`` and
``POST /invocations`` on port 8080 (SageMaker developer guide, "Use your own inference code with
hosting services": the container must answer /ping within 2 s once ready, and listen on 8080).

One endpoint serves one model: ``ASYNCINFER_MODELS`` holds its id (the CDK app sets it). The
request body is the job's input JSON (the object the bridge stored in S3); the response is the
job's output JSON. Errors answer ``{"error": {"code", "message"}}`` with 400 for a permanent
input problem (``invalid_input``) and 500 otherwise; SageMaker stores that body at the
endpoint's S3FailurePath, where :mod:`asyncinfer.functions.sagemaker_completion` reads the code.

The ``X-Amzn-SageMaker-Custom-Attributes`` header (``job_id=...;model=...;attempt=...``, set by
the bridge) names the job for logs and for the handler's work item.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from asyncinfer.aws.payloads import loads_bounded
from asyncinfer.core import envvars
from asyncinfer.core.errors import ApiError, JobError, WorkerStopping
from asyncinfer.core.settings import get_settings
from asyncinfer.models.base import ModelHandler, WorkItem
from asyncinfer.models.registry import MODELS, get_spec, validate_input
from asyncinfer.worker.startup import StartTimes

log = logging.getLogger(__name__)
PORT = 8080
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"


def parse_custom_attributes(value: str | None) -> dict[str, str]:
    """``"a=1;b=2"`` -> ``{"a": "1", "b": "2"}`` (items without ``=`` are ignored)."""
    out: dict[str, str] = {}
    for part in (value or "").split(";"):
        key, sep, val = part.partition("=")
        if sep and key.strip():
            out[key.strip()] = val.strip()
    return out


def _error(
    status: int, code: str, message: str, details: list[Any] | None = None
) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message, "details": details or []}}


class InvocationsApp:
    """The model behind /invocations, independent of the HTTP server (tests call it directly).

    Args:
        model_id: the model to serve (default: the first id of ``ASYNCINFER_MODELS``).
        handler: a ready handler (tests); default: the registry's handler for ``model_id``.
    """

    def __init__(self, model_id: str | None = None, handler: ModelHandler | None = None) -> None:
        if model_id is None:
            ids = get_settings().models
            if not ids:
                raise ValueError(f"{envvars.MODELS} names no model to serve")
            model_id = ids[0]
        if model_id not in MODELS:
            raise ValueError(f"unknown model {model_id!r}")
        self.spec = get_spec(model_id)
        self.handler = handler
        self.ready = threading.Event()
        self._lock = threading.Lock()
        if handler is not None:
            self.ready.set()

    def load(self) -> None:
        """Build the handler and load its weights (once); logs ``worker ready`` with the
        download/load split (:mod:`asyncinfer.worker.startup`)."""
        times = StartTimes(self.spec.id, emit=bool(get_settings().compute))
        with times.loading():
            if self.handler is None:
                self.handler = self.spec.load_handler(settings=get_settings().model_settings)
            self.handler.load()
        times.ready()
        log.info("worker ready: model=%s (SageMaker) %s", self.spec.id, times.ready_fields())
        self.ready.set()

    def ping(self) -> tuple[int, dict[str, Any]]:
        """200 once the model is loaded, else 503."""
        if self.ready.is_set():
            return 200, {"status": "ok", "model": self.spec.id}
        return 503, {"status": "loading", "model": self.spec.id}

    def invoke(
        self, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Run one input; returns ``(HTTP status, JSON body)``."""
        attrs = parse_custom_attributes((headers or {}).get(CUSTOM_ATTRIBUTES))
        if attrs.get("model") and attrs["model"] != self.spec.id:
            return _error(
                400,
                "invalid_input",
                f"this endpoint serves {self.spec.id!r}, not {attrs['model']!r}",
            )
        if not self.ready.is_set() or self.handler is None:
            return _error(503, "model_error", "model is not loaded yet")
        try:
            # The limits of the API's submit and the ECS worker's read (depth, finite numbers).
            data = loads_bounded(body or b"null", "the request body")
        except JobError as exc:
            return _error(400, "invalid_input", exc.message)
        try:
            validated = validate_input(self.spec, data)
        except ApiError as exc:
            return _error(400, "invalid_input", exc.message, exc.details)
        attempt = int(attrs["attempt"]) if attrs.get("attempt", "").isdigit() else 1
        item = WorkItem(
            job_id=attrs.get("job_id", "sagemaker"),
            input=validated,
            raw_input=data if isinstance(data, dict) else {},
            attempt=attempt,
        )
        try:
            with self._lock:
                result = self.handler.predict([item])[0]
        except MemoryError:
            return _error(500, "out_of_memory", "the input did not fit in memory")
        except (JobError, WorkerStopping) as exc:
            result = exc
        except Exception as exc:  # a model fault, reported as the job's model_error
            log.exception("model %s raised", self.spec.id)
            return _error(500, "model_error", f"{type(exc).__name__}: {exc}"[:500])
        if isinstance(result, dict):
            return 200, result
        if isinstance(result, JobError):
            return _error(
                400 if not result.retryable and result.code == "invalid_input" else 500,
                result.code,
                result.message,
            )
        return _error(500, "model_error", "the model stopped before finishing")


def make_server(
    app: InvocationsApp, host: str = "0.0.0.0", port: int = PORT
) -> ThreadingHTTPServer:
    """An HTTP server exposing ``app`` (GET /ping, POST /invocations)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/ping":
                self._send(*app.ping())
            else:
                self._send(*_error(404, "not_found", "no such path"))

        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/invocations":
                self._send(*_error(404, "not_found", "no such path"))
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            self._send(*app.invoke(body, {k: v for k, v in self.headers.items()}))

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(model_id: str | None = None, port: int = PORT) -> None:
    """Entry point of ``serve``: answer /ping at once (503 while loading), load the model in the
    background, then serve until the process is stopped."""
    app = InvocationsApp(model_id)
    server = make_server(app, port=port)
    threading.Thread(target=app.load, name="model-load", daemon=True).start()
    log.info("serving %s on :%d", app.spec.id, port)
    try:
        server.serve_forever()
    finally:
        server.server_close()
