"""The events outbox (issue 14, behaviour 6): an event whose publish fails stays on its record and
the sweeper publishes it later; a published event leaves nothing behind. Also the DLQ handler's
tie of a dead-lettered message to the attempt it started (issue 14, behaviour 1)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import asyncinfer.functions.sweeper as sweeper
from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.dlq import DeadLetterHandler
from asyncinfer.jobs import outbox, transitions
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.record import OUTBOX_FIELD, OUTBOX_MARK_FIELD, OUTBOX_SINCE_FIELD
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.resources import Resources
from tests.conftest import drain_events


def events(res: Resources) -> list[dict[str, Any]]:
    return drain_events(clients.client("sqs"), res.event_log_queue)


def types_of(evs: list[dict[str, Any]], job_id: str) -> list[str]:
    return [e["type"] for e in evs if e["data"]["id"] == job_id]


@pytest.fixture
def sns_down(monkeypatch: pytest.MonkeyPatch) -> Any:
    """SNS refuses every publish until ``sns_down.up()``."""

    class Down:
        def __init__(self) -> None:
            self.sns = clients.client("sns")
            self.real = self.sns.publish
            monkeypatch.setattr(self.sns, "publish", self.fail)

        def fail(self, **_: Any) -> Any:
            raise RuntimeError("SNS is down")

        def up(self) -> None:
            monkeypatch.setattr(self.sns, "publish", self.real)

    return Down()


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.time
    monkeypatch.setattr(outbox.time, "time", lambda: real() + seconds)
    monkeypatch.setattr(sweeper.time, "time", lambda: real() + seconds)


def submit(settings: Settings, **req: Any) -> str:
    job, _ = JobService(settings).submit("t", JobRequest(model="echo", input={}, **req))
    return str(job["id"])


def pending(store: JobStore, job_id: str) -> list[str]:
    rec = store.get(job_id)
    assert rec is not None
    return [k.split("#")[0] for k in rec.get(OUTBOX_FIELD) or ()]


def test_a_published_event_leaves_no_outbox(settings: Settings, resources: Resources) -> None:
    job_id = submit(settings)
    rec = JobStore(settings).get(job_id)
    assert rec is not None
    assert not {OUTBOX_FIELD, OUTBOX_MARK_FIELD, OUTBOX_SINCE_FIELD} & set(rec)
    assert types_of(events(resources), job_id) == ["job.queued"]


def test_job_queued_of_a_submit_in_an_sns_outage_is_published_by_the_sweeper(
    settings: Settings, resources: Resources, sns_down: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before the outbox, the API logged and dropped it (tests/e2e/test_chaos.py's xfail).
    job_id = submit(settings)
    store = JobStore(settings)
    assert pending(store, job_id) == ["job.queued"]
    sns_down.up()
    assert sweeper.republish_pending(settings) == 0  # not before the grace period
    later(monkeypatch, settings.outbox_grace_seconds + 1)
    assert sweeper.republish_pending(settings) == 1
    evs = events(resources)
    assert types_of(evs, job_id) == ["job.queued"]
    assert evs[0]["data"]["status"] == "queued"
    rec = store.get(job_id)
    assert rec is not None and OUTBOX_MARK_FIELD not in rec and OUTBOX_FIELD not in rec
    assert sweeper.republish_pending(settings) == 0  # once


def test_a_pending_event_stays_while_sns_is_down(
    settings: Settings, resources: Resources, sns_down: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(settings)
    later(monkeypatch, settings.outbox_grace_seconds + 1)
    assert sweeper.republish_pending(settings) == 0
    assert pending(JobStore(settings), job_id) == ["job.queued"]


def test_the_sweepers_job_expired_is_not_lost_when_publishing_fails(
    settings: Settings, resources: Resources, sns_down: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(settings, ttl_seconds=10)
    later(monkeypatch, 11)
    assert sweeper.expire_due(settings) == [job_id]
    store = JobStore(settings)
    assert sorted(pending(store, job_id)) == ["job.expired", "job.queued"]
    sns_down.up()
    later(monkeypatch, 11 + settings.outbox_grace_seconds + 1)
    assert sweeper.republish_pending(settings) == 2
    evs = events(resources)
    assert sorted(types_of(evs, job_id)) == ["job.expired", "job.queued"]
    expired = next(e for e in evs if e["type"] == "job.expired")
    assert expired["data"]["error"]["code"] == "expired"
    assert pending(store, job_id) == []


def test_a_cancel_in_an_sns_outage_succeeds_and_its_event_follows(
    settings: Settings, resources: Resources, sns_down: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = JobService(settings)
    job_id = submit(settings)
    assert service.cancel("t", job_id)["status"] == "cancelled"  # no 500 for a done write
    sns_down.up()
    later(monkeypatch, settings.outbox_grace_seconds + 1)
    sweeper.republish_pending(settings)
    assert "job.cancelled" in types_of(events(resources), job_id)


def test_a_write_that_clears_takes_out_only_its_keys(settings: Settings) -> None:
    store = JobStore(settings)
    job_id = submit(settings)
    started = store.apply(transitions.start(job_id, attempts=0, started_at="2026-12-01T00:00:00Z"))
    (key,) = outbox.pending_keys(started, "job.started")
    done = transitions.Transition(
        job_id, "running", "succeeded", attempts=1, outboxed=False, clears=(key,)
    )
    assert done.applied_to(started).get(OUTBOX_FIELD) is None
    rec = store.apply(done)
    assert OUTBOX_FIELD not in rec
    with pytest.raises(ValueError):
        transitions.Transition(job_id, "running", "failed", clears=(key,))


def test_publishing_clears_only_that_events_keys(settings: Settings, resources: Resources) -> None:
    store = JobStore(settings)
    job_id = submit(settings)
    rec = store.apply(transitions.start(job_id, attempts=0, started_at="2026-12-01T00:00:00Z"))
    keys = outbox.pending_keys(rec)
    store.ddb.update_item(  # a job.queued still pending beside it
        TableName=store.table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="ADD outbox :q",
        ExpressionAttributeValues={":q": {"SS": ["job.queued#x"]}},
    )
    EventPublisher(settings, store=store).publish(rec)
    assert pending(store, job_id) == ["job.queued"]
    assert keys and all(k not in (store.get(job_id) or {}).get(OUTBOX_FIELD, []) for k in keys)


# --------------------------------------------------------------------------- DLQ handler
def _message(job_id: str) -> str:
    return JobMessage(
        job_id=job_id,
        tenant="t",
        model="echo",
        priority="normal",
        expires_at="2026-12-31T00:00:00.000Z",
        timeout_seconds=60,
    ).dumps()


def test_dlq_of_an_older_message_leaves_the_running_attempt_alone(
    settings: Settings, resources: Resources
) -> None:
    store = JobStore(settings)
    job_id = submit(settings)
    store.apply(transitions.start(job_id, attempts=0, started_at="t1", message_id="m1"))
    store.apply(transitions.requeue(job_id, 1))
    store.apply(transitions.start(job_id, attempts=1, started_at="t2", message_id="m2"))
    handler = DeadLetterHandler(settings)
    # A duplicate of the first attempt's message dead-letters while attempt 2 runs.
    assert handler.handle(_message(job_id), 4, "m1") is None
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 2
    # The running attempt's own message fails it.
    failed = handler.handle(_message(job_id), 4, "m2")
    assert failed is not None and failed["status"] == "failed"
    assert failed["error"]["code"] == "max_attempts"


def test_dlq_fails_a_queued_job_and_a_running_one_without_a_message_id(
    settings: Settings, resources: Resources
) -> None:
    store = JobStore(settings)
    queued = submit(settings)
    legacy = submit(settings)
    store.transition(legacy, from_status="queued", to_status="running", increment_attempts=True)
    handler = DeadLetterHandler(settings)
    for job_id in (queued, legacy):
        rec = handler.handle(_message(job_id), 3, "m9")
        assert rec is not None and rec["status"] == "failed"
        assert json.dumps(rec["error"]).count("max_attempts") == 1


def test_a_started_event_of_a_live_attempt_is_left_to_its_worker() -> None:
    now = 1_000_000.0
    running = {"status": "running", "attempts": 2, "lease_expires_epoch": now + 60}
    assert outbox.disposition(running, "job.started#2", now) == "leave"
    assert outbox.disposition(running, "job.started#n", now) == "leave"  # the worker's key
    # Lease lapsed: the worker may be gone; the event goes out.
    assert outbox.disposition(
        {**running, "lease_expires_epoch": now - 1}, "job.started#2", now
    ) == ("publish")


def test_a_started_event_of_an_attempt_handed_back_is_dropped() -> None:
    now = 1_000_000.0
    assert outbox.disposition({"status": "queued", "attempts": 1}, "job.started#1", now) == "drop"
    assert outbox.disposition({"status": "queued", "attempts": 1}, "job.started#n", now) == "drop"
    later_attempt = {"status": "running", "attempts": 2, "lease_expires_epoch": now + 60}
    assert outbox.disposition(later_attempt, "job.started#1", now) == "drop"
    # Other events are always published again.
    assert outbox.disposition({"status": "queued", "attempts": 1}, "job.queued#1", now) == (
        "publish"
    )
    assert outbox.disposition({"status": "succeeded", "attempts": 1}, "job.succeeded#1", now) == (
        "publish"
    )


def test_the_sweeper_drops_a_handed_back_attempts_started_event_without_publishing(
    settings: Settings, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker killed after it published job.started: the sweeper took the job back (queued,
    # attempts 1). Its job.started#1 must not be published again after the job.queued.
    job_id = submit(settings)
    events(resources)  # the submit's job.queued
    store = JobStore(settings)
    store.ddb.update_item(
        TableName=store.table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET attempts = :one, #obm = :m, #obs = :s ADD #ob :k",
        ExpressionAttributeNames={
            "#ob": OUTBOX_FIELD,
            "#obm": OUTBOX_MARK_FIELD,
            "#obs": OUTBOX_SINCE_FIELD,
        },
        ExpressionAttributeValues={
            ":one": {"N": "1"},
            ":m": {"S": "pending"},
            ":s": {"N": str(int(time.time()))},
            ":k": {"SS": ["job.started#1"]},
        },
    )
    later(monkeypatch, settings.outbox_grace_seconds + 1)
    assert sweeper.republish_pending(settings) == 0
    assert types_of(events(resources), job_id) == []
    assert pending(store, job_id) == []
