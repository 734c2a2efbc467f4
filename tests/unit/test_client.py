"""The client without the local stack: retries against a tiny HTTP server, error mapping,
configuration, batch files, webhook verification, and CLI exit codes that need no API."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncinfer.cli import main
from asyncinfer.client import (
    APIConnectionError,
    APIError,
    AsyncClient,
    AuthenticationError,
    BatchFileError,
    Client,
    Config,
    ConfigurationError,
    ConflictError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    RetryPolicy,
    WebhookSecret,
    WebhookVerificationError,
    read_batch,
    resolve_config,
    sign_webhook,
    verify_webhook,
)
from asyncinfer.client._protocol import error_from_response

JOB = {
    "id": "job_01TEST",
    "status": "succeeded",
    "model": "echo",
    "priority": "normal",
    "attempts": 1,
    "created_at": "2026-11-30T06:21:03.123Z",
    "started_at": "2026-11-30T06:21:03.200Z",
    "completed_at": "2026-11-30T06:21:03.300Z",
    "expires_at": "2026-11-30T12:21:03.123Z",
    "output": {"x": 1},
    "output_url": None,
    "error": None,
    "progress": None,
    "metrics": {"queue_seconds": 0.1, "run_seconds": 0.1},
    "webhook": None,
    "metadata": {},
    "urls": {"get": "/v1/jobs/job_01TEST"},
}
FAST = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.05)


class Script:
    """What the test server answers: a list of (status, body, headers), the last one repeated."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, Any, dict[str, str]]] = [(200, JOB, {})]
        self.requests: list[tuple[str, str, dict[str, str]]] = []


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            if n:
                self.rfile.read(n)
            script.requests.append((self.command, self.path, dict(self.headers)))
            i = min(len(script.requests) - 1, len(script.answers) - 1)
            status, body, headers = script.answers[i]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *a: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()
    httpd.server_close()


def client(url: str) -> Client:
    return Client(config=Config(base_url=url, api_key="k", timeout=5, retry=FAST))


UNAVAILABLE = (503, {"error": {"code": "internal", "message": "try later", "details": []}}, {})


# ------------------------------------------------------------------------- retries
def test_get_retries_503_then_succeeds(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [UNAVAILABLE, UNAVAILABLE, (200, JOB, {})]
    with client(url) as c:
        job = c.get("job_01TEST")
    assert job.id == "job_01TEST" and job.succeeded and job.output == {"x": 1}
    assert len(script.requests) == 3
    assert all(r[2]["x-api-key"] == "k" for r in script.requests)


def test_async_get_retries_503_then_succeeds(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [UNAVAILABLE, (200, JOB, {})]

    async def go() -> Any:
        async with AsyncClient(config=Config(base_url=url, api_key="k", retry=FAST)) as c:
            return await c.get("job_01TEST")

    assert asyncio.run(go()).status == "succeeded"
    assert len(script.requests) == 2


def test_wait_goes_on_with_plain_reads_when_its_long_polls_are_refused(
    server: tuple[str, Script],
) -> None:
    url, script = server
    limited = (429, {"error": {"code": "rate_limited", "message": "busy", "details": []}}, {})
    running = {**JOB, "status": "running", "completed_at": None, "output": None}
    # Every ?wait poll is 429 (the first and its 3 retries); then a plain read, then done.
    script.answers = [limited] * 4 + [(200, running, {}), (200, JOB, {})]
    with client(url) as c:
        job = c.wait("job_01TEST", timeout=30, poll=0.1)
    assert job.succeeded
    paths = [r[1] for r in script.requests]
    assert all("wait=" in p for p in paths[:4]) and "wait=" not in paths[4]


def test_retries_give_up_with_the_mapped_error(server: tuple[str, Script]) -> None:
    url, script = server
    limited = (
        429,
        {"error": {"code": "rate_limited", "message": "slow down"}},
        {"retry-after": "0"},
    )
    script.answers = [limited]
    with client(url) as c, pytest.raises(RateLimitedError) as ei:
        c.models()
    assert ei.value.code == "rate_limited" and ei.value.status == 429
    assert len(script.requests) == 4  # 1 + max_retries


def test_submit_retried_only_with_an_idempotency_key(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [UNAVAILABLE, (202, {**JOB, "status": "queued"}, {})]
    with client(url) as c:
        job = c.submit("echo", {"a": 1})
    assert job.status == "queued"
    keys = [r[2].get("idempotency-key") for r in script.requests]
    assert len(keys) == 2 and keys[0] and keys[0] == keys[1]  # generated once, resent

    script.requests.clear()
    script.answers = [UNAVAILABLE, (202, JOB, {})]
    with client(url) as c, pytest.raises(InternalServerError) as ei:
        c.submit("echo", {"a": 1}, idempotency_key=False)
    assert ei.value.status == 503 and len(script.requests) == 1
    assert "idempotency-key" not in script.requests[0][2]


def test_connection_refused_is_retried_then_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    calls: list[float] = []
    c = client(f"http://127.0.0.1:{port}")
    c._sleep = calls.append  # type: ignore[method-assign]
    with c, pytest.raises(APIConnectionError):
        c.health()
    assert len(calls) == 3  # slept before each of the 3 retries


def test_backoff_is_exponential_with_jitter_and_honours_retry_after() -> None:
    p = RetryPolicy(max_retries=5, base_delay=0.5, max_delay=8.0)
    for attempt in range(6):
        for _ in range(50):
            assert 0 <= p.delay(attempt) <= min(8.0, 0.5 * 2**attempt)
    assert p.delay(0, retry_after=3.0) >= 3.0
    assert p.delay(0, retry_after=100.0) == 8.0


# ------------------------------------------------------------------------- errors
def _resp(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("GET", "http://x/"))


def test_error_mapping_by_code_and_status() -> None:
    details = [{"field": "input.max_new_tokens", "message": "too big", "type": "less_than"}]
    e = error_from_response(
        _resp(422, {"error": {"code": "invalid_request", "message": "bad", "details": details}})
    )
    assert isinstance(e, InvalidRequestError) and e.details == details and e.status == 422
    assert "input.max_new_tokens" in str(e)
    assert isinstance(
        error_from_response(_resp(404, {"error": {"code": "not_found"}})), NotFoundError
    )
    assert isinstance(
        error_from_response(_resp(409, {"error": {"code": "conflict"}})), ConflictError
    )
    e = error_from_response(_resp(403, {"message": "Forbidden"}))
    assert isinstance(e, AuthenticationError) and e.code == "forbidden" and e.message == "Forbidden"
    e = error_from_response(_resp(502, {"message": "Internal server error"}))
    assert isinstance(e, InternalServerError)
    e = error_from_response(_resp(418, "teapot"))
    assert type(e) is APIError and e.code == "http_418"


# ------------------------------------------------------------------------- configuration
def test_config_from_arguments_env_and_local_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ASYNCINFER_URL", raising=False)
    monkeypatch.delenv("ASYNCINFER_API_KEY", raising=False)
    with pytest.raises(ConfigurationError):
        resolve_config()
    (tmp_path / ".asyncinfer").mkdir()
    local = {"api_url": "http://127.0.0.1:9/", "api_key": "localkey"}
    (tmp_path / ".asyncinfer" / "local.json").write_text(json.dumps(local))
    cfg = resolve_config()
    assert (cfg.base_url, cfg.api_key) == ("http://127.0.0.1:9", "localkey")
    monkeypatch.setenv("ASYNCINFER_URL", "https://api.example.com/prod")
    with pytest.raises(ConfigurationError):  # local.json's key belongs to another URL
        resolve_config()
    monkeypatch.setenv("ASYNCINFER_API_KEY", "envkey")
    cfg = resolve_config()
    assert (cfg.base_url, cfg.api_key) == ("https://api.example.com/prod", "envkey")
    cfg = resolve_config("http://h:1", "argkey")
    assert (cfg.base_url, cfg.api_key) == ("http://h:1", "argkey")


# ------------------------------------------------------------------------- batch files
def test_batch_file_checks_and_stable_keys(tmp_path: Path) -> None:
    f = tmp_path / "b.jsonl"
    f.write_text(
        '{"custom_id": "a", "model": "echo", "input": {}}\n\n'
        '{"custom_id": "b", "model": "echo", "input": {"x": 1}, "priority": "low"}\n'
    )
    lines = read_batch(f)
    assert [(x.custom_id, x.line_no) for x in lines] == [("a", 1), ("b", 3)]
    assert lines[1].body == {"model": "echo", "input": {"x": 1}, "priority": "low"}
    assert [x.idempotency_key for x in read_batch(f)] == [x.idempotency_key for x in lines]
    assert lines[0].idempotency_key != lines[1].idempotency_key
    assert read_batch(f, "other-id")[0].idempotency_key != lines[0].idempotency_key
    for bad in (
        '{"custom_id": "a", "model": "echo"}\n{"custom_id": "a", "model": "echo"}\n',
        '{"model": "echo"}\n',
        '{"custom_id": "a"}\n',
        "[1]\n",
        "{nope\n",
    ):
        f.write_text(bad)
        with pytest.raises(BatchFileError):
            read_batch(f)


# ------------------------------------------------------------------------- webhooks
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
EVENT = json.dumps({"type": "job.succeeded", "timestamp": JOB["completed_at"], "data": JOB})


def test_verify_webhook_valid_tampered_old_and_rotated() -> None:
    now = int(time.time())
    headers = sign_webhook(SECRET, "msg_1", now, EVENT)
    event = verify_webhook(SECRET, headers, EVENT.encode())
    assert event.type == "job.succeeded" and event.data.id == "job_01TEST"
    # headers in any case
    upper = {k.upper(): v for k, v in headers.items()}
    assert verify_webhook(SECRET, upper, EVENT).data.status == "succeeded"
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, headers, EVENT.replace("succeeded", "failed"))
    with pytest.raises(WebhookVerificationError):
        verify_webhook("whsec_" + "A" * 32, headers, EVENT)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, {"webhook-id": "msg_1"}, EVENT)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, {**headers, "webhook-signature": "v1"}, EVENT)
    old = sign_webhook(SECRET, "msg_1", now - 3600, EVENT)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, old, EVENT)
    assert verify_webhook(SECRET, old, EVENT, check_timestamp=False).data.id == "job_01TEST"
    rotated = WebhookSecret(secret="whsec_" + "B" * 32, previous_secret=SECRET)
    assert verify_webhook(rotated, headers, EVENT).type == "job.succeeded"


def test_cli_verify_webhook_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    headers = sign_webhook(SECRET, "msg_9", int(time.time()), EVENT)
    body = tmp_path / "body.json"
    body.write_text(EVENT)
    hfile = tmp_path / "headers.json"
    hfile.write_text(json.dumps(headers))
    base = ["verify-webhook", "--secret", SECRET, "--body", str(body)]
    assert main([*base, "--headers", str(hfile)]) == 0
    assert "valid: job.succeeded job_01TEST" in capsys.readouterr().out
    hargs = [a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]
    assert main([*base, *hargs, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "valid": True,
        "type": "job.succeeded",
        "job_id": "job_01TEST",
    }
    # a raw HTTP request file
    raw = tmp_path / "req.http"
    head = "POST /hook HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw.write_bytes(head.encode() + b"\r\n" + EVENT.encode())
    assert main(["verify-webhook", str(raw), "--secret", SECRET]) == 0
    body.write_text(EVENT.replace("echo", "ohce"))
    assert main([*base, "--headers", str(hfile)]) == 1
    assert "invalid" in capsys.readouterr().err
    assert main(["verify-webhook", "--secret", SECRET]) == 2  # no body


def test_cli_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASYNCINFER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ASYNCINFER_API_KEY", "k")
    assert main(["submit", "echo"]) == 2  # neither --input nor --input-url
    assert main(["submit", "echo", "--input", "{nope"]) == 2
    assert main(["submit", "echo", "--input", "@missing.json"]) == 2
    assert main(["submit", "echo", "--input", "{}", "--metadata", "novalue"]) == 2
    (tmp_path / "b.jsonl").write_text('{"model": "echo"}\n')
    assert main(["batch", "b.jsonl", "-o", "out.jsonl"]) == 2
    with pytest.raises(SystemExit) as ei:
        main(["get"])
    assert ei.value.code == 2
    monkeypatch.delenv("ASYNCINFER_URL")
    assert main(["models"]) == 2  # nothing configured
    capsys.readouterr()
    monkeypatch.setenv("ASYNCINFER_URL", "http://127.0.0.1:9")
    # unreachable API: the command failed
    assert main(["get", "job_x", "--http-timeout", "1"]) == 3
    assert "ConnectError" in capsys.readouterr().err
