"""Events are not lost (issue 14, behaviour 6), against a moto server: a message is deleted only
once its job's event is out, and a redelivery of a job this worker cancelled publishes
``job.cancelled`` again, like the other terminal events."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.jobs.events import EventPublisher
from tests.integration.conftest import Env, WorkerThread


def types_for(events: list[dict], job_id: str) -> list[str]:
    return [e["type"] for e in events if e["data"]["id"] == job_id]


class FailingPublisher(EventPublisher):
    """The real publisher, refusing every call while ``down`` is set (an SNS outage)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.down = threading.Event()
        self.refused = 0

    def publish(self, record: dict[str, Any]) -> None:
        self._check()
        super().publish(record)

    def publish_many(self, records: list[dict[str, Any]]) -> None:
        self._check()
        super().publish_many(records)

    def _check(self) -> None:
        if self.down.is_set():
            self.refused += 1
            raise RuntimeError("SNS is down")


def test_a_message_waits_for_its_event_during_an_sns_outage(
    make_env: Callable[..., Env],
) -> None:
    env = make_env()
    url = env.resources.queues["echo"]
    publisher = FailingPublisher(env.settings, PayloadStore(env.settings))
    publisher.down.set()
    job_id = env.submit("echo", {"n": 1})
    env.events()  # job.queued
    with WorkerThread(env.settings, events=publisher):
        env.wait_for(job_id, {"succeeded"})
        time.sleep(2.5)  # retries, deletes due, a heartbeat
        assert publisher.refused >= 2
        # The job is finished, its event is not out: its message is still held, hidden.
        assert env.queue_counts(url) == (0, 1)
        assert types_for(env.events(), job_id) == []
        publisher.down.clear()
        deadline = time.monotonic() + 20
        while env.queue_counts(url) != (0, 0):
            assert time.monotonic() < deadline, "message not deleted after the event went out"
            time.sleep(0.2)
    assert types_for(env.events(), job_id) == ["job.started", "job.succeeded"]
    assert env.job(job_id)["attempts"] == 1


def test_redelivered_message_of_a_cancelled_job_republishes_job_cancelled(
    make_env: Callable[..., Env],
) -> None:
    """A worker that died after writing ``cancelled`` (the job was cancelled while it ran) but
    before publishing and deleting: the next receive publishes ``job.cancelled`` again."""
    env = make_env()
    job_id = env.submit("echo", {"n": 1})
    sqs = clients.client("sqs", env.settings)
    url = env.resources.queues["echo"]
    msg = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"][0]  # the lost worker
    store = env.store
    store.transition(
        job_id,
        from_status="queued",
        to_status="running",
        increment_attempts=True,
        set_fields={"started_at": "2026-11-30T00:00:00.000Z"},
    )
    store.transition(
        job_id,
        from_status="running",
        to_status="cancelled",
        attempts=1,
        set_fields={"error": {"code": "cancelled", "message": "job was cancelled"}},
    )
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=0
    )
    env.events()  # what the lost worker published before dying: nothing but queued
    with WorkerThread(env.settings):
        deadline = time.monotonic() + 15
        while env.queue_counts(url) != (0, 0):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.5)
    assert types_for(env.events(), job_id) == ["job.cancelled"]
    assert env.job(job_id)["attempts"] == 1


def test_a_workers_job_leaves_no_pending_event_and_costs_the_sweeper_one_unmark(
    make_env: Callable[..., Env], monkeypatch: Any
) -> None:
    """The worker's job.started waits in the outbox until the terminal write of its attempt
    clears it (no request of its own); the sweeper then only takes the record out of the
    outbox index, publishing nothing again (issue 14, behaviour 6)."""
    from asyncinfer.functions import sweeper
    from asyncinfer.jobs import outbox

    env = make_env()
    job_id = env.submit("echo", {"n": 1})
    with WorkerThread(env.settings):
        rec = env.wait_for(job_id, {"succeeded"})
    time.sleep(1.5)  # the terminal event out
    assert "outbox" not in (env.store.get(job_id) or {})
    assert types_for(env.events(), job_id) == ["job.queued", "job.started", "job.succeeded"]
    real = time.time
    monkeypatch.setattr(outbox.time, "time", lambda: real() + 3600)
    assert sweeper.republish_pending(env.settings) == 0
    assert outbox.due(env.store, int(real()) + 3600) == []
    assert env.events() == []
    assert rec["attempts"] == 1
