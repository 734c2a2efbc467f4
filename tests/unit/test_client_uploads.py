"""The client uploads through the capped POST form when the service offers one, and refuses an
input over ``max_bytes`` before sending it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from asyncinfer.client import Client, Config, PayloadTooLargeError


class Storage:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.upload: dict[str, Any] = {}


@pytest.fixture
def server() -> Iterator[tuple[str, Storage]]:
    storage = Storage()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def do_POST(self) -> None:
            body = self._body()
            storage.requests.append(("POST", self.path, dict(self.headers), body))
            if self.path == "/v1/uploads":
                data = json.dumps(storage.upload).encode()
                self.send_response(201)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

        def do_PUT(self) -> None:
            storage.requests.append(("PUT", self.path, dict(self.headers), self._body()))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    storage.upload = {
        "upload_url": f"{url}/bucket/uploads/k/x.json?sig=1",
        "input_url": "s3://bucket/uploads/k/x.json",
        "expires_at": "2026-12-01T00:00:00Z",
        "max_bytes": 1000,
        "upload_form": {
            "url": f"{url}/bucket",
            "fields": {"key": "uploads/k/x.json", "policy": "cG9saWN5", "x-amz-signature": "s"},
        },
    }
    try:
        yield url, storage
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_upload_posts_the_form_fields_then_the_file(server: tuple[str, Storage]) -> None:
    url, storage = server
    with Client(config=Config(base_url=url, api_key="k", timeout=5)) as c:
        assert c.upload(b'{"a": "x=1&y"}') == "s3://bucket/uploads/k/x.json"
    method, path, headers, body = storage.requests[-1]
    assert (method, path) == ("POST", "/bucket")
    assert "x-api-key" not in {k.lower() for k in headers}  # presigned: no API key leaves
    msg = BytesParser(policy=HTTP).parsebytes(
        f"content-type: {headers['content-type']}\r\n\r\n".encode() + body
    )
    parts = [
        (p.get_param("name", header="content-disposition"), p.get_content())
        for p in msg.iter_parts()
    ]
    assert [name for name, _ in parts] == ["key", "policy", "x-amz-signature", "file"]
    assert parts[-1][1] == b'{"a": "x=1&y"}'


def test_upload_over_max_bytes_is_refused_before_sending(server: tuple[str, Storage]) -> None:
    url, storage = server
    config = Config(base_url=url, api_key="k", timeout=5)
    with Client(config=config) as c, pytest.raises(PayloadTooLargeError):
        c.upload(b"x" * 1001)
    assert [r[1] for r in storage.requests] == ["/v1/uploads"]


def test_upload_puts_when_the_service_has_no_form(server: tuple[str, Storage]) -> None:
    url, storage = server
    storage.upload = {
        k: v for k, v in storage.upload.items() if k not in ("upload_form", "max_bytes")
    }
    with Client(config=Config(base_url=url, api_key="k", timeout=5)) as c:
        c.upload(b"{}")
    assert storage.requests[-1][:2] == ("PUT", "/bucket/uploads/k/x.json?sig=1")
