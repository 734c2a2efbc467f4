"""Webhooks: signatures (checked by the ``standardwebhooks`` library), secrets and rotation, the
SSRF rules at send time, and the dispatcher's bookkeeping (moto in-process, no network)."""

from __future__ import annotations

import json
import random
import socket
import time
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from standardwebhooks import Webhook, WebhookVerificationError

from asyncinfer.core.errors import ConfigError
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.webhook_dispatcher import (
    WebhookDispatcher,
    WebhookRetry,
    backoff_delay,
    make_handler,
    parse_event,
)
from asyncinfer.jobs.events import event_for
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.webhooks import verify
from asyncinfer.webhooks.secrets import SecretStore, encryption_context
from asyncinfer.webhooks.sender import MAX_RESPONSE_BYTES, WebhookSender
from asyncinfer.webhooks.signing import event_id, new_secret, sign_headers
from tests.conftest import ApiCaller

BODIES = [
    {"type": "job.succeeded", "data": {"text": "Paris 🇫🇷 — ça va? 🎉", "emoji": "😀"}},
    {"type": "job.succeeded", "data": {"floats": [0.1, 1e-7, -3.25, 1.7976931348623157e308]}},
    {"a": {"b": {"c": {"d": [1, {"e": None, "f": True}], "g": "h"}}}, "z": 0.5},
]


# ---------------------------------------------------------------------------- signing
@pytest.mark.parametrize("payload", BODIES)
def test_signature_verifies_with_standardwebhooks(payload: dict[str, Any]) -> None:
    secret = new_secret()
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    headers = sign_headers(body, "msg_1", [secret])
    assert headers["webhook-id"] == "msg_1"
    assert headers["webhook-signature"].startswith("v1,")
    # The receiver gets UTF-8 bytes.
    assert Webhook(secret).verify(body.encode("utf-8"), headers) == payload
    assert verify(body.encode("utf-8"), headers, secret) == payload
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace("1", "2").encode() + b" ", headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body.encode(), headers)


def test_two_secrets_during_rotation_each_verify() -> None:
    new, old = new_secret(), new_secret()
    body = json.dumps(BODIES[0], ensure_ascii=False)
    headers = sign_headers(body, "msg_2", [new, old])
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert Webhook(new).verify(body, headers) == BODIES[0]
    assert Webhook(old).verify(body, headers) == BODIES[0]
    assert verify(body, headers, [new_secret(), old]) == BODIES[0]


def test_secret_format() -> None:
    s = new_secret()
    assert s.startswith("whsec_") and s != new_secret()
    Webhook(s)  # the library accepts it


def test_event_id_is_stable_per_event() -> None:
    assert event_id("job_1", "job.succeeded", 1) == event_id("job_1", "job.succeeded", 1)
    assert event_id("job_1", "job.started", 1) != event_id("job_1", "job.started", 2)
    assert event_id("job_1", "job.succeeded", 1).startswith("msg_")


def test_backoff_grows_with_jitter_within_bounds() -> None:
    rng = random.Random(7)
    for attempt in range(1, 30):
        nominal = min(3600, 5 * 2 ** (attempt - 1))
        d = backoff_delay(attempt, 5, 3600, rng)
        assert max(1, nominal / 2) <= d <= max(1, nominal) + 1
    assert backoff_delay(50, 5, 10**6, rng) <= 43200


def test_parse_event_unwraps_sns_envelope_and_rejects_junk() -> None:
    ev = {"type": "job.succeeded", "timestamp": "t", "data": {"id": "job_1"}}
    assert parse_event(json.dumps(ev)) == ev
    env = {"Type": "Notification", "Message": json.dumps(ev)}
    assert parse_event(json.dumps(env)) == ev
    for junk in ("nope", "[]", '{"type": 1}', '{"type": "x", "data": {}}'):
        assert parse_event(junk) is None


# ---------------------------------------------------------------------------- sending (SSRF)
REFUSED_ADDRESSES = [
    "127.0.0.1",
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "224.0.0.1",
    "ff02::1",
    "0.0.0.0",
    "::",
    "::1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
]


def _fake_dns(addr: str) -> Any:
    def fake(host: str, port: Any, *a: Any, **k: Any) -> list[Any]:
        if ":" in addr:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (addr, port, 0, 0))]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, port))]

    return fake


class Recorder:
    """An httpx transport that records requests and answers from a script."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers) or [httpx.Response(200, text="ok")]
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


@pytest.mark.parametrize("addr", REFUSED_ADDRESSES)
def test_name_resolving_to_forbidden_address_is_refused_at_send(
    addr: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", _fake_dns(addr))
    rec = Recorder()
    result = WebhookSender(transport=rec.transport).send("https://hooks.example.com/h", b"{}", {})
    assert result.outcome == "refused", result
    assert rec.requests == []


@pytest.mark.parametrize(
    "url",
    [
        "https://2130706433/h",
        "https://0x7f000001/h",
        "https://0177.0.0.1/h",
        "https://127.1/h",
        "https://[::ffff:169.254.169.254]/h",
        "https://169.254.169.254/latest/meta-data",
        "http://93.184.216.34/h",  # http outside the local stack
        "https://user:pw@93.184.216.34/h",
    ],
)
def test_forbidden_urls_are_refused_at_send(url: str) -> None:
    rec = Recorder()
    assert WebhookSender(transport=rec.transport).send(url, b"{}", {}).outcome == "refused"
    assert rec.requests == []


def test_one_forbidden_address_among_several_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(host: str, port: Any, *a: Any, **k: Any) -> list[Any]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    rec = Recorder()
    sender = WebhookSender(transport=rec.transport)
    assert sender.send("https://hooks.example.com/h", b"{}", {}).outcome == "refused"


def test_connects_to_the_checked_address_with_original_host_and_sni(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def fake(host: str, port: Any, *a: Any, **k: Any) -> list[Any]:
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    rec = Recorder()
    result = WebhookSender(transport=rec.transport).send(
        "https://Hooks.Example.com:8443/in?x=1", b'{"a":1}', {"webhook-id": "msg_1"}
    )
    assert result.outcome == "delivered" and result.address == "93.184.216.34"
    assert calls == ["hooks.example.com"]  # resolved once
    (req,) = rec.requests
    assert req.url.host == "93.184.216.34" and req.url.port == 8443
    assert req.url.path == "/in" and req.url.query == b"x=1"
    assert req.headers["host"] == "hooks.example.com:8443"
    assert req.extensions["sni_hostname"] == "hooks.example.com"
    assert req.headers["webhook-id"] == "msg_1"
    assert req.content == b'{"a":1}'


def test_ipv6_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", _fake_dns("2606:4700::1111"))
    rec = Recorder()
    assert WebhookSender(transport=rec.transport).send("https://h.example/", b"{}", {}).outcome == (
        "delivered"
    )
    assert rec.requests[0].url.host == "2606:4700::1111"
    assert rec.requests[0].headers["host"] == "h.example"


def test_local_mode_allows_http_and_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    local = WebhookSender(local_mode=True, transport=rec.transport)
    assert local.send("http://127.0.0.1:9/h", b"{}", {}).outcome == "delivered"
    assert local.send("http://10.0.0.1/h", b"{}", {}).outcome == "refused"
    monkeypatch.setattr(socket, "getaddrinfo", _fake_dns("169.254.169.254"))
    assert local.send("http://meta.example/h", b"{}", {}).outcome == "refused"


def test_redirects_are_not_followed_and_count_as_failures() -> None:
    rec = Recorder(httpx.Response(302, headers={"Location": "https://93.184.216.35/other"}))
    result = WebhookSender(transport=rec.transport).send("https://93.184.216.34/h", b"{}", {})
    assert result.outcome == "retry" and result.http_status == 302
    assert len(rec.requests) == 1


def test_outcomes_and_response_kept_to_1kb() -> None:
    big = "x" * 5000
    for status, outcome in [(200, "delivered"), (204, "delivered"), (410, "gone"), (500, "retry")]:
        rec = Recorder(httpx.Response(status, text=big))
        r = WebhookSender(transport=rec.transport).send("https://93.184.216.34/h", b"{}", {})
        assert (r.outcome, r.http_status) == (outcome, status)
        assert len(r.response.encode()) <= MAX_RESPONSE_BYTES


def test_timeouts_and_connection_errors_are_retried() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    for fn, text in [(slow, "no answer within 10 s"), (down, "ConnectError")]:
        r = WebhookSender(transport=httpx.MockTransport(fn)).send("https://93.184.216.34/", b"", {})
        assert r.outcome == "retry" and r.http_status is None
        assert text in (r.error or "")


def test_unresolvable_name_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*a: Any, **k: Any) -> list[Any]:
        raise socket.gaierror("no such name")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    r = WebhookSender().send("https://nowhere.example/h", b"{}", {})
    assert r.outcome == "retry" and "resolution" in (r.error or "")


# ---------------------------------------------------------------------------- secrets and API
def test_secret_endpoint_is_per_tenant_and_stable(api: ApiCaller) -> None:
    status, body, _ = api("GET", "/v1/webhooks/secret")
    assert status == 200, body
    assert body["secret"].startswith("whsec_") and body["previous_secret"] is None
    assert api("GET", "/v1/webhooks/secret")[1]["secret"] == body["secret"]
    other = api("GET", "/v1/webhooks/secret", key_id="tenant-b")[1]
    assert other["secret"] != body["secret"]
    # The secret items stay out of the tenant's job list.
    assert api("GET", "/v1/jobs")[1]["jobs"] == []


def test_rotation_keeps_two_secrets_valid(api: ApiCaller, settings: Settings) -> None:
    old = api("GET", "/v1/webhooks/secret")[1]["secret"]
    status, rotated, _ = api("POST", "/v1/webhooks/secret/rotate")
    assert status == 200, rotated
    assert rotated["secret"] != old and rotated["previous_secret"] == old
    assert rotated["previous_expires_at"]
    assert api("GET", "/v1/webhooks/secret")[1] == rotated
    assert SecretStore(settings).signing_secrets("tenant-a") == [rotated["secret"], old]
    again = api("POST", "/v1/webhooks/secret/rotate")[1]
    assert again["previous_secret"] == rotated["secret"]  # the oldest one is no longer valid


def test_secret_route_is_in_openapi(api: ApiCaller) -> None:
    doc = api("GET", "/v1/openapi.json")[1]
    assert "/v1/webhooks/secret" in doc["paths"]


# ---------------------------------------------------------------------------- dispatcher
def _job_with_webhook(settings: Settings, events: list[str] | None = None) -> dict[str, Any]:
    hook: dict[str, Any] = {"url": "https://93.184.216.34/hook"}
    if events is not None:
        hook["events"] = events
    req = JobRequest(model="echo", input={"text": "héllo 🎉", "x": 0.25}, webhook=hook)
    job, _ = JobService(settings).submit("tenant-a", req)
    store = JobStore(settings)
    store.transition(job["id"], from_status="queued", to_status="running", increment_attempts=True)
    rec = store.transition(
        job["id"],
        from_status="running",
        to_status="succeeded",
        set_fields={"output": json.dumps({"ok": True}), "completed_at": "2026-01-01T00:00:00.000Z"},
    )
    return rec


def test_dispatcher_bookkeeping(settings: Settings) -> None:
    rec = _job_with_webhook(settings)
    body = json.dumps(event_for(rec), ensure_ascii=False)
    recorder = Recorder(httpx.Response(500, text="boom"), httpx.Response(200, text="thanks"))
    d = WebhookDispatcher(settings, sender=WebhookSender(transport=recorder.transport))
    store = JobStore(settings)
    with pytest.raises(WebhookRetry):
        d.handle(body, receive_count=1)
    r = store.get(rec["job_id"])
    assert r is not None
    assert (r["webhook_status"], r["webhook_attempts"], r["webhook_last_http_status"]) == (
        "pending",
        1,
        500,
    )
    assert r["webhook_last_response"] == "boom"
    assert d.handle(body, receive_count=2) == "delivered"
    view = JobService(settings).get("tenant-a", rec["job_id"])["webhook"]
    assert view["status"] == "delivered" and view["attempts"] == 2
    assert view["last_http_status"] == 200
    # The same event again (an SNS duplicate) is not sent twice.
    assert d.handle(body, receive_count=1) == "skipped"
    assert len(recorder.requests) == 2
    a, b = recorder.requests
    assert a.headers["webhook-id"] == b.headers["webhook-id"] and a.content == b.content
    secret = SecretStore(settings).get("tenant-a").secret
    assert Webhook(secret).verify(b.content, dict(b.headers))["data"]["id"] == rec["job_id"]


def test_dispatcher_skips_events_not_subscribed(settings: Settings) -> None:
    rec = _job_with_webhook(settings, events=["job.failed"])
    recorder = Recorder()
    d = WebhookDispatcher(settings, sender=WebhookSender(transport=recorder.transport))
    assert d.handle(json.dumps(event_for(rec))) == "skipped"
    assert d.handle("not json") == "skipped"
    assert recorder.requests == []


def test_gone_stops_and_refused_fails(settings: Settings) -> None:
    rec = _job_with_webhook(settings)
    body = json.dumps(event_for(rec))
    recorder = Recorder(httpx.Response(410))
    d = WebhookDispatcher(settings, sender=WebhookSender(transport=recorder.transport))
    assert d.handle(body) == "gone"
    view = JobService(settings).get("tenant-a", rec["job_id"])["webhook"]
    assert (view["status"], view["attempts"], view["last_http_status"]) == ("failed", 1, 410)
    # Later events of the job are not sent to a receiver that said 410.
    assert d.handle(body.replace("job.succeeded", "job.started"), receive_count=1) == "skipped"
    assert len(recorder.requests) == 1


def test_retry_window_over_goes_to_dead_letter_queue(settings: Settings) -> None:
    rec = _job_with_webhook(settings)
    body = json.dumps(event_for(rec))
    d = WebhookDispatcher(
        settings, sender=WebhookSender(transport=Recorder(httpx.Response(503)).transport)
    )
    day_ago_ms = int((time.time() - 86401) * 1000)
    assert d.handle(body, receive_count=30, first_received_ms=day_ago_ms) == "dead_lettered"
    view = JobService(settings).get("tenant-a", rec["job_id"])["webhook"]
    assert (view["status"], view["last_http_status"]) == ("failed", 503)
    msgs = d.sqs.receive_message(
        QueueUrl=settings.webhook_dlq_url, MessageAttributeNames=["All"]
    ).get("Messages", [])
    assert len(msgs) == 1 and msgs[0]["Body"] == body
    assert msgs[0]["MessageAttributes"]["job_id"]["StringValue"] == rec["job_id"]


def test_lambda_handler_reports_partial_batch_failures(settings: Settings) -> None:
    ok = _job_with_webhook(settings)
    bad = _job_with_webhook(settings)
    bad_url = "https://93.184.216.99/hook"
    store = JobStore(settings)
    store.ddb.update_item(
        TableName=store.table,
        Key={"job_id": {"S": bad["job_id"]}},
        UpdateExpression="SET webhook = :w",
        ExpressionAttributeValues={":w": {"S": json.dumps({"url": bad_url})}},
    )

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500 if request.url.host == "93.184.216.99" else 200)

    d = WebhookDispatcher(settings, sender=WebhookSender(transport=httpx.MockTransport(answer)))
    handler = make_handler(lambda: d)

    def record(mid: str, rec: dict[str, Any]) -> dict[str, Any]:
        return {
            "messageId": mid,
            "receiptHandle": "rh-" + mid,
            "body": json.dumps(event_for(rec)),
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "0"},
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:asyncinfer-webhooks",
        }

    # SentTimestamp 0 would be long past the window: use a fresh one.
    now_ms = str(int(time.time() * 1000))
    event = {"Records": [record("m1", ok), record("m2", bad)]}
    for r in event["Records"]:
        r["attributes"]["SentTimestamp"] = now_ms
    result = handler(event, None)
    assert result == {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    # Every record failing is an ordinary partial response, not an invocation error.
    event2 = {"Records": [record("m3", bad)]}
    event2["Records"][0]["attributes"]["SentTimestamp"] = now_ms
    assert handler(event2, None) == {"batchItemFailures": [{"itemIdentifier": "m3"}]}


# ---------------------------------------------------------------------------- secrets encrypted
def test_secrets_are_stored_only_as_kms_ciphertexts_of_their_tenant(
    api: ApiCaller, settings: Settings
) -> None:
    first = api("GET", "/v1/webhooks/secret")[1]["secret"]
    rotated = api("POST", "/v1/webhooks/secret/rotate")[1]["secret"]
    store = JobStore(settings)
    item = store.ddb.get_item(
        TableName=settings.table_name, Key={"job_id": {"S": "whsec#tenant-a"}}
    )["Item"]
    text = json.dumps(item, default=str)
    assert first not in text and rotated not in text  # nothing in the clear
    assert first[6:] not in text and rotated[6:] not in text
    assert set(item) >= {"secret_ct", "previous_secret_ct", "created_at"}
    kms = SecretStore(settings).kms
    blob = item["secret_ct"]["B"]
    ok = kms.decrypt(CiphertextBlob=blob, EncryptionContext=encryption_context("tenant-a"))
    assert ok["Plaintext"].decode() == rotated
    # Without the context, or under another tenant's, the ciphertext does not decrypt.
    for ctx in ({}, encryption_context("tenant-b")):
        with pytest.raises(ClientError, match="InvalidCiphertext"):
            kms.decrypt(CiphertextBlob=blob, EncryptionContext=ctx)


def test_a_secret_stored_in_the_clear_never_signs(api: ApiCaller, settings: Settings) -> None:
    """Any writer of the job table could plant a known secret in the clear: it is replaced by a
    fresh encrypted one, never adopted (issue 27, item 6)."""
    store = JobStore(settings)
    planted, prev = new_secret(), new_secret()
    item = {
        "job_id": {"S": "whsec#tenant-a"},
        "secret": {"S": planted},
        "created_at": {"S": "2026-01-01T00:00:00.000Z"},
        "previous_secret": {"S": prev},
        "previous_expires_at": {"S": "2999-01-01T00:00:00.000Z"},
    }
    store.ddb.put_item(TableName=settings.table_name, Item=item)
    view = api("GET", "/v1/webhooks/secret")[1]
    assert view["secret"].startswith("whsec_") and view["secret"] not in (planted, prev)
    assert view["previous_secret"] is None
    got = store.ddb.get_item(TableName=settings.table_name, Key={"job_id": item["job_id"]})
    assert "secret" not in got["Item"] and "previous_secret" not in got["Item"]
    assert "secret_ct" in got["Item"]
    assert SecretStore(settings).signing_secrets("tenant-a") == [view["secret"]]


def test_secret_store_needs_its_key(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="ASYNCINFER_WEBHOOK_SECRETS_KEY"):
        SecretStore(settings.model_copy(update={"webhook_secrets_key": ""}))
