"""The key rule of the ``/openai/v1`` surface (``x-api-key`` or ``Authorization: Bearer``), the
local gateway's 401 there, and the multipart parser's refusals."""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from asyncinfer.core.errors import InvalidMultipart
from asyncinfer.local.gateway import LocalGateway, build_event, route
from asyncinfer.openai_api import multipart
from asyncinfer.openai_api.auth import api_key


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"Authorization": "Bearer k1"}, "k1"),
        ({"authorization": "bearer  k1 "}, "k1"),
        ({"x-api-key": "k2"}, "k2"),
        ({"X-Api-Key": "k2", "Authorization": "Bearer k1"}, "k2"),
        ({"Authorization": "Basic azE6"}, None),
        ({"Authorization": "Bearer "}, None),
        ({"x-api-key": " "}, None),
        ({}, None),
    ],
)
def test_api_key_from_headers(headers: dict[str, str], key: str | None) -> None:
    assert api_key(headers) == key
    assert api_key(list(headers.items())) == key


def test_openai_paths_are_a_keyed_resource() -> None:
    assert route("GET", "/openai/v1/files") == "openai"
    assert route("DELETE", "/openai/v1/files/file-x") == "openai"
    assert route("GET", "/openai/") is None
    assert route("TRACE", "/openai/v1/files") is None
    assert route("GET", "/v1/jobs") == "keyed"


class FakePool:
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


def call(gw: LocalGateway, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_gateway_openai_needs_a_valid_key_401(gateway: tuple[LocalGateway, FakePool]) -> None:
    gw, pool = gateway
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        status, body = call(gw, "/openai/v1/files", headers)
        assert status == 401, headers
        err = body["error"]
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        assert err["param"] is None and "message" in err
    assert pool.events == []
    assert call(gw, "/openai/v1/files", {"Authorization": "Bearer key-a"})[0] == 200
    assert call(gw, "/openai/v1/files", {"x-api-key": "key-a"})[0] == 200
    ids = [e["requestContext"]["identity"]["apiKeyId"] for e in pool.events]
    assert ids == ["tenant-a", "tenant-a"]


def test_gateway_v1_keeps_403_and_takes_bearer_too(gateway: tuple[LocalGateway, FakePool]) -> None:
    gw, _ = gateway
    status, body = call(gw, "/v1/models", {"Authorization": "Bearer wrong"})
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert call(gw, "/v1/models", {"Authorization": "Bearer key-a"})[0] == 200


def test_multipart_bodies_reach_the_handler_base64() -> None:
    data = b"--b\r\n\r\n{}\r\n--b--\r\n"
    event = build_event(
        "POST",
        "/openai/v1/files",
        [("Content-Type", "multipart/form-data; boundary=b")],
        data,
        api_key="k",
        api_key_id="t",
        source_ip="127.0.0.1",
    )
    assert event["isBase64Encoded"] is True and base64.b64decode(event["body"]) == data


def _form(*parts: bytes, boundary: str = "B") -> bytes:
    return b"".join(b"--" + boundary.encode() + b"\r\n" + p + b"\r\n" for p in parts) + (
        b"--" + boundary.encode() + b"--\r\n"
    )


def test_multipart_parse_fields_and_file() -> None:
    body = _form(
        b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch',
        b'Content-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n{}\r\n{}",
    )
    form = multipart.parse("multipart/form-data; boundary=B", body)
    assert form.fields == {"purpose": "batch"}
    assert form.files["file"].filename == "a.jsonl" and form.files["file"].data == b"{}\r\n{}"


@pytest.mark.parametrize(
    ("ctype", "body"),
    [
        ("multipart/form-data", b"x"),
        ("multipart/form-data; boundary=B", _form(b"Content-Disposition: form-data\r\n\r\nx")),
        (
            "multipart/form-data; boundary=B",
            _form(b'Content-Disposition: form-data; name="purpose"\r\n\r\n\xff'),
        ),
    ],
)
def test_multipart_refusals(ctype: str, body: bytes) -> None:
    with pytest.raises(InvalidMultipart) as err:
        multipart.parse(ctype, body)
    assert err.value.http_status == 400
