"""``JobRecord`` names every attribute that the writers of the job table write on a job's item,
with the type it is read back as (issue 14: "a typed job record ... used by every writer")."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import httpx
import pytest

from asyncinfer.core import lifecycle
from asyncinfer.core.settings import Settings
from asyncinfer.core.timeutil import iso, now
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.webhook_dispatcher import WebhookDispatcher, WebhookRetry
from asyncinfer.jobs import transitions
from asyncinfer.jobs.events import event_for
from asyncinfer.jobs.record import LEASE_FIELD, JobRecord, record_from_item
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.webhooks.sender import WebhookSender
from asyncinfer.worker.outcomes import Finish, decide

HINTS = typing.get_type_hints(JobRecord)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotation ``hint`` (the few shapes JobRecord uses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_conforms(value, h) for h in args)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()
        )
    if origin in (list, set):
        return isinstance(value, origin) and all(_conforms(x, args[0]) for x in value)
    return isinstance(value, hint)


class Seen:
    """The attribute names seen on the job items, and the values read that do not fit."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.names: set[str] = set()
        self.misfits: list[tuple[str, Any]] = []

    def written(self, record: dict[str, Any]) -> None:
        self.names |= set(record)

    def item(self, job_id: str) -> JobRecord:
        """Note the job's item as stored now; returns it as a record."""
        item = self.store.ddb.get_item(
            TableName=self.store.table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
        )["Item"]
        self.names |= set(item)
        record = record_from_item(item)
        self.misfits += [
            (k, v) for k, v in record.items() if not _conforms(v, HINTS.get(k, object))
        ]
        return record


def test_every_attribute_a_writer_writes_is_a_field_of_job_record(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(settings)
    seen = Seen(store)
    create = JobStore.create

    def spy(self: JobStore, record: JobRecord) -> None:  # the submit's put, before confirming
        seen.written(dict(record))
        create(self, record)

    monkeypatch.setattr(JobStore, "create", spy)
    service = JobService(settings)
    req = JobRequest(
        model="echo",
        input={"text": "hi"},
        metadata={"ref": "abc"},
        webhook={"url": "https://93.184.216.34/hook"},
    )
    job_id = service.submit("tenant-a", req)[0]["id"]
    seen.item(job_id)

    # The start of an attempt (the SageMaker bridge's, which records the input), the bridge's
    # invocation, a progress write, a cancel request, the worker's terminal write.
    store.apply(
        transitions.start(
            job_id,
            attempts=0,
            started_at=iso(now()),
            message_id="m-1",
            set_fields={"input_ref": "s3://bucket/inputs/tenant-a/x.json"},
        )
    )
    seen.item(job_id)
    running = {"inference_id": f"{job_id}.a1", LEASE_FIELD: store.lease_until(120)}
    assert store.update_fields(job_id, status="running", attempts=1, set_fields=running)
    progress = {"progress_tokens": 2, "output": '{"text": "h"}'}
    assert not store.update_fields_many([(job_id, 1, progress)], status="running")
    service.cancel("tenant-a", job_id)
    record = seen.item(job_id)
    outcome = decide(
        {"text": "hi", "usage": {"completion_tokens": 3}},
        record,
        completed_at=iso(now()),
        retry_delay_seconds=1.0,
        compute_seconds=0.25,
        price_per_hour=2.0,
    )
    assert isinstance(outcome, Finish)
    record = store.apply(outcome.transition)
    seen.item(job_id)

    # The webhook dispatcher's bookkeeping: a connection error, a delivery, a 410.
    answers: list[Any] = [httpx.ConnectError("refused"), httpx.Response(200, text="ok")]
    answers.append(httpx.Response(410))

    def answer(request: httpx.Request) -> httpx.Response:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return typing.cast(httpx.Response, got)

    sender = WebhookSender(transport=httpx.MockTransport(answer))
    dispatcher = WebhookDispatcher(settings, sender=sender)
    event = event_for(record)
    with pytest.raises(WebhookRetry):
        dispatcher.handle(json.dumps(event), receive_count=1)
    seen.item(job_id)
    assert dispatcher.handle(json.dumps(event), receive_count=2) == "delivered"
    seen.item(job_id)
    assert dispatcher.handle(json.dumps({**event, "type": "job.failed"})) == "gone"
    seen.item(job_id)

    # A job that ends with an error before it starts.
    other = service.submit("tenant-a", JobRequest(model="echo", input={"text": "x"}))[0]["id"]
    service.cancel("tenant-a", other)
    assert seen.item(other)["status"] == lifecycle.CANCELLED

    assert seen.names - set(HINTS) == set()
    assert seen.misfits == []
    # The paths above reached the attributes of each writer (the test would prove nothing else).
    assert {
        "submitting_until",
        "outbox_mark",
        "lease_expires_epoch",
        "inference_id",
        "cancel_requested",
        "compute_seconds",
        "cost_usd",
        "webhook_last_error",
        "webhook_delivered",
        "webhook_gone",
        "error",
    } <= seen.names
