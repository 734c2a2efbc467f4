"""End to end: ``asyncinfer local`` as a subprocess, the real SmolLM2 model, HTTP only."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from asyncinfer.local.stack import free_port
from asyncinfer.local.warm import process_exists
from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e


@dataclass
class Stack:
    proc: subprocess.Popen[str]
    api: str
    key: str
    local: dict
    lines: list[str] = field(default_factory=list)

    def client(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.api, headers={"x-api-key": key or self.key}, timeout=60)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(
        tmp_path_factory.mktemp("state"),
        *("--models", "smollm2-135m-instruct,echo", "--extra-key", "other"),
    ) as s:
        yield Stack(proc=s.proc, api=s.api, key=s.key, local=s.local, lines=s.lines)


def wait_terminal(c: httpx.Client, job_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(f"/v1/jobs/{job_id}", params={"wait": 20})
        assert r.status_code == 200, r.text
        job = r.json()
        if job["status"] in ("succeeded", "failed", "cancelled", "expired"):
            return job
        assert time.monotonic() < deadline, f"job still {job['status']}"


def test_ready_line_and_local_json(stack: Stack) -> None:
    assert stack.api.startswith("http://127.0.0.1:")
    assert stack.local["api_url"] == stack.api and stack.local["api_key"] == stack.key
    assert stack.local["region"] == "us-east-1"
    assert set(stack.local["queues"]) == {
        f"{m}{c}" for m in ("smollm2-135m-instruct", "echo") for c in ("", "#high", "#low")
    }
    for k in ("aws_endpoint_url", "table", "bucket", "topic_arn"):
        assert stack.local[k]
    assert "other" in stack.local["extra_keys"]


def test_paris(stack: Stack) -> None:
    with stack.client() as c:
        r = c.post(
            "/v1/jobs",
            json={
                "model": "smollm2-135m-instruct",
                "input": {
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "max_new_tokens": 64,
                    "temperature": 0.0,
                },
            },
        )
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
        job = wait_terminal(c, r.json()["id"])
    assert job["status"] == "succeeded", job
    assert "Paris" in job["output"]["text"]
    assert job["output"]["finish_reason"] == "stop"
    assert job["output"]["usage"]["prompt_tokens"] > 10
    assert 0 < job["output"]["usage"]["completion_tokens"] <= 64
    assert job["started_at"] and job["completed_at"]
    assert job["metrics"]["queue_seconds"] is not None and job["metrics"]["queue_seconds"] >= 0
    assert job["metrics"]["run_seconds"] > 0
    assert job["attempts"] == 1
    # One log line per state change, read from the events topic.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen = [line.split()[1] for line in stack.lines if job["id"] in line and "job." in line]
        if "job.succeeded" in seen:
            break
        time.sleep(0.2)
    assert [s for s in seen if s.startswith("job.")] == [
        "job.queued",
        "job.started",
        "job.succeeded",
    ]


def test_keys_and_tenants(stack: Stack) -> None:
    assert httpx.get(stack.api + "/v1/health").json() == {"status": "ok"}
    for headers in ({}, {"x-api-key": "wrong"}):
        r = httpx.get(stack.api + "/v1/models", headers=headers)
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "forbidden"
    with stack.client() as c:
        job = c.post("/v1/jobs", json={"model": "echo", "input": {"n": 1}}).json()
    with stack.client(stack.local["extra_keys"]["other"]) as other:
        r = other.get(f"/v1/jobs/{job['id']}")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"
        assert other.get("/v1/jobs").json()["jobs"] == []


def test_bad_input_over_http(stack: Stack) -> None:
    with stack.client() as c:
        r = c.post("/v1/jobs", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = c.post("/v1/jobs", json={"model": "nope", "input": {}})
        assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "model"


def test_sigint_stops_everything_within_15s(stack: Stack) -> None:
    with stack.client() as c:
        job = c.post("/v1/jobs", json={"model": "echo", "input": {"sleep_seconds": 30}}).json()
        deadline = time.monotonic() + 30
        while c.get(f"/v1/jobs/{job['id']}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    moto = stack.local["aws_endpoint_url"]
    t0 = time.monotonic()
    stack.proc.send_signal(signal.SIGINT)
    assert stack.proc.wait(timeout=15) == 0
    assert time.monotonic() - t0 < 15
    with pytest.raises(httpx.HTTPError):
        httpx.get(moto + "/moto-api/", timeout=2)
    with pytest.raises(httpx.HTTPError):
        httpx.get(stack.api + "/v1/health", timeout=2)
    released = [line for line in stack.lines if job["id"] in line and "job.queued" in line]
    assert len(released) == 2, "the running job was released back to queued before exit"


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (``/proc``)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_sigterm_while_starting_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGTERM (what ``timeout``, systemd and ``Popen.terminate`` send) as soon as local.json
    exists, while the fork server may still be importing torch: the stack stops in order,
    exits 0, and leaves neither the emulator nor the fork server (nor any worker) running."""
    exe = Path(sys.executable).parent / "asyncinfer"
    proc = subprocess.Popen(
        [str(exe), "local", "--port", str(free_port()), "--state-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "local.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no local.json"
            time.sleep(0.05)
        children = _children(proc.pid)
        assert children  # the emulator, the fork server, the Lambda pool
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while any(process_exists(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in children if process_exists(p)] == []
        assert not (tmp_path / "local.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
