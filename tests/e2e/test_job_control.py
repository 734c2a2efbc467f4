"""Job control on the local stack with the real model: cancel mid-generation with a partial
output, progress while running, timeouts, TTL expiry, large inputs and outputs, size limits."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

STORY = {
    "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
    "max_new_tokens": 1024,
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackProcess]:
    with local_stack(
        tmp_path_factory.mktemp("state"), "--models", "smollm2-135m-instruct,echo"
    ) as s:
        yield s


def submit(stack: LocalStackProcess, body: dict) -> dict:
    with stack.client() as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        return dict(r.json())


def test_progress_then_cancel_keeps_partial_output(stack: LocalStackProcess) -> None:
    job = submit(stack, {"model": "smollm2-135m-instruct", "input": STORY})
    stack.wait_status(job["id"], {"running"})
    deadline = time.monotonic() + 60
    with stack.client() as c:
        while True:
            seen = c.get(f"/v1/jobs/{job['id']}").json()
            if (seen.get("progress") or {}).get("completion_tokens", 0) >= 5 and seen["output"]:
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.3)
        assert seen["status"] == "running"
        assert seen["output"]["text"]
        r = c.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 200
    done = stack.wait_status(job["id"], {"cancelled", "succeeded"}, timeout=20)
    assert done["status"] == "cancelled"
    assert done["error"]["code"] == "cancelled"
    assert done["output"]["finish_reason"] == "cancelled"
    assert done["output"]["text"].startswith(seen["output"]["text"][:10])
    assert done["output"]["usage"]["completion_tokens"] >= seen["progress"]["completion_tokens"]
    with stack.client() as c:
        assert c.post(f"/v1/jobs/{job['id']}/cancel").status_code == 409


def test_generation_past_timeout_fails_with_timeout(stack: LocalStackProcess) -> None:
    job = submit(stack, {"model": "smollm2-135m-instruct", "input": STORY, "timeout_seconds": 1})
    done = stack.wait_status(job["id"], {"failed", "succeeded"}, timeout=60)
    assert done["status"] == "failed"
    assert done["error"]["code"] == "timeout"


def test_queued_job_expires_at_ttl_without_running(stack: LocalStackProcess) -> None:
    blocker = submit(stack, {"model": "echo", "input": {"sleep_seconds": 25}})
    stack.wait_status(blocker["id"], {"running"})
    job = submit(stack, {"model": "echo", "input": {"n": 1}, "ttl_seconds": 10})
    t0 = time.monotonic()
    expired = stack.wait_status(job["id"], {"expired", "succeeded"}, timeout=30)
    assert expired["status"] == "expired"
    assert expired["error"]["code"] == "expired"
    assert expired["attempts"] == 0 and expired["started_at"] is None
    assert time.monotonic() - t0 < 20
    deadline = time.monotonic() + 10
    while "job.expired" not in stack.event_types(job["id"]):
        assert time.monotonic() < deadline, stack.event_types(job["id"])
        time.sleep(0.2)
    with stack.client() as c:
        c.post(f"/v1/jobs/{blocker['id']}/cancel")


def test_upload_then_input_url(stack: LocalStackProcess) -> None:
    payload = {"doc": "z" * 200_000, "sleep_seconds": 0}
    with stack.client() as c:
        up = c.post("/v1/uploads")
        assert up.status_code == 201
        put = httpx.put(up.json()["upload_url"], content=json.dumps(payload).encode())
        assert put.status_code == 200
        r = c.post("/v1/jobs", json={"model": "echo", "input_url": up.json()["input_url"]})
        assert r.status_code == 202
    done = stack.wait_status(r.json()["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded"
    # The output is over 64 KB: served as a fresh presigned URL at each GET.
    assert done["output"] is None
    assert done["output_url"]
    assert httpx.get(done["output_url"]).json() == payload
    time.sleep(1.1)
    with stack.client() as c:
        again = c.get(f"/v1/jobs/{done['id']}").json()
    assert again["output_url"] and again["output_url"] != done["output_url"]


def test_large_inline_input_moves_to_s3_and_runs(stack: LocalStackProcess) -> None:
    job = submit(stack, {"model": "echo", "input": {"blob": "q" * 100_000}})
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded"
    assert httpx.get(done["output_url"]).json() == {"blob": "q" * 100_000}


@pytest.mark.parametrize("size_mb", [7, 11])
def test_bodies_over_the_limits_get_413(stack: LocalStackProcess, size_mb: int) -> None:
    body = b'{"model": "echo", "input": {"x": "' + b"a" * (size_mb * 1024 * 1024) + b'"}}'
    with stack.client() as c:
        r = c.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"
    assert "uploads" in r.json()["error"]["message"]
