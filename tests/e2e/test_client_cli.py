"""The client and the CLI against ``asyncinfer local`` (echo model only): every call, sync and
async; error mapping; uploads; the batch path with a resume after SIGKILL; CLI exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncinfer.cli import main
from asyncinfer.client import (
    AsyncClient,
    Client,
    ConflictError,
    InvalidRequestError,
    Job,
    NotFoundError,
    WaitTimeout,
    WebhookVerificationError,
    verify_webhook,
)
from asyncinfer.client.webhooks import sign_webhook
from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e

EXE = str(Path(sys.executable).parent / "asyncinfer")


@dataclass
class Stack:
    proc: subprocess.Popen[str]
    api: str
    key: str
    other_key: str
    lines: list[str]

    def client(self, key: str | None = None) -> Client:
        return Client(self.api, key or self.key)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(
        tmp_path_factory.mktemp("state"),
        *("--models", "echo", "--max-workers", "1", "--extra-key", "batch"),
    ) as s:
        yield Stack(s.proc, s.api, s.key, s.local["extra_keys"]["batch"], s.lines)


@pytest.fixture
def env(stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Stack:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASYNCINFER_URL", stack.api)
    monkeypatch.setenv("ASYNCINFER_API_KEY", stack.key)
    return stack


# ------------------------------------------------------------------------- sync client
def test_sync_calls(stack: Stack, tmp_path: Path) -> None:
    with stack.client() as c:
        assert c.health() == {"status": "ok"}
        assert [m.id for m in c.models()] == ["echo"]
        job = c.submit("echo", {"n": 1}, metadata={"ref": "r1"}, priority="high")
        assert isinstance(job, Job) and job.status == "queued" and job.id.startswith("job_")
        done = c.wait(job.id, timeout=30)
        assert done.succeeded and done.output == {"n": 1} and done.metadata == {"ref": "r1"}
        assert done.completed_at is not None and done.metrics["run_seconds"] is not None
        assert c.get(job.id).status == "succeeded"
        # idempotency: same key and body -> same job; another body -> ConflictError
        a = c.submit("echo", {"n": 2}, idempotency_key="k-same")
        assert c.submit("echo", {"n": 2}, idempotency_key="k-same").id == a.id
        with pytest.raises(ConflictError) as ei:
            c.submit("echo", {"n": 3}, idempotency_key="k-same")
        assert ei.value.status == 409 and ei.value.code == "conflict"
        # cancel: queued-or-running, then a terminal job is a conflict
        slow = c.submit("echo", {"sleep_seconds": 20})
        assert c.cancel(slow.id).status in ("cancelled", "running")
        assert c.wait(slow.id, timeout=15).status == "cancelled"
        with pytest.raises(ConflictError):
            c.cancel(slow.id)
        # wait with a timeout on a slow job
        slow2 = c.submit("echo", {"sleep_seconds": 10})
        t0 = time.monotonic()
        with pytest.raises(WaitTimeout) as wt:
            c.wait(slow2.id, timeout=1.0)
        assert 0.9 < time.monotonic() - t0 < 5 and wt.value.job.id == slow2.id
        c.cancel(slow2.id)
        # upload: a file path and bytes
        big = tmp_path / "in.json"
        big.write_text(json.dumps({"blob": "x" * 100_000}))
        url = c.upload(big)
        assert url.startswith("s3://")
        up = c.wait(c.submit("echo", input_url=url).id, timeout=30)
        assert up.succeeded and (up.output is not None or up.output_url)
        url2 = c.upload(b'{"small": true}')
        assert c.wait(c.submit("echo", input_url=url2).id, timeout=30).output == {"small": True}


def test_list_iterates_over_pages(stack: Stack) -> None:
    with stack.client() as c:
        ids = [c.submit("echo", {"page": i}).id for i in range(5)]
        listed = [j.id for j in c.list(model="echo", page_size=2)]
        assert all(i in listed for i in ids)
        assert listed == sorted(listed, reverse=True)  # newest first
        assert len(list(c.list(page_size=2, limit=3))) == 3
        pages = list(c.list_pages(page_size=2))
        assert len(pages) >= 3 and pages[-1].next_cursor is None


def test_error_mapping(stack: Stack) -> None:
    with stack.client() as c:
        with pytest.raises(NotFoundError) as nf:
            c.get("job_01NOPE00000000000000000000")
        assert nf.value.status == 404 and nf.value.code == "not_found"
        with pytest.raises(InvalidRequestError) as ir:
            c.submit("echo", {"sleep_seconds": 999})
        assert ir.value.status == 422 and ir.value.code == "invalid_request"
        assert any("sleep_seconds" in d.get("field", "") for d in ir.value.details)
        with pytest.raises(InvalidRequestError) as ir2:
            c.submit("no-such-model", {})
        assert ir2.value.details[0]["field"] == "model"
        job = c.submit("echo", {})
    with stack.client(stack.other_key) as other, pytest.raises(NotFoundError):
        other.get(job.id)  # another tenant's job


def test_webhook_secret_verifies_a_signed_event(stack: Stack) -> None:
    with stack.client() as c:
        secret = c.webhook_secret()
        assert secret.secret.startswith("whsec_")
        assert c.webhook_secret().secret == secret.secret
        job = c.wait(c.submit("echo", {"w": 1}).id, timeout=30)
    body = json.dumps(
        {
            "type": "job.succeeded",
            "timestamp": "2026-01-01T00:00:00Z",
            "data": job.model_dump(mode="json"),
        }
    )
    headers = sign_webhook(secret.secret, "msg_x", int(time.time()), body)
    assert verify_webhook(secret, headers, body).data.id == job.id


# ------------------------------------------------------------------------- async client
def test_async_calls(stack: Stack) -> None:
    async def go() -> None:
        async with AsyncClient(stack.api, stack.key) as c:
            assert (await c.health())["status"] == "ok"
            assert [m.id for m in await c.models()] == ["echo"]
            jobs = await asyncio.gather(*(c.submit("echo", {"a": i}) for i in range(4)))
            done = await asyncio.gather(*(c.wait(j.id, timeout=30) for j in jobs))
            assert [d.output for d in done] == [{"a": i} for i in range(4)]
            assert (await c.get(jobs[0].id)).succeeded
            listed = [j.id async for j in c.list(page_size=2, limit=3)]
            assert len(listed) == 3
            pages = [p async for p in c.list_pages(page_size=50)]
            assert pages[-1].next_cursor is None
            slow = await c.submit("echo", {"sleep_seconds": 20})
            await c.cancel(slow.id)
            assert (await c.wait(slow.id, timeout=15)).status == "cancelled"
            with pytest.raises(ConflictError):
                await c.cancel(slow.id)
            with pytest.raises(NotFoundError):
                await c.get("job_01NOPE00000000000000000000")
            url = await c.upload({"up": 1})
            assert (await c.wait((await c.submit("echo", input_url=url)).id, 30)).output == {
                "up": 1
            }
            assert (await c.webhook_secret()).secret.startswith("whsec_")

    asyncio.run(go())


# ------------------------------------------------------------------------- CLI
def test_cli_exit_codes_and_output(env: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "echo", "--input", '{"hello": "cli"}']) == 0
    job_id = capsys.readouterr().out.strip()
    assert job_id.startswith("job_")
    assert main(["wait", job_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == {"hello": "cli"}
    assert main(["get", job_id]) == 0
    assert "succeeded" in capsys.readouterr().out
    # --wait prints the output; a failed job exits 1
    assert main(["submit", "echo", "--input", '{"k": "v"}', "--wait"]) == 0
    assert '"k": "v"' in capsys.readouterr().out
    fail = '{"fail": {"kind": "permanent"}}'
    assert main(["submit", "echo", "--input", fail, "--wait", "--json"]) == 1
    failed = json.loads(capsys.readouterr().out)
    assert failed["status"] == "failed" and failed["error"]["code"] == "invalid_input"
    assert main(["get", failed["id"]]) == 1
    capsys.readouterr()
    # cancel: 0; a second cancel of the cancelled job is an HTTP 409: the command failed
    assert main(["submit", "echo", "--input", '{"sleep_seconds": 20}']) == 0
    slow = capsys.readouterr().out.strip()
    assert main(["cancel", slow]) == 0
    assert main(["wait", slow, "--timeout", "15"]) == 1  # cancelled
    capsys.readouterr()
    assert main(["cancel", slow, "--json"]) == 3
    err = json.loads(capsys.readouterr().err)
    assert err["error"]["code"] == "conflict" and err["error"]["status"] == 409
    # HTTP errors: 404 and 422
    assert main(["get", "job_01NOPE00000000000000000000"]) == 3
    assert "not_found" in capsys.readouterr().err
    assert main(["submit", "nope", "--input", "{}"]) == 3
    assert "invalid_request" in capsys.readouterr().err
    # wait timing out: the command failed
    assert main(["submit", "echo", "--input", '{"sleep_seconds": 10}']) == 0
    slow2 = capsys.readouterr().out.strip()
    assert main(["wait", slow2, "--timeout", "0.5"]) == 3
    main(["cancel", slow2])
    capsys.readouterr()
    # listing and models
    assert main(["ls", "--json", "--limit", "3"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    assert main(["ls", "--status", "failed"]) == 0
    assert failed["id"] in capsys.readouterr().out
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == "echo"
    assert main(["webhook-secret"]) == 0
    assert capsys.readouterr().out.startswith("whsec_")
    # a wrong key: 403 from the gateway, the command failed
    assert main(["models", "--api-key", "wrong"]) == 3
    assert "forbidden" in capsys.readouterr().err


def test_cli_verify_webhook_fetches_the_secret(env: Stack, tmp_path: Path) -> None:
    with env.client() as c:
        secret = c.webhook_secret().secret
        job = c.wait(c.submit("echo", {}).id, timeout=30)
    body = json.dumps({"type": "job.succeeded", "data": job.model_dump(mode="json")})
    (tmp_path / "body.json").write_text(body)
    headers = sign_webhook(secret, "msg_1", int(time.time()), body)
    hargs = [a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]
    assert main(["verify-webhook", "--body", "body.json", *hargs]) == 0
    headers["webhook-signature"] = sign_webhook("whsec_" + "C" * 32, "msg_1", 1, body)[
        "webhook-signature"
    ]
    hargs = [a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]
    assert main(["verify-webhook", "--body", "body.json", *hargs]) == 1


# ------------------------------------------------------------------------- batches
def _batch_file(path: Path, n: int, sleep: float) -> None:
    with path.open("w") as f:
        for i in range(n):
            line = {"custom_id": f"line-{i:02d}", "model": "echo", "input": {"i": i}}
            if sleep:
                line["input"]["sleep_seconds"] = sleep  # type: ignore[index]
            f.write(json.dumps(line) + "\n")


def _run_batch(stack: Stack, cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "ASYNCINFER_URL": stack.api, "ASYNCINFER_API_KEY": stack.other_key}
    return subprocess.Popen(
        [EXE, "batch", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_batch_resumes_after_sigkill(stack: Stack, tmp_path: Path) -> None:
    """Kill the batch half way, run it again: one job per line, the output complete, in order.
    Runs as the ``batch`` tenant, whose only jobs are this batch's."""
    n = 8
    _batch_file(tmp_path / "in.jsonl", n, sleep=0.3)
    args = ["in.jsonl", "-o", "out.jsonl", "--concurrency", "2", "--no-progress"]
    first = _run_batch(stack, tmp_path, *args)
    partial = tmp_path / "out.jsonl.partial"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if partial.exists() and len(partial.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    written = len(partial.read_text().splitlines())
    assert 2 <= written < n, f"killed too late or too early: {written} lines"
    assert not (tmp_path / "out.jsonl").exists()

    second = _run_batch(stack, tmp_path, *args, "--json")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    summary = json.loads(out)
    assert summary["total"] == n and summary["succeeded"] == n and summary["failed"] == 0
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == [f"line-{i:02d}" for i in range(n)]
    assert all(r["status"] == "succeeded" and r["output"]["i"] == i for i, r in enumerate(rows))
    assert not partial.exists()

    with stack.client(stack.other_key) as c:
        jobs = list(c.list(page_size=5))
    assert len(jobs) == n, "a line made a second job"
    assert sorted(j.id for j in jobs) == sorted(r["job_id"] for r in rows)


def test_batch_in_process_with_a_rejected_and_a_failed_line(stack: Stack, tmp_path: Path) -> None:
    f = tmp_path / "b.jsonl"
    f.write_text(
        json.dumps({"custom_id": "ok", "model": "echo", "input": {"v": 1}})
        + "\n"
        + json.dumps({"custom_id": "bad", "model": "nope", "input": {}})
        + "\n"
        + json.dumps(
            {"custom_id": "boom", "model": "echo", "input": {"fail": {"kind": "permanent"}}}
        )
        + "\n"
    )
    with stack.client() as c:
        summary = c.submit_batch(f, tmp_path / "o.jsonl", concurrency=3)
    assert (summary.total, summary.succeeded, summary.failed) == (3, 1, 2) and not summary.ok
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["succeeded", "rejected", "failed"]
    assert rows[1]["error"]["code"] == "invalid_request" and rows[1]["job_id"] is None
    assert rows[2]["error"]["code"] == "invalid_input"

    async def go() -> Any:
        async with AsyncClient(stack.api, stack.key) as ac:
            return await ac.submit_batch(f, tmp_path / "o2.jsonl", wait=False)

    again = asyncio.run(go())
    assert again.total == 3
    rows2 = [json.loads(x) for x in (tmp_path / "o2.jsonl").read_text().splitlines()]
    assert [r["job_id"] for r in rows2] == [r["job_id"] for r in rows]  # found, not remade


# ------------------------------------------------------------------------- webhooks
def test_a_real_delivery_verifies(stack: Stack) -> None:
    """The docs' receiver pattern: a local receiver checks a real delivery with the helper."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[tuple[dict[str, str], bytes]] = []
    arrived = threading.Event()

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            got.append((dict(self.headers), body))
            arrived.set()
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with stack.client() as c:
            secret = c.webhook_secret()
            url = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
            job = c.submit("echo", {"hook": 1}, webhook={"url": url, "events": ["job.succeeded"]})
            c.wait(job.id, timeout=30)
            assert arrived.wait(30), "no webhook delivery within 30 s"
    finally:
        httpd.shutdown()
        httpd.server_close()
    headers, body = got[0]
    event = verify_webhook(secret, headers, body)
    assert event.type == "job.succeeded" and event.data.id == job.id
    assert event.data.output == {"hook": 1}
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, headers, body.replace(b"hook", b"hooK"))
