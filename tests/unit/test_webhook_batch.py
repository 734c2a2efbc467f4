"""The dispatcher's batches: the records of one SQS batch are delivered side by side, so a
receiver that trickles its answer delays only its own events, and the batch answers within the
Lambda's remaining time, listing what is unfinished for SQS to deliver again (moto in-process,
receivers on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from asyncinfer.core.settings import Settings
from asyncinfer.functions.webhook_dispatcher import WebhookDispatcher, make_handler
from asyncinfer.jobs.events import event_for
from asyncinfer.jobs.store import JobStore
from asyncinfer.webhooks.batch import BOOKKEEPING_SECONDS, batch_deadlines
from asyncinfer.webhooks.sender import WebhookSender
from tests.unit.test_webhook_deadline import TRICKLE_FOR, SlowReceiver, _read_request, _trickle
from tests.unit.test_webhooks import _job_with_webhook

#: Time allowed beyond a bound (two shared cores).
SLACK = 1.5


@dataclass
class FakeContext:
    """A Lambda context with ``remaining`` seconds left at creation."""

    remaining: float
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = time.monotonic()

    def get_remaining_time_in_millis(self) -> int:
        return int(max(0.0, self.remaining - (time.monotonic() - self.started)) * 1000)


class Receivers:
    """A trickling receiver and a prompt one that notes when each request arrived."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

        def slow(conn: socket.socket) -> None:
            _read_request(conn)
            _trickle(conn, b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 500, every=0.1)

        def fast(conn: socket.socket) -> None:
            _read_request(conn)
            with self.lock:
                self.arrivals.append(time.monotonic())
            conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

        self.slow = SlowReceiver(slow)
        self.fast = SlowReceiver(fast)

    def close(self) -> None:
        self.slow.close()
        self.fast.close()


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    r = Receivers()
    yield r
    r.close()


def _record(mid: str, rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "messageId": mid,
        "receiptHandle": "rh-" + mid,
        "body": json.dumps(event_for(rec)),
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": str(int(time.time() * 1000)),
        },
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:asyncinfer-webhooks",
    }


def _job_to(settings: Settings, url: str) -> dict[str, Any]:
    rec = _job_with_webhook(settings)
    store = JobStore(settings)
    store.ddb.update_item(
        TableName=store.table,
        Key={"job_id": {"S": rec["job_id"]}},
        UpdateExpression="SET webhook = :w",
        ExpressionAttributeValues={":w": {"S": json.dumps({"url": url})}},
    )
    return rec


def test_a_trickling_receiver_does_not_hold_back_the_other_events_of_its_batch(
    settings: Settings, receivers: Receivers
) -> None:
    timeout = 2.0
    slow = _job_to(settings, receivers.slow.url)
    fast = [_job_to(settings, receivers.fast.url) for _ in range(3)]
    d = WebhookDispatcher(settings, sender=WebhookSender(local_mode=True, timeout=timeout))
    handler = make_handler(lambda: d)
    # The slow one first: delivered one after another, the others would wait its 2 s.
    event = {"Records": [_record("slow", slow)] + [_record(f"f{i}", r) for i, r in enumerate(fast)]}
    t0 = time.monotonic()
    result = handler(event, FakeContext(remaining=30))
    took = time.monotonic() - t0
    assert result == {"batchItemFailures": [{"itemIdentifier": "slow"}]}
    assert len(receivers.arrivals) == 3
    assert max(receivers.arrivals) - t0 < timeout - 0.5, [a - t0 for a in receivers.arrivals]
    assert took < timeout + SLACK, took
    store = JobStore(settings)
    for r in fast:
        assert (store.get(r["job_id"]) or {})["webhook_status"] == "delivered"
    assert (store.get(slow["job_id"]) or {})["webhook_status"] == "pending"


def test_the_batch_answers_within_the_lambdas_remaining_time(
    settings: Settings, receivers: Receivers
) -> None:
    slow = _job_to(settings, receivers.slow.url)
    fast = _job_to(settings, receivers.fast.url)
    # A 10 s sender, but a Lambda with 4 s left: the attempt is cut to fit, and answered.
    d = WebhookDispatcher(settings, sender=WebhookSender(local_mode=True, timeout=10.0))
    t0 = time.monotonic()
    result = make_handler(lambda: d)(
        {"Records": [_record("slow", slow), _record("fast", fast)]}, FakeContext(remaining=4)
    )
    took = time.monotonic() - t0
    assert result == {"batchItemFailures": [{"itemIdentifier": "slow"}]}
    assert took < 4 - 1 + SLACK and took < TRICKLE_FOR, took
    assert (JobStore(settings).get(fast["job_id"]) or {})["webhook_status"] == "delivered"


class _Stuck:
    """A dispatcher whose record ``stuck`` takes longer than any deadline (a hung call)."""

    def __init__(self) -> None:
        self.sender = WebhookSender(timeout=10.0)
        self.done: list[str] = []
        self.release = threading.Event()

    def handle_record(self, record: Any, deadline: float | None = None) -> str:
        if record.message_id == "stuck":
            self.release.wait(10)
        self.done.append(record.message_id)
        return "delivered"


def test_records_unfinished_at_the_batch_deadline_are_retried_not_lost() -> None:
    d = _Stuck()
    event = {"Records": [{"messageId": m, "body": "{}", "attributes": {}} for m in ("a", "stuck")]}
    t0 = time.monotonic()
    try:
        result = make_handler(lambda: d)(event, FakeContext(remaining=2.5))  # type: ignore[arg-type]
        took = time.monotonic() - t0
    finally:
        d.release.set()
    assert result == {"batchItemFailures": [{"itemIdentifier": "stuck"}]}
    assert took < 2.5 + SLACK, took
    assert "a" in d.done


def test_budgets() -> None:
    send, batch = batch_deadlines(None, 10.0, start=0.0)
    assert (send, batch) == (10.0, 10.0 + BOOKKEEPING_SECONDS)
    send, batch = batch_deadlines(60.0, 10.0, start=0.0)
    assert (send, batch) == (10.0, 10.0 + BOOKKEEPING_SECONDS)
    send, batch = batch_deadlines(7.0, 10.0, start=0.0)  # little time left: both shrink
    assert batch == 6.0 and send == 4.0
    send, batch = batch_deadlines(0.5, 10.0, start=0.0)
    assert batch == 0.0 and send <= 0.0


class _ScriptedSender(WebhookSender):
    """Answers from a script per host, without a network: ``timeout`` or a status."""

    def __init__(self, script: dict[str, str | int]) -> None:
        super().__init__(timeout=10.0)
        self.script = script
        self.sent: list[str] = []

    def send(self, url: str, body: bytes, headers: Any, *, deadline: float | None = None) -> Any:
        from asyncinfer.webhooks.sender import DeliveryResult

        host = url.split("/")[2]
        self.sent.append(host)
        answer = self.script[host]
        if answer == "timeout":
            return DeliveryResult("retry", error="no answer within 10 s", timed_out=True)
        return DeliveryResult("delivered", http_status=int(answer))


def test_a_host_that_timed_out_rests_so_it_cannot_fill_the_dispatcher(settings: Settings) -> None:
    from asyncinfer.functions.webhook_dispatcher import WebhookRetry
    from asyncinfer.webhooks.slow_hosts import SlowHosts

    slow = [_job_to(settings, "https://93.184.216.34/hook") for _ in range(3)]
    other = _job_to(settings, "https://93.184.216.35/hook")
    sender = _ScriptedSender({"93.184.216.34": "timeout", "93.184.216.35": 204})
    rest = SlowHosts(cooldown=0.5)
    d = WebhookDispatcher(settings, sender=sender, slow_hosts=rest)
    for rec in slow:
        with pytest.raises(WebhookRetry):
            d.handle(json.dumps(event_for(rec)))
    assert sender.sent == ["93.184.216.34"]  # one attempt; the others were put back untried
    assert (JobStore(settings).get(slow[1]["job_id"]) or {}).get("webhook_attempts") is None
    assert d.handle(json.dumps(event_for(other))) == "delivered"  # other hosts are not held
    time.sleep(0.6)  # the rest is over: the next event probes the host again
    sender.script["93.184.216.34"] = 200
    assert d.handle(json.dumps(event_for(slow[1]))) == "delivered"
    assert d.handle(json.dumps(event_for(slow[2]))) == "delivered"
    assert sender.sent == ["93.184.216.34", "93.184.216.35", "93.184.216.34", "93.184.216.34"]


def test_one_tenants_slow_endpoint_does_not_rest_another_tenants(settings: Settings) -> None:
    from asyncinfer.functions.webhook_dispatcher import WebhookRetry
    from asyncinfer.webhooks.slow_hosts import SlowHosts

    a = _job_to(settings, "https://93.184.216.34/slow")
    b = _job_to(settings, "https://93.184.216.34/fine")
    store = JobStore(settings)
    store.ddb.update_item(
        TableName=store.table,
        Key={"job_id": {"S": b["job_id"]}},
        UpdateExpression="SET tenant = :t",
        ExpressionAttributeValues={":t": {"S": "tenant-b"}},
    )
    sender = _ScriptedSender({"93.184.216.34": "timeout"})
    d = WebhookDispatcher(settings, sender=sender, slow_hosts=SlowHosts())
    with pytest.raises(WebhookRetry):
        d.handle(json.dumps(event_for(a)))
    sender.script["93.184.216.34"] = 200
    assert d.handle(json.dumps(event_for(b))) == "delivered"  # tenant-b's not rested


def test_an_event_past_its_window_is_attempted_despite_the_rest(settings: Settings) -> None:
    from asyncinfer.webhooks.slow_hosts import SlowHosts

    rec = _job_to(settings, "https://93.184.216.34/hook")
    sender = _ScriptedSender({"93.184.216.34": "timeout"})
    rest = SlowHosts()
    rest.timed_out("tenant-a 93.184.216.34:443")
    d = WebhookDispatcher(settings, sender=sender, slow_hosts=rest)
    day_ago_ms = int((time.time() - 86401) * 1000)
    assert d.handle(json.dumps(event_for(rec)), first_received_ms=day_ago_ms) == "dead_lettered"
    assert sender.sent == ["93.184.216.34"]


def test_no_attempt_is_started_without_time_for_one() -> None:
    d = _Stuck()
    event = {"Records": [{"messageId": m, "body": "{}", "attributes": {}} for m in ("a", "b")]}
    result = make_handler(lambda: d)(event, FakeContext(remaining=0.5))  # type: ignore[arg-type]
    assert result == {"batchItemFailures": [{"itemIdentifier": "a"}, {"itemIdentifier": "b"}]}
    time.sleep(0.2)
    assert d.done == []  # nothing ran after the answer


def test_a_timeout_our_own_budget_caused_does_not_rest_the_host(settings: Settings) -> None:
    from asyncinfer.functions.webhook_dispatcher import WebhookRetry
    from asyncinfer.webhooks.slow_hosts import SlowHosts

    first, second = (_job_to(settings, "https://93.184.216.34/hook") for _ in range(2))
    sender = _ScriptedSender({"93.184.216.34": "timeout"})
    d = WebhookDispatcher(settings, sender=sender, slow_hosts=SlowHosts())
    with pytest.raises(WebhookRetry):  # the Lambda had 1 s for it, not the receiver's 10 s
        d.handle(json.dumps(event_for(first)), deadline=time.monotonic() + 1)
    sender.script["93.184.216.34"] = 200
    assert d.handle(json.dumps(event_for(second))) == "delivered"
