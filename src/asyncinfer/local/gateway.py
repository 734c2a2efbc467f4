"""The local API Gateway: an HTTP server on 127.0.0.1 that turns each request into the REST API
proxy event the API Lambda receives in AWS, checks the ``x-api-key`` header as an API key with a
usage plan would, and invokes the handler in the local Lambda pool.

Like API Gateway with the CDK app's gateway responses (``infra/components/api.py``): a missing
or unknown key is 403 with the error body ``{"error": {"code": "forbidden", ...}}``
(``/v1/health`` needs none); the key's id is ``requestContext.identity.apiKeyId``; bodies above
10 MB are refused with 413 ``payload_too_large`` before the handler runs. Requests come to the
handler only through the CDK app's two resource methods, ``GET /v1/health`` and
``ANY /v1/{proxy+}``: any other method or path (TRACE, ``POST /v1/health``, ``/``) gets the
app's ``MISSING_AUTHENTICATION_TOKEN`` gateway response, 404 ``not_found`` "Missing
Authentication Token" (API Gateway's own default is 403 ``{"message": "Missing Authentication
Token"}``), never Python's 501 page. A handler that cannot be invoked is the app's
``DEFAULT_5XX`` response, 500 ``internal``.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from concurrent.futures.process import BrokenProcessPool
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from asyncinfer.errors import PayloadTooLarge
from asyncinfer.local.lambda_runtime import LambdaPool

log = logging.getLogger("asyncinfer.local")

#: API Gateway REST APIs take payloads up to 10 MB.
GATEWAY_MAX_BODY_BYTES = 10 * 1024 * 1024
API_HANDLER = "asyncinfer.api.app:handler"
PUBLIC_PATHS = frozenset({"/v1/health"})
#: The methods a REST API resource method can have; ``ANY`` stands for all of them (API Gateway
#: developer guide, "Set up a method"). Others (TRACE, CONNECT, ...) match no method.
GATEWAY_METHODS = frozenset({"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"})


def missing_authentication_token() -> dict[str, Any]:
    """The body of the CDK app's ``MISSING_AUTHENTICATION_TOKEN`` gateway response (404,
    ``infra/components/api.py``): what API Gateway answers a method or path no resource has."""
    return _error("not_found", "Missing Authentication Token")


def route(method: str, path: str) -> str | None:
    """Which of the CDK app's resource methods takes ``method`` on ``path``: ``"public"``
    (``GET /v1/health``, no key), ``"keyed"`` (``ANY /v1/{proxy+}``, key required) or ``None``
    (no such resource method: API Gateway answers ``MISSING_AUTHENTICATION_TOKEN`` before it
    looks at the key)."""
    if method not in GATEWAY_METHODS:
        return None
    if path in PUBLIC_PATHS:
        return "public" if method == "GET" else None
    if path.startswith("/v1/") and len(path) > len("/v1/"):
        return "keyed"
    if path.startswith("/openai/v1/") and len(path) > len("/openai/v1/"):
        return "keyed"  # the OpenAI surface (spec openai.md), ANY /openai/v1/{proxy+}
    return None


def build_event(
    method: str,
    raw_path: str,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    api_key: str | None,
    api_key_id: str | None,
    source_ip: str,
    stage: str = "local",
) -> dict[str, Any]:
    """The API Gateway REST API (v1) proxy event for one request (``{proxy+}`` resource)."""
    parts = urlsplit(raw_path)
    path = parts.path or "/"
    single: dict[str, str] = {}
    multi: dict[str, list[str]] = {}
    for k, v in headers:
        single[k] = v
        multi.setdefault(k, []).append(v)
    q_single: dict[str, str] = {}
    q_multi: dict[str, list[str]] = {}
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        q_single[k] = v
        q_multi.setdefault(k, []).append(v)
    is_b64 = False
    text: str | None = None
    if body:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text, is_b64 = base64.b64encode(body).decode(), True
    now_ms = int(time.time() * 1000)
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": single or None,
        "multiValueHeaders": multi or None,
        "queryStringParameters": q_single or None,
        "multiValueQueryStringParameters": q_multi or None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourceId": "local",
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "extendedRequestId": str(uuid.uuid4()),
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime()),
            # As on a custom domain mapped with no base path: the local API is served at the
            # root, not under /<stage>.
            "path": path,
            "accountId": "123456789012",
            "protocol": "HTTP/1.1",
            "stage": stage,
            "domainPrefix": "localhost",
            "requestTimeEpoch": now_ms,
            "requestId": str(uuid.uuid4()),
            "identity": {
                "apiKey": api_key,
                "apiKeyId": api_key_id,
                "sourceIp": source_ip,
                "userAgent": single.get("User-Agent") or single.get("user-agent"),
                "accountId": None,
                "caller": None,
                "user": None,
                "userArn": None,
                "cognitoIdentityPoolId": None,
                "cognitoIdentityId": None,
                "cognitoAuthenticationType": None,
                "cognitoAuthenticationProvider": None,
            },
            "domainName": "localhost",
            "apiId": "local",
        },
        "body": text,
        "isBase64Encoded": is_b64,
    }


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": []}}


class LocalGateway:
    """Serves the API on ``127.0.0.1:port`` until :meth:`stop`.

    Args:
        pool: where the API handler runs.
        api_keys: key value -> key id (the tenant).
        port: TCP port (0 picks a free one).
    """

    def __init__(self, pool: LambdaPool, api_keys: dict[str, str], port: int) -> None:
        self.pool = pool
        self.api_keys = api_keys
        #: Set by :meth:`stop`: invocations that fail from then on were abandoned by the stop.
        self.stopping = False
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "asyncinfer-local"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                try:
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up before the answer (a timed-out health check at
                    # start, a client killed mid-request): nothing to send it; not an error.
                    self.close_connection = True
                    log.debug("client %s left before the answer", self.address_string())

            def _json(self, status: int, obj: Any) -> None:
                self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

            def _handle(self) -> None:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    self.close_connection = True
                    self._json(411, _error("invalid_json", "send a Content-Length; no chunks"))
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length < 0:
                        raise ValueError
                except ValueError:
                    self.close_connection = True
                    self._json(400, _error("invalid_json", "bad Content-Length header"))
                    return
                if length > GATEWAY_MAX_BODY_BYTES:
                    self.close_connection = True
                    exc = PayloadTooLarge(
                        f"request body is larger than {GATEWAY_MAX_BODY_BYTES} bytes; "
                        "upload large inputs with POST /v1/uploads"
                    )
                    self._json(exc.http_status, exc.body())
                    return
                body = self.rfile.read(length) if length else b""
                path = urlsplit(self.path).path
                resource = route(self.command, path)
                if resource is None:
                    self._json(404, missing_authentication_token())
                    return
                key = self.headers.get("x-api-key")
                key_id = gateway.api_keys.get(key or "")
                if resource == "keyed" and key_id is None:
                    self._json(
                        403, {"error": {"code": "forbidden", "message": "Forbidden", "details": []}}
                    )
                    return
                event = build_event(
                    self.command,
                    self.path,
                    list(self.headers.items()),
                    body,
                    api_key=key if key_id else None,
                    api_key_id=key_id,
                    source_ip=self.client_address[0],
                )
                try:
                    resp = gateway.pool.invoke(API_HANDLER, event)
                except (BrokenProcessPool, RuntimeError) as exc:
                    if not gateway.stopping:
                        log.exception("handler invocation failed")
                    else:  # abandoned by the stop (reported in its summary line)
                        log.warning("%s %s abandoned by the stop (%s)", self.command, path, exc)
                    self._json(500, _error("internal", "Internal server error"))
                    return
                except Exception:
                    log.exception("handler invocation failed")
                    # API Gateway's integration failure, as the CDK app's DEFAULT_5XX response.
                    self._json(500, _error("internal", "Internal server error"))
                    return
                out_headers = dict(resp.get("headers") or {})
                for k, vs in (resp.get("multiValueHeaders") or {}).items():
                    out_headers[k] = ", ".join(vs)
                raw = resp.get("body") or ""
                data = base64.b64decode(raw) if resp.get("isBase64Encoded") else raw.encode()
                self._send(int(resp.get("statusCode", 200)), data, out_headers)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle

            def __getattr__(self, name: str) -> Any:
                # BaseHTTPRequestHandler looks up do_<METHOD> and answers 501 in HTML without
                # one; every other method gets API Gateway's answer instead.
                if name.startswith("do_"):
                    return self._handle
                raise AttributeError(name)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128  # bursts of clients, not socketserver's 5

        self.server = Server(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting connections (within the server's 0.5 s poll) and close the listening
        socket. Requests in progress go on in their daemon threads; their Lambda invocations end
        with the pool (:meth:`LambdaPool.close`), and an abandoned one is answered 500
        ``internal`` (as the CDK app's DEFAULT_5XX) with a one-line warning, no traceback."""
        self.stopping = True
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which must be running
            self.server.shutdown()
        self.server.server_close()
