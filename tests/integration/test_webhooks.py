"""Webhook delivery through the real path: the job service publishes events on the topic (moto
server), the webhook queue subscribed to it feeds the dispatcher handler (as the Lambda event
source mapping would), and a receiver on 127.0.0.1 answers. Short backoff settings."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks import Webhook

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.webhook_dispatcher import WebhookDispatcher, make_handler
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.event_source import pump_once
from asyncinfer.local.stack import free_port
from asyncinfer.webhooks.secrets import SecretStore
from asyncinfer.webhooks.sender import WebhookSender
from tests.integration.conftest import Env


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """An HTTP receiver on 127.0.0.1 answering statuses from a script (the last one repeats)."""

    answers: list[int]
    port: int = 0
    hits: list[Hit] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        rcv = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                rcv.hits.append(
                    Hit(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                status = rcv.answers.pop(0) if len(rcv.answers) > 1 else rcv.answers[0]
                self.send_response(status)
                if status in (301, 302, 307, 308):
                    self.send_header("Location", f"http://127.0.0.1:{rcv.port}/elsewhere")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
def hook_env(make_env: Callable[..., Env]) -> Iterator[tuple[Env, Callable[[], None]]]:
    """Resources in local mode with short webhook backoff, and a running dispatcher feed."""
    env = make_env(local_mode=True)
    env.settings = env.settings.model_copy(
        update={
            "webhook_queue_url": env.resources.webhook_queue,
            "webhook_dlq_url": env.resources.webhook_dlq,
            "webhook_retry_base_seconds": 1.0,
            "webhook_retry_max_delay_seconds": 2.0,
        }
    )
    stop = threading.Event()
    settings = env.settings

    def run() -> None:
        dispatcher = WebhookDispatcher(settings)
        handler = make_handler(lambda: dispatcher)
        sqs = clients.client("sqs", settings)
        while not stop.is_set():
            try:
                pump_once(sqs, settings.webhook_queue_url, lambda ev: handler(ev, None), wait=1)
            except Exception:  # keep feeding, as the stack's loop does
                time.sleep(0.2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield env, stop.set
    stop.set()
    t.join(timeout=10)


def finish_job(settings: Settings, url: str, events: list[str] | None = None) -> str:
    """Submit a job with a webhook through the job service, then run it to ``succeeded`` the
    way a worker does (conditional writes, one event per transition)."""
    hook: dict[str, Any] = {"url": url}
    if events is not None:
        hook["events"] = events
    req = JobRequest.model_validate(
        {
            "model": "echo",
            "input": {"msg": "héllo 🎉", "pi": 3.14159, "n": {"a": [1]}},
            "webhook": hook,
        }
    )
    job, _ = JobService(settings).submit("t1", req)
    store, events_pub = JobStore(settings), EventPublisher(settings)
    rec = store.transition(
        job["id"], from_status="queued", to_status="running", increment_attempts=True
    )
    events_pub.publish(rec)
    rec = store.transition(
        job["id"],
        from_status="running",
        to_status="succeeded",
        set_fields={
            "output": json.dumps({"echo": True}),
            "completed_at": "2026-01-01T00:00:01.000Z",
        },
    )
    events_pub.publish(rec)
    return str(job["id"])


def wait_until(cond: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def webhook_view(settings: Settings, job_id: str) -> dict[str, Any]:
    view: dict[str, Any] = JobService(settings).get("t1", job_id)["webhook"]
    return view


def test_500_500_200_delivered_after_3_attempts_same_id_and_body(
    hook_env: tuple[Env, Callable[[], None]],
) -> None:
    env, _ = hook_env
    rcv = Receiver([500, 500, 200]).start()
    try:
        job_id = finish_job(env.settings, rcv.url(), events=["job.succeeded"])
        wait_until(lambda: webhook_view(env.settings, job_id)["status"] == "delivered")
        time.sleep(2.5)  # nothing more arrives
    finally:
        rcv.stop()
    assert len(rcv.hits) == 3, [h.path for h in rcv.hits]
    assert len({h.headers["webhook-id"] for h in rcv.hits}) == 1
    assert len({h.body for h in rcv.hits}) == 1
    secret = SecretStore(env.settings).get("t1").secret
    for h in rcv.hits:
        event = Webhook(secret).verify(h.body, h.headers)
        assert event["type"] == "job.succeeded" and event["data"]["id"] == job_id
        assert event["data"]["output"] == {"echo": True}
        assert h.headers["content-type"] == "application/json"
    view = webhook_view(env.settings, job_id)
    assert (view["status"], view["attempts"], view["last_http_status"]) == ("delivered", 3, 200)


def test_pending_while_retrying(hook_env: tuple[Env, Callable[[], None]]) -> None:
    env, _ = hook_env
    rcv = Receiver([503]).start()
    try:
        job_id = finish_job(env.settings, rcv.url(), events=["job.succeeded"])
        wait_until(lambda: webhook_view(env.settings, job_id)["attempts"] >= 1)
        view = webhook_view(env.settings, job_id)
        assert (view["status"], view["last_http_status"]) == ("pending", 503)
    finally:
        rcv.stop()


def test_receiver_down_longer_than_first_backoffs_gets_it_later_once(
    hook_env: tuple[Env, Callable[[], None]],
) -> None:
    env, _ = hook_env
    port = free_port()  # nothing listens there yet: connection refused
    job_id = finish_job(env.settings, f"http://127.0.0.1:{port}/hook")
    wait_until(lambda: webhook_view(env.settings, job_id)["attempts"] >= 2, timeout=20)
    view = webhook_view(env.settings, job_id)
    assert view["status"] == "pending" and view["last_http_status"] is None
    rcv = Receiver([200], port=port).start()
    try:
        wait_until(lambda: webhook_view(env.settings, job_id)["status"] == "delivered")
        time.sleep(3)
    finally:
        rcv.stop()
    assert len(rcv.hits) == 1  # the default events are the terminal ones: job.succeeded only
    assert json.loads(rcv.hits[0].body)["type"] == "job.succeeded"
    assert webhook_view(env.settings, job_id)["attempts"] >= 3


def test_410_stops(hook_env: tuple[Env, Callable[[], None]]) -> None:
    env, _ = hook_env
    rcv = Receiver([410]).start()
    try:
        job_id = finish_job(env.settings, rcv.url())
        wait_until(lambda: webhook_view(env.settings, job_id)["status"] == "failed")
        time.sleep(3)
    finally:
        rcv.stop()
    assert len(rcv.hits) == 1
    view = webhook_view(env.settings, job_id)
    assert (view["status"], view["attempts"], view["last_http_status"]) == ("failed", 1, 410)
    assert env.queue_counts(env.resources.webhook_queue) == (0, 0)


def test_redirect_not_followed_then_dead_lettered_after_window(
    make_env: Callable[..., Env],
) -> None:
    env = make_env(local_mode=True)
    settings = env.settings.model_copy(
        update={
            "webhook_queue_url": env.resources.webhook_queue,
            "webhook_dlq_url": env.resources.webhook_dlq,
            "webhook_retry_base_seconds": 1.0,
            "webhook_retry_max_delay_seconds": 1.0,
            "webhook_retry_window_seconds": 2.5,
        }
    )
    rcv = Receiver([302]).start()
    try:
        job_id = finish_job(settings, rcv.url())
        dispatcher = WebhookDispatcher(settings)
        handler = make_handler(lambda: dispatcher)
        sqs = clients.client("sqs", settings)
        deadline = time.monotonic() + 30
        while webhook_view(settings, job_id)["status"] != "failed":
            assert time.monotonic() < deadline
            pump_once(sqs, settings.webhook_queue_url, lambda ev: handler(ev, None), wait=1)
    finally:
        rcv.stop()
    assert rcv.hits and all(h.path == "/hook" for h in rcv.hits)  # /elsewhere never reached
    view = webhook_view(settings, job_id)
    assert view["status"] == "failed" and view["last_http_status"] == 302
    assert view["attempts"] == len(rcv.hits) >= 2
    dead = sqs.receive_message(
        QueueUrl=settings.webhook_dlq_url, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert len(dead) == 1 and json.loads(dead[0]["Body"])["data"]["id"] == job_id
    assert dead[0]["MessageAttributes"]["event_type"]["StringValue"] == "job.succeeded"
    assert env.queue_counts(settings.webhook_queue_url) == (0, 0)


def test_name_resolving_to_private_address_at_send_is_refused(
    hook_env: tuple[Env, Callable[[], None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name did not resolve at submit; at send it resolves to 10.0.0.7."""
    env, _ = hook_env
    real = socket.getaddrinfo
    answer: dict[str, Any] = {"addr": None}

    def fake(host: Any, port: Any, *a: Any, **k: Any) -> Any:
        if host == "hooks.rebind.test":
            if answer["addr"] is None:
                raise socket.gaierror("not yet")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer["addr"], port))]
        return real(host, port, *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    rcv = Receiver([200]).start()
    try:
        answer["addr"] = None
        job_id = finish_job(env.settings, rcv.url(host="hooks.rebind.test"))  # accepted
        answer["addr"] = "10.0.0.7"
        wait_until(lambda: webhook_view(env.settings, job_id)["status"] == "failed")
    finally:
        rcv.stop()
    assert rcv.hits == []
    view = webhook_view(env.settings, job_id)
    assert view["attempts"] == 1 and view["last_http_status"] is None
    rec = env.job(job_id)
    assert "10.0.0.7" in rec["webhook_last_error"]


def test_connects_to_resolved_address_with_original_host_header(
    hook_env: tuple[Env, Callable[[], None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env, _ = hook_env
    real = socket.getaddrinfo
    looked_up: list[str] = []

    def fake(host: Any, port: Any, *a: Any, **k: Any) -> Any:
        if host == "hooks.local.test":
            looked_up.append(host)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    rcv = Receiver([200]).start()
    try:
        job_id = finish_job(env.settings, rcv.url(host="hooks.local.test"))
        wait_until(lambda: webhook_view(env.settings, job_id)["status"] == "delivered")
    finally:
        rcv.stop()
    assert rcv.hits[0].headers["host"] == f"hooks.local.test:{rcv.port}"


def test_a_trickling_receiver_does_not_delay_another_jobs_webhook(
    make_env: Callable[..., Env],
) -> None:
    """Two events in the webhook queue, the first to a receiver that trickles its status line a
    byte at a time: the second is delivered at once, and the first attempt ends at the deadline
    (one deadline for the whole attempt, records of a batch side by side)."""
    from tests.unit.test_webhook_deadline import SlowReceiver, _read_request, _trickle

    env = make_env(local_mode=True)
    settings = env.settings.model_copy(
        update={
            "webhook_queue_url": env.resources.webhook_queue,
            "webhook_dlq_url": env.resources.webhook_dlq,
        }
    )

    def slow(conn: socket.socket) -> None:
        _read_request(conn)
        _trickle(conn, b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 500, every=0.1)

    trickler = SlowReceiver(slow)
    rcv = Receiver([204]).start()
    timeout = 3.0
    try:
        slow_id = finish_job(settings, trickler.url)
        fast_id = finish_job(settings, rcv.url())
        dispatcher = WebhookDispatcher(
            settings, sender=WebhookSender(local_mode=True, timeout=timeout)
        )
        handler = make_handler(lambda: dispatcher)
        sqs = clients.client("sqs", settings)
        t0 = time.monotonic()
        fast_at: float | None = None
        while time.monotonic() - t0 < 20:
            pump_once(sqs, settings.webhook_queue_url, lambda ev: handler(ev, None), wait=1)
            if fast_at is None and rcv.hits:
                fast_at = time.monotonic() - t0
            if rcv.hits and webhook_view(settings, slow_id)["attempts"] >= 1:
                break
    finally:
        rcv.stop()
        trickler.close()
    assert fast_at is not None and len(rcv.hits) == 1
    assert webhook_view(settings, fast_id)["status"] == "delivered"
    slow_view = webhook_view(settings, slow_id)
    assert slow_view["status"] == "pending" and slow_view["last_http_status"] is None
    assert "no answer within" in env.job(slow_id)["webhook_last_error"]
    # Both were received in the first batch or two; the prompt one never waited for the slow.
    assert fast_at < timeout + 2, fast_at
