"""The worker's AWS requests, piece by piece (moto in-process): which running jobs the watcher
writes progress for or reads cancel requests of, when a poller receives, and which jobs are
written alone."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import pytest

from asyncinfer.core.settings import Settings
from asyncinfer.jobs.store import JobStore
from asyncinfer.worker import held as held_module
from asyncinfer.worker import watcher
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.runner import Worker, quiet_webhook
from tests.unit.helpers import count_calls, new_job

IDS = [f"job_01ARZ3NDEKTSV4RRFFQ69G5FA{c}" for c in "ABCDEF"]


def running_job(store: JobStore, job_id: str) -> None:
    new_job(store, job_id, expires_at="2099-12-01T00:00:00.000Z")
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)


def held(job_id: str, *, age: float, progress: int | None = None) -> Held:
    h = Held(message_id=job_id, receipt="r", body="{}", job_id=job_id, attempts=1)
    h.started = time.monotonic() - age
    if progress is not None:
        h.progress = (progress, {"text": "x" * progress})
    return h


def test_progress_and_cancel_checks_skip_jobs_that_just_started(settings: Settings) -> None:
    worker = Worker(settings, "echo")
    store = worker.store
    for j in IDS[:4]:
        running_job(store, j)
    store.update_fields(IDS[3], status="running", attempts=1, set_fields={"cancel_requested": True})
    old_progress = held(IDS[0], age=3, progress=5)
    new_progress = held(IDS[1], age=0.2, progress=2)
    new_silent = held(IDS[2], age=0.2)
    old_silent = held(IDS[3], age=3)  # wrote no progress: its cancel request is read
    for h in (old_progress, new_progress, new_silent, old_silent):
        worker.inflight.add(h)
    calls = count_calls(store.ddb)
    worker._watch_once()
    # One progress write (one job) and one cancel read (one job); the new jobs cost nothing.
    assert calls == Counter({"UpdateItem": 1, "BatchGetItem": 1})
    assert store.get(IDS[0])["progress_tokens"] == 5  # type: ignore[index]
    assert "progress_tokens" not in store.get(IDS[1])  # type: ignore[operator]
    assert old_silent.cancel_event.is_set()
    assert not any(h.cancel_event.is_set() for h in (old_progress, new_progress, new_silent))
    assert new_progress.progress is not None  # kept for the next round


def test_a_refused_progress_write_is_the_cancel_signal(settings: Settings) -> None:
    worker = Worker(settings, "echo")
    for j in IDS[:2]:
        running_job(worker.store, j)
    worker.store.update_fields(
        IDS[1], status="running", attempts=1, set_fields={"cancel_requested": True}
    )
    a, b = held(IDS[0], age=5, progress=3), held(IDS[1], age=5, progress=4)
    worker.inflight.add(a)
    worker.inflight.add(b)
    calls = count_calls(worker.store.ddb)
    worker._watch_once()
    assert b.cancel_event.is_set() and not a.cancel_event.is_set()
    assert "BatchGetItem" not in calls


def test_a_job_without_new_progress_is_checked_by_rewriting_its_count(settings: Settings) -> None:
    """A slow step: the job reported before but not since the last round. Its last count is
    written again in the round's one transaction, which is its cancel check; no read."""
    worker = Worker(settings, "echo")
    for j in IDS[:2]:
        running_job(worker.store, j)
    a, b = held(IDS[0], age=5, progress=3), held(IDS[1], age=5, progress=4)
    worker.inflight.add(a)
    worker.inflight.add(b)
    worker._watch_once()
    a.progress = (6, {"text": "x" * 6})  # b reports nothing this round
    calls = count_calls(worker.store.ddb)
    worker._watch_once()
    assert calls == Counter({"TransactWriteItems": 1})
    assert worker.store.get(IDS[0])["progress_tokens"] == 6  # type: ignore[index]
    assert worker.store.get(IDS[1])["progress_tokens"] == 4  # type: ignore[index]
    # Neither reports now; b is asked to cancel: its rewrite is refused, and that is the signal.
    worker.store.update_fields(
        IDS[1], status="running", attempts=1, set_fields={"cancel_requested": True}
    )
    calls.clear()
    worker._watch_once()
    assert "BatchGetItem" not in calls
    assert b.cancel_event.is_set() and not a.cancel_event.is_set()


class StubSqs:
    """Records receive calls; returns no message; stops the poller after ``limit`` calls."""

    def __init__(self, worker: Worker, limit: int = 3) -> None:
        self.worker = worker
        self.limit = limit
        self.calls: list[dict[str, Any]] = []

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        if len(self.calls) >= self.limit:
            self.worker.stop_event.set()
        return {"Messages": []}


def poll_briefly(worker: Worker, seconds: float = 0.3) -> None:
    t = threading.Thread(target=worker.intake.loop, daemon=True)
    t.start()
    t.join(timeout=seconds)
    worker.stop_event.set()
    t.join(timeout=5)


@pytest.mark.parametrize(("batch", "most"), [(1, 1), (4, 4), (16, 10)])
def test_a_poller_receives_up_to_ten_while_there_is_room(
    settings: Settings, batch: int, most: int
) -> None:
    worker = Worker(settings, "echo", max_batch_size=batch)
    stub = StubSqs(worker)
    worker.sqs = stub
    poll_briefly(worker)
    assert stub.calls and all(c["MaxNumberOfMessages"] == most for c in stub.calls)


def test_a_full_worker_does_not_receive_while_its_inbox_holds_messages(
    settings: Settings,
) -> None:
    worker = Worker(settings, "echo", max_batch_size=2)
    stub = StubSqs(worker)
    worker.sqs = stub
    worker._running = {"a": (held("a", age=1), {}), "b": (held("b", age=1), {})}
    worker.inboxes["normal"].put(held("c", age=0))
    poll_briefly(worker)
    assert stub.calls == []
    # Issue 18: with its inbox empty but its slots full it still receives nothing (a message
    # it cannot start stays in the queue for other workers)...
    worker.inboxes["normal"].get_nowait()
    worker.stop_event.clear()
    poll_briefly(worker)
    assert stub.calls == []
    # ...and once a slot frees it receives, no more than that slot.
    del worker._running["b"]
    worker.stop_event.clear()
    poll_briefly(worker)
    assert stub.calls and all(c["MaxNumberOfMessages"] == 1 for c in stub.calls)


def test_quiet_webhook() -> None:
    assert quiet_webhook(None)
    assert quiet_webhook(json.dumps({"url": "https://x.example/h"}))
    assert quiet_webhook(json.dumps({"url": "https://x", "events": ["job.succeeded"]}))
    assert not quiet_webhook(json.dumps({"url": "https://x", "events": ["job.started"]}))
    assert not quiet_webhook(json.dumps({"url": "https://x", "events": ["job.queued"]}))
    assert not quiet_webhook("not json")


def test_pending_terminal_writes_wait_for_a_take_at_most_a_while(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that does not come back to take: the watcher writes what waited."""
    from asyncinfer.models.base import WorkItem
    from asyncinfer.models.schemas import EchoInput

    worker = Worker(settings, "echo")
    running_job(worker.store, IDS[0])
    h = held(IDS[0], age=1)
    worker.inflight.add(h)
    record = worker.store.get(IDS[0])
    assert record is not None
    worker._running[IDS[0]] = (h, record)
    worker.finish(WorkItem(job_id=IDS[0], input=EchoInput()), {"ok": True})
    assert worker.store.get(IDS[0])["status"] == "running"  # type: ignore[index]
    worker._watch_once()  # not long enough yet
    assert worker.store.get(IDS[0])["status"] == "running"  # type: ignore[index]
    monkeypatch.setattr(watcher, "PENDING_FLUSH_SECONDS", 0.0)
    worker._watch_once()
    assert worker.store.get(IDS[0])["status"] == "succeeded"  # type: ignore[index]
    assert worker._to_delete == [h]


def received(worker: Worker) -> Held:
    """A real message of the echo queue, received and held by ``worker``."""
    url = worker.queues["normal"]
    worker.sqs.send_message(QueueUrl=url, MessageBody="{}")
    m = worker.sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"][0]
    h = Held(message_id=m["MessageId"], receipt=m["ReceiptHandle"], body="{}", queue_url=url)
    worker.inflight.add(h)
    return h


def in_flight(worker: Worker) -> int:
    attrs = worker.sqs.get_queue_attributes(
        QueueUrl=worker.queues["normal"], AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_deletes_wait_for_company_while_jobs_run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a job runs, a finished message waits for others (10, or DELETE_FLUSH_SECONDS; the
    watcher deletes it when due even if the handler takes nothing); with no job in progress the
    next take deletes it at once."""
    worker = Worker(settings, "echo")
    worker._running = {"busy": (held("busy", age=1), {})}
    h = received(worker)
    worker._delete_later(h)
    worker.take(1, timeout=0)
    worker._watch_once()
    assert in_flight(worker) == 1 and len(worker.inflight) == 1
    monkeypatch.setattr(held_module, "DELETE_FLUSH_SECONDS", 0.0)
    worker._watch_once()
    assert in_flight(worker) == 0 and len(worker.inflight) == 0

    monkeypatch.setattr(held_module, "DELETE_FLUSH_SECONDS", 60.0)
    h = received(worker)
    worker._delete_later(h)
    worker.take(1, timeout=0)
    assert in_flight(worker) == 1
    worker._running = {}
    worker.take(1, timeout=0)
    assert in_flight(worker) == 0 and len(worker.inflight) == 0


def test_messages_released_at_stop_stay_hidden_for_one_receive_wait(settings: Settings) -> None:
    """Workers stopping together each have a long poll in flight: a message one of them releases
    must not reappear before those polls end, or each receives it in turn (every receive counts
    toward maxReceiveCount) and a job that never ran goes to the dead-letter queue."""
    import boto3

    settings = settings.model_copy(update={"receive_wait_seconds": 1})
    worker = Worker(settings, "echo")
    url = settings.priority_queues("echo")["normal"]
    sqs = boto3.client("sqs", region_name=settings.region)
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    (m,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    h = Held(message_id=m["MessageId"], receipt=m["ReceiptHandle"], body="{}", queue_url=url)
    worker.inflight.add(h)
    worker.inboxes["normal"].put(h)
    worker._release_unstarted()
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
    time.sleep(1.2)
    (again,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"]
    assert again["MessageId"] == m["MessageId"]
