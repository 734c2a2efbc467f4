"""End to end: ``asyncinfer local --models echo`` as a subprocess; a job's ``job.succeeded``
webhook reaches a receiver on 127.0.0.1 and verifies with the secret of GET /v1/webhooks/secret."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with local_stack(tmp_path_factory.mktemp("state"), "--models", "echo") as s:
        yield {**s.local, "lines": s.lines}


def test_job_succeeded_webhook_reaches_receiver_and_verifies(stack: dict[str, Any]) -> None:
    hits: list[tuple[dict[str, str], bytes]] = []
    got = threading.Event()

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            hits.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()
            got.set()

        def log_message(self, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks/asyncinfer"
    try:
        with httpx.Client(
            base_url=stack["api_url"], headers={"x-api-key": stack["api_key"]}, timeout=60
        ) as c:
            r = c.get("/v1/webhooks/secret")
            assert r.status_code == 200, r.text
            secret = r.json()["secret"]
            r = c.post(
                "/v1/jobs",
                json={
                    "model": "echo",
                    "input": {"greeting": "bonjour 🥐", "x": 0.5, "nested": {"k": [1, 2]}},
                    "webhook": {"url": url, "events": ["job.succeeded"]},
                },
            )
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            assert r.json()["webhook"]["status"] == "pending"
            assert got.wait(120), "no webhook arrived:\n" + "\n".join(stack["lines"][-30:])
            deadline = time.monotonic() + 30
            while True:
                job = c.get(f"/v1/jobs/{job_id}").json()
                if job["webhook"]["status"] == "delivered" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    finally:
        server.shutdown()
        server.server_close()
    headers, body = hits[0]
    event = Webhook(secret).verify(body, headers)
    assert event["type"] == "job.succeeded"
    assert event["data"]["id"] == job_id and event["data"]["status"] == "succeeded"
    assert event["data"]["output"]["greeting"] == "bonjour 🥐"
    assert len(hits) == 1  # only the subscribed event type
    assert job["webhook"]["status"] == "delivered"
    assert job["webhook"]["attempts"] == 1 and job["webhook"]["last_http_status"] == 204
