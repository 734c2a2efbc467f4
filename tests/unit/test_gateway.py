"""The local API Gateway's routing: only the CDK app's resource methods reach the handler; any
other method or path gets the app's MISSING_AUTHENTICATION_TOKEN response in JSON (issue 17)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from asyncinfer.local.gateway import LocalGateway, route


class FakePool:
    """Stands in for the Lambda pool: records events, answers 200 ``{"ok": true}``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def invoke(self, handler: str, event: dict[str, Any]) -> dict[str, Any]:
        self.events.append(event)
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": "{}"}


@pytest.fixture
def gateway() -> Iterator[tuple[LocalGateway, FakePool]]:
    pool = FakePool()
    gw = LocalGateway(pool, {"key-a": "tenant-a"}, 0)  # type: ignore[arg-type]
    gw.start()
    try:
        yield gw, pool
    finally:
        gw.stop()


def call(gw: LocalGateway, method: str, path: str, key: str | None = None) -> tuple[int, Any, str]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request(method, path, headers={"x-api-key": key} if key else {})
        resp = conn.getresponse()
        raw = resp.read()
        body = json.loads(raw) if raw else None
        return resp.status, body, resp.getheader("Content-Type") or ""
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("TRACE", "/v1/models"),
        ("TRACE", "/v1/jobs"),
        ("CONNECT", "/v1/jobs"),
        ("PROPFIND", "/v1/jobs"),
        ("POST", "/v1/health"),
        ("DELETE", "/v1/health"),
        ("GET", "/"),
        ("GET", "/v1"),
        ("GET", "/v2/models"),
    ],
)
def test_no_resource_method_is_missing_authentication_token_in_json(
    gateway: tuple[LocalGateway, FakePool], method: str, path: str
) -> None:
    gw, pool = gateway
    status, body, ctype = call(gw, method, path, key="key-a")
    assert status == 404
    assert ctype == "application/json"
    assert body == {
        "error": {"code": "not_found", "message": "Missing Authentication Token", "details": []}
    }
    assert pool.events == []


def test_keyless_unknown_method_is_still_missing_authentication_token(
    gateway: tuple[LocalGateway, FakePool],
) -> None:
    gw, _ = gateway
    status, body, _ = call(gw, "TRACE", "/v1/jobs")
    assert status == 404 and body["error"]["message"] == "Missing Authentication Token"


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_proxy_resource_takes_every_gateway_method_with_a_key(
    gateway: tuple[LocalGateway, FakePool], method: str
) -> None:
    gw, pool = gateway
    assert call(gw, method, "/v1/models")[0] == 403
    status, _, _ = call(gw, method, "/v1/models", key="key-a")
    assert status == 200
    assert [e["httpMethod"] for e in pool.events] == [method]


def test_health_needs_no_key_and_only_get(gateway: tuple[LocalGateway, FakePool]) -> None:
    gw, pool = gateway
    assert call(gw, "GET", "/v1/health")[0] == 200
    assert call(gw, "PUT", "/v1/health")[0] == 404
    assert len(pool.events) == 1


def test_route_table() -> None:
    assert route("GET", "/v1/health") == "public"
    assert route("HEAD", "/v1/health") is None
    assert route("GET", "/v1/jobs/x/cancel") == "keyed"
    assert route("GET", "/v1/") is None
    assert route("TRACE", "/v1/jobs") is None


class BrokenPool(FakePool):
    def invoke(self, handler: str, event: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the handler process died")


def test_handler_failure_is_the_default_5xx_error_body() -> None:
    gw = LocalGateway(BrokenPool(), {"key-a": "tenant-a"}, 0)  # type: ignore[arg-type]
    gw.start()
    try:
        status, body, ctype = call(gw, "GET", "/v1/models", key="key-a")
    finally:
        gw.stop()
    assert (status, ctype) == (500, "application/json")
    assert body == {
        "error": {"code": "internal", "message": "Internal server error", "details": []}
    }


def test_a_client_gone_before_the_answer_is_not_an_error(
    gateway: tuple[LocalGateway, FakePool],
) -> None:
    """The stack's start-up health check gives up after 2 s on a busy machine; writing the late
    answer to its closed socket printed a BrokenPipeError traceback at every start."""
    gw, _ = gateway
    handler_class: Any = gw.server.RequestHandlerClass
    h = handler_class.__new__(handler_class)
    h.command, h.request_version, h.requestline = "GET", "HTTP/1.1", "GET /v1/health HTTP/1.1"
    h.client_address = ("127.0.0.1", 1)
    h.close_connection = False

    class Gone:
        def write(self, data: bytes) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    h.wfile = Gone()
    h._send(200, b"{}", {"Content-Type": "application/json"})  # must not raise
    assert h.close_connection


class AbandoningPool:
    """A pool whose invocation was abandoned by the stack's stop."""

    def invoke(self, handler: str, event: dict[str, Any]) -> dict[str, Any]:
        from concurrent.futures.process import BrokenProcessPool

        raise BrokenProcessPool("abandoned")


def test_an_invocation_abandoned_by_the_stop_logs_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = LocalGateway(AbandoningPool(), {"key-a": "tenant-a"}, 0)  # type: ignore[arg-type]
    gw.start()
    gw.stopping = True  # as stop() sets it before the pool is closed
    try:
        with caplog.at_level("WARNING", logger="asyncinfer.local"):
            status, body, _ = call(gw, "GET", "/v1/models", key="key-a")
    finally:
        gw.stop()
    assert status == 500 and body["error"]["code"] == "internal"
    assert [r.levelname for r in caplog.records if r.name.startswith("asyncinfer")] == ["WARNING"]
    assert all(r.exc_info is None for r in caplog.records)
