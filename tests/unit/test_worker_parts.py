"""The worker's parts with stubs where AWS is not the point: the pure outcome decision, receive
by capacity (a stub SQS queue), the journal's order of write, event and delete, and the echo
handler's concurrency and one-at-a-time setting."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from asyncinfer.core.errors import InvalidInput, JobCancelled, TransientError, WorkerStopping
from asyncinfer.core.settings import INLINE_OUTPUT_LIMIT_BYTES, Settings
from asyncinfer.jobs.transitions import Transition
from asyncinfer.models.base import WorkItem
from asyncinfer.models.registry import MODELS
from asyncinfer.models.schemas import EchoInput
from asyncinfer.worker import outcomes
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.intake import Intake
from asyncinfer.worker.journal import Finished, Journal
from tests.conftest import apply_env

RECORD = {"job_id": "job_A", "tenant": "t", "attempts": 2, "status": "running"}
AT = "2026-12-01T00:00:00.000Z"


def decide(result: Any, record: dict[str, Any] = RECORD, **kw: Any) -> outcomes.Outcome:
    return outcomes.decide(result, record, completed_at=AT, retry_delay_seconds=2.0, **kw)


# ---------------------------------------------------------------------- outcomes (pure)
def test_a_result_succeeds_the_job_with_its_output_inline() -> None:
    out = decide({"text": "hi", "usage": {"completion_tokens": 3}})
    assert isinstance(out, outcomes.Finish) and out.upload is None and not out.alone
    t = out.transition
    assert (t.from_status, t.to_status, t.attempts) == ("running", "succeeded", 2)
    assert t.set_fields == {
        "completed_at": AT,
        "progress_tokens": 3,
        "output": '{"text":"hi","usage":{"completion_tokens":3}}',
    }


def test_a_large_output_is_to_be_uploaded_and_not_inline() -> None:
    out = decide({"blob": "x" * (INLINE_OUTPUT_LIMIT_BYTES + 1)})
    assert isinstance(out, outcomes.Finish)
    assert out.upload is not None and len(out.upload) > INLINE_OUTPUT_LIMIT_BYTES
    assert "output" not in out.transition.set_fields
    assert "output" in out.transition.remove_fields


def test_stopping_and_retryable_errors_requeue_with_a_growing_capped_delay() -> None:
    assert decide(WorkerStopping("stop")) == outcomes.Requeue("job_A", 2, 0.0, "worker stopping")
    retry = decide(TransientError("flaky"))
    assert isinstance(retry, outcomes.Requeue) and retry.delay == 4.0  # 2 s x 2 ** (2 - 1)
    late = decide(TransientError("flaky"), {**RECORD, "attempts": 30})
    assert isinstance(late, outcomes.Requeue)
    assert late.delay == outcomes.MAX_RETRY_DELAY_SECONDS


def test_a_permanent_error_fails_and_drops_the_progress_snapshot() -> None:
    out = decide(InvalidInput("bad"))
    assert isinstance(out, outcomes.Finish)
    assert out.transition.to_status == "failed"
    assert out.transition.set_fields["error"]["code"] == InvalidInput.code
    assert set(out.transition.remove_fields) == {"output", "progress_tokens"}


def test_a_cancel_keeps_its_partial_output() -> None:
    out = decide(
        JobCancelled("cancelled", partial={"text": "ab", "usage": {"completion_tokens": 2}})
    )
    assert isinstance(out, outcomes.Finish) and out.transition.to_status == "cancelled"
    assert out.transition.set_fields["progress_tokens"] == 2
    assert "output" in out.transition.set_fields


def test_written_alone_for_early_webhook_events_or_unsettled_progress() -> None:
    loud = {**RECORD, "webhook": '{"url": "https://x", "events": ["job.started"]}'}
    out = decide({"ok": True}, loud)
    assert isinstance(out, outcomes.Finish) and out.alone
    # Progress was reported and the result sets no count: the record's count is unknown.
    out = decide({"ok": True}, reported=True)
    assert isinstance(out, outcomes.Finish) and out.alone
    out = decide({"ok": True, "usage": {"completion_tokens": 1}}, reported=True)
    assert isinstance(out, outcomes.Finish) and not out.alone


# ---------------------------------------------------------------------- receive by capacity
class StubQueue:
    """An SQS stub: one queue of ``n`` messages; a receive returns up to what it asks for."""

    def __init__(self, n: int) -> None:
        self.waiting = [f"m{i}" for i in range(n)]
        self.asked: list[int] = []
        self.released: list[tuple[str, int]] = []

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        self.asked.append(kw["MaxNumberOfMessages"])
        got, self.waiting = (
            self.waiting[: kw["MaxNumberOfMessages"]],
            self.waiting[kw["MaxNumberOfMessages"] :],
        )
        if not got:
            time.sleep(0.02)  # a (short) long poll
        return {"Messages": [{"MessageId": m, "ReceiptHandle": m, "Body": "{}"} for m in got]}

    def change_message_visibility_batch(self, **kw: Any) -> dict[str, Any]:
        self.released += [(e["ReceiptHandle"], e["VisibilityTimeout"]) for e in kw["Entries"]]
        return {}


def intake_over(sqs: StubQueue, capacity: int, running: list[int]) -> Intake:
    held = HeldMessages(sqs)
    return Intake(
        held,
        {"normal": "q"},
        capacity=capacity,
        running=lambda: running[0],
        stop_event=threading.Event(),
        receive_max=min(10, capacity),
        receive_wait_seconds=0,
        max_wait_seconds=0.0,
        stop_release_delay=1.0,
    )


@pytest.mark.parametrize("capacity", [1, 3])
def test_the_intake_receives_only_what_the_worker_can_start(capacity: int) -> None:
    """Issue 18.1: a worker with ``capacity`` free slots holds at most that many messages;
    the others stay in the queue, for other workers, until a slot frees."""
    sqs, running = StubQueue(8), [0]
    intake = intake_over(sqs, capacity, running)
    intake.start()
    try:
        time.sleep(0.3)
        assert intake.backlog() == capacity and len(sqs.waiting) == 8 - capacity
        # The handler takes them all: they run, and the worker is full.
        taken = intake.take(capacity, gather_seconds=0)
        # While their starts are being written they are neither in hand nor running: they
        # still count, or the intake would receive one more for each.
        time.sleep(0.3)
        assert len(sqs.waiting) == 8 - capacity, "received while the take was starting jobs"
        running[0] = len(taken)
        intake.started(len(taken))
        time.sleep(0.3)
        assert len(sqs.waiting) == 8 - capacity, "a full worker received more"
        # One finishes: exactly one more is received.
        running[0] -= 1
        time.sleep(0.3)
        assert intake.backlog() == 1 and len(sqs.waiting) == 8 - capacity - 1
        assert max(sqs.asked) <= capacity
    finally:
        intake.stop_event.set()
        intake.join(5)


# ---------------------------------------------------------------------- journal order
class Log:
    def __init__(self) -> None:
        self.calls: list[str] = []


class StubStore:
    def __init__(self, log: Log) -> None:
        self.log = log

    def transition_many(self, transitions: list[Transition]) -> list[Any]:
        self.log.calls.append(f"write {len(transitions)}")
        return [None] * len(transitions)


class StubEvents:
    def __init__(self, log: Log) -> None:
        self.log = log

    def publish_many(self, records: list[dict[str, Any]]) -> None:
        self.log.calls.append("publish " + ",".join(r["status"] for r in records))


class StubSqsDeletes:
    def __init__(self, log: Log) -> None:
        self.log = log

    def delete_message_batch(self, **kw: Any) -> dict[str, Any]:
        self.log.calls.append(f"delete {len(kw['Entries'])}")
        return {}


def test_a_terminal_write_and_its_event_go_before_its_message_is_deleted() -> None:
    log = Log()
    lock = threading.RLock()
    journal: Journal
    held = HeldMessages(StubSqsDeletes(log), before_delete=lambda: journal.flush())
    journal = Journal(
        StubStore(log),  # type: ignore[arg-type]
        StubEvents(log),  # type: ignore[arg-type]
        held,
        lock=lock,
        visibility_timeout_seconds=30,
    )
    h = Held(message_id="m", receipt="r", body="{}", queue_url="q", job_id="job_A", attempts=1)
    out = decide({"ok": True}, {**RECORD, "attempts": 1})
    assert isinstance(out, outcomes.Finish)
    journal.add(Finished(h, {**RECORD, "attempts": 1}, out.transition, out.alone))
    held.flush_deletes()  # the pending write, then its event, then its message's deletion
    assert log.calls == ["write 1", "publish succeeded", "delete 1"]


# ---------------------------------------------------------------------- echo
def items(n: int, sleep: float) -> list[WorkItem]:
    return [
        WorkItem(job_id=f"j{i}", input=EchoInput(sleep_seconds=sleep), raw_input={"i": i})
        for i in range(n)
    ]


def test_echo_runs_the_items_of_a_batch_concurrently(clean_env: pytest.MonkeyPatch) -> None:
    handler = MODELS["echo"].load_handler()
    t0 = time.monotonic()
    results = handler.predict(items(4, 0.5))
    elapsed = time.monotonic() - t0
    assert results == [{"i": i} for i in range(4)]
    assert elapsed < 1.5, f"four 0.5 s items took {elapsed:.2f}s: they did not overlap"
    assert handler.batching and handler.capacity(10) == 10


def test_echo_one_at_a_time_by_setting(clean_env: pytest.MonkeyPatch) -> None:
    apply_env(clean_env, {"ASYNCINFER_ECHO_BATCHING": "0"})
    # As the worker's entry point does: the model part of the settings read from the environment.
    handler = MODELS["echo"].load_handler(settings=Settings.from_env().model_settings)
    assert not handler.batching and handler.capacity(10) == 1


class FlakyEvents:
    """Refuses every event of the jobs in ``down``; records what went out, in order."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.out: list[str] = []

    def publish_many(self, records: list[dict[str, Any]]) -> None:
        if any(r["job_id"] in self.down for r in records):
            raise RuntimeError("SNS refused an entry")
        self.out += [f"{r['job_id']} {r['status']}" for r in records]

    def publish(self, record: dict[str, Any]) -> None:
        self.publish_many([record])


def test_an_event_that_fails_keeps_its_message_and_its_jobs_later_events() -> None:
    """Issue 14.6: a message is deleted only once its job's event is out; a job's events keep
    their order across the retry; other jobs' events are not held back."""
    log = Log()
    lock = threading.RLock()
    held = HeldMessages(StubSqsDeletes(log))
    events = FlakyEvents()
    journal = Journal(
        StubStore(log),  # type: ignore[arg-type]
        events,  # type: ignore[arg-type]
        held,
        lock=lock,
        visibility_timeout_seconds=30,
    )
    a = Held(message_id="a", receipt="a", body="{}", queue_url="q")
    b = Held(message_id="b", receipt="b", body="{}", queue_url="q")
    events.down = {"A"}
    journal.event({"job_id": "A", "status": "running"})
    journal.event({"job_id": "B", "status": "succeeded"}, then_delete=b)
    journal.event({"job_id": "A", "status": "succeeded"}, then_delete=a)
    journal.publish()
    assert events.out == ["B succeeded"]
    assert held.to_delete == [b]  # a's event is not out: a is kept
    assert journal.retrying
    journal.publish()  # within the pause after a failure: no new try
    assert events.out == ["B succeeded"]
    events.down = set()
    journal.publish(force=True)
    assert events.out == ["B succeeded", "A running", "A succeeded"]
    assert held.to_delete == [b, a] and not journal.retrying


class HangingEvents:
    """SNS out: every publish blocks until ``release`` is set, then fails (botocore retrying for
    seconds); counts the calls made."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def publish_many(self, records: list[dict[str, Any]]) -> None:
        self.calls += 1
        self.entered.set()
        self.release.wait(10)
        raise RuntimeError("SNS unavailable")

    def publish(self, record: dict[str, Any]) -> None:
        self.publish_many([record])


def test_an_sns_outage_never_holds_the_write_lock_the_lease_renewals_need() -> None:
    """Issue 14.1 (review): the watcher renews leases under the worker's write lock; a publish
    stuck in SNS retries must not hold it, or live workers' jobs would lapse and be taken back.
    A publish in progress makes another thread's publish return at once; one outage costs a few
    calls, not one per buffered event."""
    log = Log()
    lock = threading.RLock()
    held = HeldMessages(StubSqsDeletes(log))
    events = HangingEvents()
    journal = Journal(
        StubStore(log),  # type: ignore[arg-type]
        events,  # type: ignore[arg-type]
        held,
        lock=lock,
        visibility_timeout_seconds=30,
    )
    for n in range(20):
        journal.event({"job_id": f"J{n}", "status": "succeeded"})
    publisher = threading.Thread(target=journal.publish, daemon=True)
    publisher.start()
    assert events.entered.wait(5)
    got = lock.acquire(timeout=1)  # what Watcher.renew_leases does
    assert got, "the write lock is held while SNS is called"
    lock.release()
    t0 = time.monotonic()
    journal.flush()  # the watcher's or the main loop's flush: no wait for the other publish
    assert time.monotonic() - t0 < 1
    events.release.set()
    publisher.join(5)
    assert not publisher.is_alive()
    assert events.calls <= 3  # the batch, then two one by one: SNS is taken to be out
    assert len(journal.events) == 20 and journal.retrying  # every event kept for a later try
