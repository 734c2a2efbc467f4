"""Issue 14, "nothing stuck, nothing lost": messages of jobs that may still need them are never
deleted, recovery respects a live lease, and a handed-back job whose message is lost is found
by the sweeper (moto in-process)."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest

import asyncinfer.functions.sweeper as sweeper
from asyncinfer.aws import clients
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.settings import Settings
from asyncinfer.core.timeutil import now
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs import transitions
from asyncinfer.jobs.record import LEASE_FIELD, REQUEUED_MARK
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.worker import finishing
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.runner import Worker

TENANT = "t1"
LEASE = 5


@pytest.fixture
def lset(settings: Settings) -> Settings:
    """Unit settings with a short lease (seconds) and no retry delay (a released message is
    visible again at once)."""
    return settings.model_copy(update={"lease_seconds": float(LEASE), "retry_delay_seconds": 0.0})


def submit(settings: Settings, **req: Any) -> str:
    job, _ = JobService(settings).submit(
        TENANT, JobRequest(model="echo", **{"input": {"sleep_seconds": 0}, **req})
    )
    return str(job["id"])


_REAL_TIME = time.time


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the clocks the store, sweeper and worker read to ``seconds`` ahead of real time."""
    real_time, real_now = _REAL_TIME, now
    monkeypatch.setattr(time, "time", lambda: real_time() + seconds)
    monkeypatch.setattr(finishing, "now", lambda: real_now() + timedelta(seconds=seconds))
    monkeypatch.setattr(sweeper, "now", lambda: real_now() + timedelta(seconds=seconds))


def sqs(settings: Settings) -> Any:
    return clients.client("sqs", settings)


def receive_all(settings: Settings) -> list[dict[str, Any]]:
    """The visible messages of the echo queue (receipts, bodies, receive counts)."""
    resp = sqs(settings).receive_message(
        QueueUrl=settings.queue_url("echo"),
        MaxNumberOfMessages=10,
        WaitTimeSeconds=0,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )
    return list(resp.get("Messages", []))


def receive(settings: Settings) -> dict[str, Any]:
    msgs = receive_all(settings)
    assert len(msgs) == 1
    return msgs[0]


def in_queue(settings: Settings) -> int:
    """Messages in the echo queue, visible or not (not deleted)."""
    attrs = sqs(settings).get_queue_attributes(
        QueueUrl=settings.queue_url("echo"),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


def held_of(settings: Settings, m: dict[str, Any]) -> Held:
    return Held(
        message_id=m["MessageId"],
        receipt=m["ReceiptHandle"],
        body=m["Body"],
        queue_url=settings.queue_url("echo"),
        receive_count=int(m["Attributes"]["ApproximateReceiveCount"]),
    )


def take_on_worker(settings: Settings, m: dict[str, Any]) -> tuple[Worker, list[Any]]:
    """Hand message ``m`` to a new worker as its poller would; its started work items."""
    worker = Worker(settings, "echo")
    held = held_of(settings, m)
    worker.inflight.add(held)
    worker.inboxes["normal"].put(held)
    items = worker.take(1, timeout=0)
    worker.held.flush_deletes()
    return worker, items


# ------------------------------------------------------------ 1a: never delete a needed message


def test_a_start_that_keeps_meeting_a_queued_record_releases_the_message(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_mark_running`` gives up after 3 refusals by a queued record: the message was deleted
    (the job then stayed queued for ever); it is released for SQS to deliver again."""
    store = JobStore(lset)
    job_id = submit(lset)
    m = receive(lset)
    worker = Worker(lset, "echo")
    queued = store.get(job_id)

    def refuse(t: Any) -> Any:
        raise TransitionRefused("queued at another attempt", queued)

    monkeypatch.setattr(worker.store, "apply", refuse)
    held = held_of(lset, {**m, "Attributes": {"ApproximateReceiveCount": "2"}})
    worker.inflight.add(held)
    assert worker.starter.mark_running(job_id, held, redelivered=True) is None
    worker.held.flush_deletes()
    assert in_queue(lset) == 1
    assert [json.loads(x["Body"])["job_id"] for x in receive_all(lset)] == [job_id]
    assert not worker.inflight.snapshot()


# ------------------------------------------------------------ 2: recovery respects a live lease


def test_a_duplicate_message_of_a_job_running_under_a_live_lease_is_deleted(
    lset: Settings,
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    first = receive(lset)
    _, items = take_on_worker(lset, first)
    assert len(items) == 1
    sqs(lset).send_message(QueueUrl=lset.queue_url("echo"), MessageBody=first["Body"])
    dup = receive(lset)
    assert dup["MessageId"] != first["MessageId"]
    _, none = take_on_worker(lset, dup)
    assert none == []
    rec = store.get(job_id)
    # Before: the duplicate took the job back from its live worker and started attempt 2.
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 1
    assert rec["message_id"] == first["MessageId"]
    assert in_queue(lset) == 1  # the duplicate is gone; the running attempt's message stays


def test_the_running_attempts_own_message_seen_early_is_released_not_requeued(
    lset: Settings,
) -> None:
    store = JobStore(lset)
    job_id = submit(lset, timeout_seconds=60)
    first = receive(lset)
    take_on_worker(lset, first)
    # A missed heartbeat: the message becomes visible while its worker is alive.
    q = sqs(lset)
    q.change_message_visibility(
        QueueUrl=lset.queue_url("echo"), ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    again = receive(lset)
    assert again["MessageId"] == first["MessageId"]
    _, none = take_on_worker(lset, again)
    assert none == []
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 1
    assert in_queue(lset) == 1  # kept (the live attempt may still need it) ...
    assert receive_all(lset) == []  # ... hidden until the lease or the attempt's timeout ends


def test_a_lapsed_lease_met_by_a_worker_is_taken_back_by_the_sweepers_rules(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    first = receive(lset)
    take_on_worker(lset, first)  # ... and that worker is killed
    store.update_fields(job_id, status="running", attempts=1, set_fields={"cancel_requested": True})
    later(monkeypatch, LEASE + 2)
    q = sqs(lset)
    q.change_message_visibility(
        QueueUrl=lset.queue_url("echo"), ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    _, none = take_on_worker(lset, receive(lset))
    assert none == []
    rec = store.get(job_id)
    # Before: requeued and run again, to be cancelled at its first step.
    assert rec is not None and rec["status"] == "cancelled"
    assert in_queue(lset) == 0


# ------------------------------------------------------------ 1b: the hand-back safety net


def test_a_hand_back_stays_in_the_lease_index_with_a_requeue_deadline(lset: Settings) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    store.apply(transitions.start(job_id, attempts=0, started_at="2026-12-01T00:00:00Z"))
    t0 = int(time.time())
    back = store.apply(transitions.requeue(job_id, 1))
    assert back["status"] == "queued" and back["running_mark"] == REQUEUED_MARK
    grace = 2 * lset.visibility_timeout_seconds + lset.lease_interval
    assert back[LEASE_FIELD] >= t0 + grace
    assert store.running_past_lease(back[LEASE_FIELD] + 1) == []  # not among running jobs
    ids, _ = store.running_past_lease_page(back[LEASE_FIELD] + 1, mark=REQUEUED_MARK)
    assert ids == [job_id]
    again = store.apply(transitions.start(job_id, attempts=1, started_at="2026-12-01T00:01:00Z"))
    assert again["running_mark"] == "running"
    ids, _ = store.running_past_lease_page(back[LEASE_FIELD] + 1, mark=REQUEUED_MARK)
    assert ids == []


def _lost_hand_back(settings: Settings, monkeypatch: pytest.MonkeyPatch, **req: Any) -> str:
    """A job whose worker was lost (taken back by the sweeper) and whose message is lost too."""
    job_id = submit(settings, **req)
    first = receive(settings)
    take_on_worker(settings, first)
    later(monkeypatch, LEASE + 2)
    assert [r["status"] for r in sweeper.take_back_lapsed(settings)] == ["queued"]
    sqs(settings).delete_message(
        QueueUrl=settings.queue_url("echo"), ReceiptHandle=first["ReceiptHandle"]
    )
    assert in_queue(settings) == 0
    return job_id


def test_the_sweeper_sends_a_lost_hand_backs_message_again(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_input = lset.model_copy(update={"inline_input_limit_bytes": 0})  # the input goes to S3
    store = JobStore(s3_input)
    job_id = _lost_hand_back(s3_input, monkeypatch)
    assert store.get(job_id)["input_ref"]  # type: ignore[index]
    assert sweeper.resend_lost(s3_input) == {"resent": [], "failed": []}  # within the grace
    later(monkeypatch, LEASE + 2 + 3600)
    assert sweeper.resend_lost(s3_input) == {"resent": [job_id], "failed": []}
    assert sweeper.resend_lost(s3_input) == {"resent": [], "failed": []}  # a new deadline
    _, items = take_on_worker(s3_input, receive(s3_input))
    assert len(items) == 1 and items[0].attempt == 2
    assert store.get(job_id)["status"] == "running"  # type: ignore[index]


def test_a_lost_hand_back_with_an_inline_input_fails_once_its_ttl_passed(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = _lost_hand_back(lset, monkeypatch, ttl_seconds=7200)
    assert "input_ref" not in store.get(job_id)  # type: ignore[operator]
    later(monkeypatch, 3600)  # past the deadline, within the TTL: its message may yet come
    assert sweeper.resend_lost(lset) == {"resent": [], "failed": []}
    assert store.get(job_id)["status"] == "queued"  # type: ignore[index]
    later(monkeypatch, 7200 + 3600)
    assert sweeper.resend_lost(lset) == {"resent": [], "failed": [job_id]}
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "failed"
    assert rec["error"]["code"] == "max_attempts"
    assert "running_mark" not in rec and LEASE_FIELD not in rec


def test_a_hand_back_with_no_attempt_left_is_failed_past_its_deadline(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    for n in range(lset.max_receive_count):
        store.apply(transitions.start(job_id, attempts=n, started_at=f"2026-12-01T00:0{n}:00Z"))
        store.apply(transitions.requeue(job_id, n + 1))
    later(monkeypatch, 3600)
    assert sweeper.resend_lost(lset) == {"resent": [], "failed": [job_id]}
    assert store.get(job_id)["error"]["code"] == "max_attempts"  # type: ignore[index]


def test_a_resent_message_and_the_original_run_the_job_once(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Duplicates are harmless: the sweeper may re-send a message that was only slow."""
    s3_input = lset.model_copy(update={"inline_input_limit_bytes": 0})
    store = JobStore(s3_input)
    job_id = submit(s3_input)
    first = receive(s3_input)
    take_on_worker(s3_input, first)
    later(monkeypatch, LEASE + 2)
    sweeper.take_back_lapsed(s3_input)
    later(monkeypatch, 3600)
    assert sweeper.resend_lost(s3_input)["resent"] == [job_id]
    sqs(s3_input).change_message_visibility(
        QueueUrl=s3_input.queue_url("echo"),
        ReceiptHandle=first["ReceiptHandle"],
        VisibilityTimeout=0,
    )
    both = receive_all(s3_input)
    assert len(both) == 2
    started = [take_on_worker(s3_input, m)[1] for m in both]
    assert sorted(len(items) for items in started) == [0, 1]
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 2
    assert in_queue(s3_input) == 1  # the duplicate was deleted


def test_a_hand_back_behind_a_backlog_is_neither_resent_nor_failed(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: past its deadline, a handed-back job whose queue still has visible
    messages may be waiting behind them: no duplicate (it would inflate the backlog metric) and
    no failure until the queue is drained."""
    s3_input = lset.model_copy(update={"inline_input_limit_bytes": 0})
    store = JobStore(s3_input)
    job_id = _lost_hand_back(s3_input, monkeypatch)
    submit(s3_input)  # another job's message waits in the same queue
    later(monkeypatch, LEASE + 2 + 3600)
    assert sweeper.resend_lost(s3_input) == {"resent": [], "failed": []}
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "queued"
    assert rec[LEASE_FIELD] > int(time.time())  # a new deadline
    other = receive(s3_input)  # the backlog drains
    sqs(s3_input).delete_message(
        QueueUrl=s3_input.queue_url("echo"), ReceiptHandle=other["ReceiptHandle"]
    )
    later(monkeypatch, LEASE + 2 + 7200)
    assert sweeper.resend_lost(s3_input) == {"resent": [job_id], "failed": []}
