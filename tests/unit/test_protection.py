"""ECS task scale-in protection requests, against a stand-in ECS agent on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from asyncinfer.worker.protection import ScaleInProtection


@pytest.fixture
def agent() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class H(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            assert self.path == "/task-protection/v1/state"
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a: Any) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()


def test_protection_on_while_busy_and_off_when_idle(agent: tuple[str, list]) -> None:
    uri, seen = agent
    p = ScaleInProtection(uri)
    p.set(busy=True)
    p.set(busy=True)  # already held: no second request
    p.set(busy=False)
    p.set(busy=False)
    assert seen == [
        {"ProtectionEnabled": True, "ExpiresInMinutes": 60},
        {"ProtectionEnabled": False},
    ]


def test_no_agent_no_requests() -> None:
    p = ScaleInProtection("")
    p.set(busy=True)
    assert not p.enabled


def test_agent_failure_is_not_fatal() -> None:
    p = ScaleInProtection("http://127.0.0.1:1")
    p.set(busy=True)
    assert not p.enabled


def test_busy_file_for_the_local_autoscaler(tmp_path: Any) -> None:
    path = tmp_path / "w.busy"
    p = ScaleInProtection("", str(path))
    assert path.read_text() == "0"
    p.set(busy=True)
    assert path.read_text() == "1"
    p.set(busy=False)
    assert path.read_text() == "0"
