"""A batch's end event (spec openai.md, "Events"): on the topic with api.md's attributes, and
for a batch with the ``webhook`` extension a Standard Webhooks delivery in OpenAI's event shape
that the ``openai`` SDK's ``webhooks.unwrap`` accepts."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.webhook_dispatcher import WebhookDispatcher, make_handler
from asyncinfer.jobs.service import JobService
from asyncinfer.local.event_source import pump_once
from asyncinfer.local.resources import Resources
from asyncinfer.webhooks.secrets import SecretStore
from asyncinfer.webhooks.sender import DeliveryResult
from tests.conftest import ApiCaller, apply_env
from tests.unit.batch_helpers import (
    chat_line,
    echo_ok,
    finish,
    line_jobs,
    run_batch_queue,
    run_events,
    upload,
)

TENANT = "tenant-a"


class StubSender:
    """Records what would be sent; answers 200."""

    timeout = 10.0

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    def send(self, url: str, body: bytes, headers: Any, *, deadline: Any = None) -> Any:
        self.sent.append((url, body, dict(headers)))
        return DeliveryResult(outcome="delivered", http_status=200)


@pytest.fixture
def local(resources: Resources, clean_env: pytest.MonkeyPatch) -> Settings:
    """The local stack's rules (http and loopback webhook URLs allowed)."""
    apply_env(clean_env, {**resources.env(), "ASYNCINFER_LOCAL": "1"})
    return Settings.from_env()


def test_batch_completed_event_and_webhook_unwrapped_by_the_sdk(local: Settings) -> None:
    settings = local
    api = ApiCaller(TENANT)
    sqs = clients.client("sqs", settings)
    log_queue = sqs.create_queue(QueueName="batch-events-test-log")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=log_queue, AttributeNames=["QueueArn"])
    clients.client("sns", settings).subscribe(
        TopicArn=settings.topic_arn,
        Protocol="sqs",
        Endpoint=arn["Attributes"]["QueueArn"],
        Attributes={"RawMessageDelivery": "true"},
    )
    fid = upload(settings, TENANT, [chat_line("a"), chat_line("b")])
    status, out, _ = api(
        "POST",
        "/openai/v1/batches",
        {
            "input_file_id": fid,
            "endpoint": "/v1/chat/completions",
            "webhook": {"url": "http://127.0.0.1:9/hook"},
        },
    )
    assert status == 200, out
    run_batch_queue(settings)
    for rec in line_jobs(settings, TENANT):
        finish(settings, rec, echo_ok)
    run_events(settings)

    # On the topic: the end event with api.md's attributes.
    ends = []
    while True:
        msgs = sqs.receive_message(
            QueueUrl=log_queue, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        ).get("Messages", [])
        if not msgs:
            break
        for m in msgs:
            sqs.delete_message(QueueUrl=log_queue, ReceiptHandle=m["ReceiptHandle"])
        ends += [m for m in msgs if json.loads(m["Body"]).get("type", "").startswith("batch.")]
    assert len(ends) == 1
    event = json.loads(ends[0]["Body"])
    assert event["type"] == "batch.completed" and event["data"] == {"id": out["id"]}
    assert event["object"] == "event" and event["id"].startswith("evt_")
    attrs = {k: v["StringValue"] for k, v in ends[0]["MessageAttributes"].items()}
    assert attrs == {
        "event_type": "batch.completed",
        "model": "echo",
        "tenant": TENANT,
        "status": "completed",
        "has_webhook": "true",  # our extension: the webhook queue's filter (core.topology)
    }

    # The webhook: the dispatcher sends the event, signed, and the SDK unwraps it.
    sender = StubSender()
    dispatcher = WebhookDispatcher(settings, sender=sender)  # type: ignore[arg-type]
    handler = make_handler(lambda: dispatcher)
    while pump_once(sqs, settings.webhook_queue_url, lambda ev: handler(ev, None), wait=0):
        pass
    batch_sends = [s for s in sender.sent if b"batch." in s[1]]
    assert len(batch_sends) == 1
    url, body, headers = batch_sends[0]
    assert url == "http://127.0.0.1:9/hook"
    secret = SecretStore(settings).signing_secrets(TENANT)[0]
    client = openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/openai/v1")
    unwrapped = client.webhooks.unwrap(body.decode(), headers, secret=secret)
    assert unwrapped.type == "batch.completed"
    assert unwrapped.data.id == out["id"]
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body.decode(), headers, secret="whsec_" + "A" * 32)


def test_the_webhook_queue_takes_only_events_of_jobs_with_a_webhook(local: Settings) -> None:
    """Issue 14, item 5 (breaker): a job without a webhook (e.g. a big batch's line) puts nothing
    in the webhook queue, so its events never queue ahead of another tenant's deliveries."""
    sqs = clients.client("sqs", local)
    service = JobService(local.api)
    service.submit(TENANT, JobRequest(model="echo", input={"x": 1}))
    hooked, _ = service.submit(
        TENANT,
        JobRequest(model="echo", input={"x": 2}, webhook={"url": "http://127.0.0.1:9/hook"}),
    )
    bodies = []
    while msgs := sqs.receive_message(QueueUrl=local.webhook_queue_url, MaxNumberOfMessages=10).get(
        "Messages", []
    ):
        bodies += [json.loads(m["Body"]) for m in msgs]
        for m in msgs:
            sqs.delete_message(QueueUrl=local.webhook_queue_url, ReceiptHandle=m["ReceiptHandle"])
    assert [(b["type"], b["data"]["id"]) for b in bodies] == [("job.queued", hooked["id"])]
