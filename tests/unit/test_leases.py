"""Issue 14, behaviour 1: no job is ``running`` without a live worker (moto in-process).

A running job holds a lease its worker's heartbeat renews; the sweeper takes back a job whose
lease lapsed, whatever lost it: a worker killed after the job's TTL passed, a SageMaker bridge
that died between marking the job running and invoking the endpoint, a completion notification
that never came. A late notification of attempt 1 never finishes attempt 2."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

import asyncinfer.functions.sweeper as sweeper
from asyncinfer.aws import clients
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.settings import Settings
from asyncinfer.core.timeutil import now
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.sagemaker_bridge import Bridge, inference_id
from asyncinfer.functions.sagemaker_completion import Completion
from asyncinfer.jobs import leases
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import LEASE_FIELD, JobStore
from asyncinfer.local.resources import Resources
from asyncinfer.worker import finishing
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.runner import Worker
from tests.conftest import drain_events
from tests.unit.helpers import count_calls
from tests.unit.test_sagemaker_paths import queue_async_results

TENANT = "t1"
LEASE = 5


@pytest.fixture
def lset(settings: Settings) -> Settings:
    """The unit settings with a short lease (seconds)."""
    return settings.model_copy(update={"lease_seconds": float(LEASE)})


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


def receive(settings: Settings) -> dict[str, Any]:
    """The one message of the echo queue (its receipt, body and receive count)."""
    msgs = clients.client("sqs", settings).receive_message(
        QueueUrl=settings.queue_url("echo"),
        MaxNumberOfMessages=10,
        WaitTimeSeconds=0,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )["Messages"]
    assert len(msgs) == 1
    return msgs[0]


def start_on_worker(settings: Settings, m: dict[str, Any]) -> tuple[Worker, Any]:
    """Hand message ``m`` to a worker as its poller would and start its job."""
    worker = Worker(settings, "echo")
    held = Held(
        message_id=m["MessageId"],
        receipt=m["ReceiptHandle"],
        body=m["Body"],
        queue_url=settings.queue_url("echo"),
        receive_count=int(m["Attributes"]["ApproximateReceiveCount"]),
    )
    worker.inflight.add(held)
    worker.inboxes["normal"].put(held)
    items = worker.take(1, timeout=0)
    assert len(items) == 1
    return worker, items[0]


def types(res: Resources, job_id: str) -> list[str]:
    return [
        e["type"]
        for e in drain_events(clients.client("sqs"), res.event_log_queue)
        if e["data"]["id"] == job_id
    ]


# ---------------------------------------------------------------------------- the store


def test_a_start_takes_a_lease_and_leaving_running_drops_it(lset: Settings) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    t0 = int(time.time())
    rec = store.transition(
        job_id, from_status="queued", to_status="running", increment_attempts=True
    )
    assert t0 + LEASE <= rec[LEASE_FIELD] <= int(time.time()) + LEASE + 1
    assert rec["running_mark"] == "running" and "queued_mark" not in rec
    assert store.running_past_lease(rec[LEASE_FIELD] + 1) == [job_id]
    assert store.running_past_lease(rec[LEASE_FIELD]) == []  # not yet lapsed
    back = store.transition(job_id, from_status="running", to_status="queued", attempts=1)
    assert LEASE_FIELD not in back and "running_mark" not in back
    assert store.running_past_lease(rec[LEASE_FIELD] + 100) == []


def test_renewal_moves_the_lease_only_for_the_running_attempt(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    other = submit(lset)
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    first = store.get(job_id)[LEASE_FIELD]  # type: ignore[index]
    later(monkeypatch, 3)
    # The job's attempt 1 renews; a stale attempt and a job not running are refused.
    assert store.renew_leases([(job_id, 1), (other, 0)]) == {other}
    assert store.get(job_id)[LEASE_FIELD] >= first + 3  # type: ignore[index]
    assert store.renew_leases([(job_id, 2)]) == {job_id}


def test_a_renewal_between_the_sweepers_read_and_write_keeps_the_job(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    later(monkeypatch, LEASE + 2)
    seen = store.get(job_id)
    assert seen is not None and leases.lease_lapsed(seen, int(time.time()))
    assert store.renew_leases([(job_id, 1)]) == set()  # the worker was slow, not gone
    t = leases.takeover(seen, int(time.time()), lset.max_receive_count)
    with pytest.raises(TransitionRefused):
        store.apply(t)
    assert leases.take_back(store, seen, int(time.time()), lset) is None
    assert store.get(job_id)["status"] == "running"  # type: ignore[index]


def test_takeover_fails_at_max_attempts_and_cancels_a_cancel_requested_job(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    spent, cancelled = submit(lset), submit(lset)
    for j in (spent, cancelled):
        store.transition(j, from_status="queued", to_status="running", increment_attempts=True)
    for _ in range(lset.max_receive_count - 1):  # lost attempts 1..n-1, each started again
        store.transition(spent, from_status="running", to_status="queued")
        store.transition(spent, from_status="queued", to_status="running", increment_attempts=True)
    store.update_fields(
        cancelled, status="running", attempts=1, set_fields={"cancel_requested": True}
    )
    later(monkeypatch, LEASE + 2)
    taken = {r["job_id"]: r for r in sweeper.take_back_lapsed(lset)}
    assert taken[spent]["status"] == "failed"
    assert taken[spent]["error"]["code"] == "max_attempts"
    assert taken[spent]["attempts"] == lset.max_receive_count
    assert taken[cancelled]["status"] == "cancelled"
    assert sweeper.take_back_lapsed(lset) == []  # idempotent


# ---------------------------------------------------------------------------- the paths


def test_a_job_whose_worker_was_killed_after_its_ttl_runs_again_and_never_expires(
    lset: Settings, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reproduction of issue 14: an echo job with ttl_seconds 10 whose worker is killed
    (``kill -9``) after its TTL passed while it runs stayed ``running`` with an empty queue."""
    store = JobStore(lset)
    job_id = submit(lset, ttl_seconds=10)
    first = receive(lset)
    start_on_worker(lset, first)  # ... and the worker is killed: nobody renews the lease
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 1

    later(monkeypatch, 30)  # past the TTL (10 s) and the lease (5 s)
    assert [r["job_id"] for r in sweeper.take_back_lapsed(lset)] == [job_id]
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "queued" and rec["attempts"] == 1
    assert sweeper.expire_due(lset) == []  # it started: never expired
    # The dead worker's message comes back once its visibility timeout ran out (at once here).
    sqs = clients.client("sqs", lset)
    sqs.change_message_visibility(
        QueueUrl=lset.queue_url("echo"), ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    second, item = start_on_worker(lset, receive(lset))
    assert item.attempt == 2
    second.finish(item, {"sleep_seconds": 0})
    second.journal.flush()
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "succeeded" and rec["attempts"] == 2
    assert types(resources, job_id) == [
        "job.queued",
        "job.started",
        "job.queued",
        "job.started",
        "job.succeeded",
    ]


def test_a_worker_that_meets_a_job_taken_back_releases_its_message(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker alive but cut off past its lease: its renewal is refused (the job is stopped as
    if cancelled) and its refused terminal write releases the message for the next attempt
    instead of deleting it (which would leave the job queued with no message)."""
    store = JobStore(lset)
    job_id = submit(lset)
    worker, item = start_on_worker(lset, receive(lset))
    later(monkeypatch, LEASE + 2)
    assert [r["status"] for r in sweeper.take_back_lapsed(lset)] == ["queued"]
    worker.watcher.renew_leases(worker.inflight.snapshot())
    assert item.cancel_event.is_set()
    worker.finish(item, {"sleep_seconds": 0})
    worker.journal.flush()
    worker.held.flush_deletes()
    assert store.get(job_id)["status"] == "queued"  # type: ignore[index]
    m = receive(lset)  # the message is back, visible
    assert json.loads(m["Body"])["job_id"] == job_id


def test_jobs_started_together_in_one_transaction_take_a_lease(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take of several first deliveries starts them in one TransactWriteItems call: each
    start takes a lease as a lone one does. Before, those starts were written without one, so
    the jobs were outside the running-lease index (a worker killed before its first heartbeat
    left them to their messages alone) and a duplicate message met them as lapsed, taking them
    back from their live worker."""
    store = JobStore(lset)
    ids = sorted(submit(lset) for _ in range(3))
    msgs = clients.client("sqs", lset).receive_message(
        QueueUrl=lset.queue_url("echo"),
        MaxNumberOfMessages=10,
        WaitTimeSeconds=0,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )["Messages"]
    assert len(msgs) == 3
    worker = Worker(lset, "echo")
    for m in msgs:
        held = Held(
            message_id=m["MessageId"],
            receipt=m["ReceiptHandle"],
            body=m["Body"],
            queue_url=lset.queue_url("echo"),
            receive_count=int(m["Attributes"]["ApproximateReceiveCount"]),
        )
        worker.inflight.add(held)
        worker.inboxes["normal"].put(held)
    calls = count_calls(worker.store.ddb)
    t0 = int(time.time())
    assert len(worker.take(3, timeout=0)) == 3
    assert calls["TransactWriteItems"] >= 1  # started together, not one by one
    for job_id in ids:
        rec = store.get(job_id)
        assert rec is not None and rec["status"] == "running"
        assert t0 + LEASE <= rec[LEASE_FIELD] <= int(time.time()) + LEASE + 1
    # A duplicate of one job's message (a re-send) before the first heartbeat is a duplicate,
    # not a lost attempt: the job stays with its live worker.
    body = next(m["Body"] for m in msgs if json.loads(m["Body"])["job_id"] == ids[0])
    clients.client("sqs", lset).send_message(QueueUrl=lset.queue_url("echo"), MessageBody=body)
    dup = receive(lset)
    other = Worker(lset, "echo")
    held = Held(
        message_id=dup["MessageId"],
        receipt=dup["ReceiptHandle"],
        body=dup["Body"],
        queue_url=lset.queue_url("echo"),
        receive_count=int(dup["Attributes"]["ApproximateReceiveCount"]),
    )
    other.inflight.add(held)
    other.inboxes["normal"].put(held)
    assert other.take(1, timeout=0) == []
    rec = store.get(ids[0])
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 1
    later(monkeypatch, LEASE + 2)  # the worker was killed before its first heartbeat
    assert sorted(store.running_past_lease(int(time.time()))) == ids
    assert sorted(r["job_id"] for r in sweeper.take_back_lapsed(lset)) == ids


def test_the_heartbeat_renews_the_leases_of_running_jobs(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    worker, _ = start_on_worker(lset, receive(lset))
    later(monkeypatch, LEASE - 1)
    worker.watcher.renew_leases(worker.inflight.snapshot())
    later(monkeypatch, LEASE + 2)  # past the first lease, within the renewed one
    assert sweeper.take_back_lapsed(lset) == []
    assert store.get(job_id)["status"] == "running"  # type: ignore[index]


def _bridge(settings: Settings, runtime: Any = None) -> Bridge:
    return Bridge(settings=settings, endpoints={"echo": "ep-echo"}, runtime=runtime)


def _record(m: dict[str, Any]) -> dict[str, Any]:
    return {"Records": [{"messageId": m["MessageId"], "body": m["Body"]}]}


class Died(BaseException):
    """The bridge's Lambda dying (timeout, crash): nothing after it runs."""


class DyingRuntime:
    def invoke_endpoint_async(self, **_: Any) -> Any:
        raise Died


def test_a_bridge_that_died_before_invoking_is_taken_back_and_invoked_again(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    first = receive(lset)
    with pytest.raises(Died):
        _bridge(lset, DyingRuntime()).handle_sqs_event(_record(first))
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and "inference_id" not in rec
    later(monkeypatch, LEASE + 2)
    assert [r["status"] for r in sweeper.take_back_lapsed(lset)] == ["queued"]
    # SQS redelivers the unacknowledged message; the next bridge submits attempt 2.
    sqs = clients.client("sqs", lset)
    sqs.change_message_visibility(
        QueueUrl=lset.queue_url("echo"), ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    assert _bridge(lset).handle_sqs_event(_record(receive(lset))) == {"batchItemFailures": []}
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 2
    assert rec["inference_id"] == inference_id(job_id, 2)


def test_a_redelivery_to_the_bridge_before_the_sweep_takes_the_job_back_itself(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset)
    first = receive(lset)
    with pytest.raises(Died):
        _bridge(lset, DyingRuntime()).handle_sqs_event(_record(first))
    # Within the lease, the redelivered message is retried later, not acknowledged.
    assert _bridge(lset).submit(first["Body"]) is False
    later(monkeypatch, LEASE + 2)
    assert _bridge(lset).submit(first["Body"]) is True
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 2
    assert rec["inference_id"] == inference_id(job_id, 2)


def _invoked(settings: Settings, job_id: str) -> dict[str, Any]:
    queue_async_results({"data": json.dumps({"attempt": 1})}, {"data": json.dumps({"v": 2})})
    assert _bridge(settings).handle_sqs_event(_record(receive(settings)))["batchItemFailures"] == []
    rec = JobStore(settings).get(job_id)
    assert rec is not None and rec["status"] == "running"
    return rec


def test_a_completion_that_never_came_is_taken_back_and_submitted_again(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset, ttl_seconds=600, timeout_seconds=90)
    rec = _invoked(lset, job_id)
    assert rec["inference_id"] == inference_id(job_id, 1)
    # The lease covers the longest SageMaker may hold the request: queue TTL + run timeout.
    assert rec[LEASE_FIELD] >= int(time.time()) + 590 + 90
    later(monkeypatch, 60)
    assert sweeper.take_back_lapsed(lset) == []
    later(monkeypatch, 600 + 90 + LEASE + 2)
    assert [r["status"] for r in sweeper.take_back_lapsed(lset)] == ["queued"]
    # The bridge acknowledged the first message: the sweeper sent it again, built from the record.
    again = receive(lset)
    body = json.loads(again["Body"])
    assert body["job_id"] == job_id and body["input_ref"] == rec["input_ref"]
    assert _bridge(lset).handle_sqs_event(_record(again))["batchItemFailures"] == []
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 2


def test_a_late_notification_of_attempt_1_never_finishes_attempt_2(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobStore(lset)
    job_id = submit(lset, ttl_seconds=600, timeout_seconds=90)
    _invoked(lset, job_id)
    later(monkeypatch, 600 + 90 + LEASE + 2)
    sweeper.take_back_lapsed(lset)
    _bridge(lset).handle_sqs_event(_record(receive(lset)))
    assert store.get(job_id)["attempts"] == 2  # type: ignore[index]
    completion = Completion(settings=lset)

    def note(attempt: int | None, location: str = "s3://nowhere/x") -> dict[str, Any]:
        iid = inference_id(job_id, attempt) if attempt else job_id
        return {
            "inferenceId": iid,
            "invocationStatus": "Completed",
            "responseParameters": {"outputLocation": location},
        }

    assert completion.handle_notification(note(1)) == (job_id, "ignored")
    assert completion.handle_notification(note(None)) == (job_id, "ignored")  # bare id: attempt 1
    assert store.get(job_id)["status"] == "running"  # type: ignore[index]
    out = clients.client("s3", lset)
    out.put_object(Bucket=lset.bucket, Key="outputs/x.json", Body=b'{"v": 2}')
    done = note(2, f"s3://{lset.bucket}/outputs/x.json")
    assert completion.handle_notification(done) == (job_id, "succeeded")
    rec = store.get(job_id)
    assert rec is not None and json.loads(rec["output"]) == {"v": 2}


def test_reading_a_job_handed_back_after_its_ttl_does_not_expire_it(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncinfer.jobs.service as jobs

    store = JobStore(lset)
    job_id = submit(lset, ttl_seconds=10)
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    store.transition(job_id, from_status="running", to_status="queued", attempts=1)
    monkeypatch.setattr(jobs, "now", lambda: now() + timedelta(seconds=30))
    service = JobService(lset)
    calls = count_calls(service.store.ddb)
    assert service.get(TENANT, job_id)["status"] == "queued"
    assert calls == Counter({"GetItem": 1})  # no refused expiry write, no second read


class SlowRuntime:
    """InvokeEndpointAsync that returns only after the job's lease lapsed and the sweeper took
    the job back."""

    def __init__(self, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
        self.settings, self.monkeypatch = settings, monkeypatch

    def invoke_endpoint_async(self, **_: Any) -> Any:
        later(self.monkeypatch, LEASE + 2)
        assert [r["status"] for r in sweeper.take_back_lapsed(self.settings)] == ["queued"]
        return {"InferenceId": "x", "OutputLocation": "s3://b/o"}


def test_a_bridge_whose_job_was_taken_back_during_the_call_keeps_the_message(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acknowledging it would leave the job queued with no message (and no sweeper re-send)."""
    job_id = submit(lset)
    m = receive(lset)
    assert _bridge(lset, SlowRuntime(lset, monkeypatch)).submit(m["Body"]) is False
    rec = JobStore(lset).get(job_id)
    assert rec is not None and rec["status"] == "queued" and "inference_id" not in rec


def test_the_sweeper_lambda_takes_back_lapsed_leases(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncinfer.local.lambda_runtime import LocalContext

    monkeypatch.setenv("ASYNCINFER_LEASE_SECONDS", str(LEASE))
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "asyncinfer")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setattr("asyncinfer.functions.sweeper.get_settings", Settings.from_env)
    store = JobStore(Settings.from_env())
    job_id = submit(settings)
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    later(monkeypatch, LEASE + 2)
    assert sweeper.handler({}, LocalContext("sweeper")) == {"expired": 0, "taken_back": 1}
    assert store.get(job_id)["status"] == "queued"  # type: ignore[index]


def test_lease_length_is_a_setting_defaulting_to_three_heartbeats() -> None:
    assert Settings(visibility_timeout_seconds=120).lease_interval == 120  # heartbeat 40 s
    assert Settings(heartbeat_seconds=1.5).lease_interval == 5  # 4.5 s, rounded up
    env = {"ASYNCINFER_LEASE_SECONDS": "7", "ASYNCINFER_SWEEP_SECONDS": "0.5"}
    s = Settings.from_env(env)
    assert (s.lease_interval, s.sweep_seconds) == (7, 0.5)


def test_a_stalled_worker_leaves_the_message_of_the_newer_attempt_alone(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A stalls (SIGSTOP) past its lease and its message's visibility timeout; the job is
    taken back and worker B runs attempt 2 from the same message. When A wakes, its refused
    terminal write must not delete the message with its stale receipt handle: that left the job
    with no message, and once B was lost in turn the job stayed queued for good (found by the
    breaker)."""
    store = JobStore(lset)
    sqs = clients.client("sqs", lset)
    job_id = submit(lset)
    first = receive(lset)
    worker_a, item_a = start_on_worker(lset, first)
    later(monkeypatch, LEASE + 2)
    assert [r["status"] for r in sweeper.take_back_lapsed(lset)] == ["queued"]
    # A's visibility lapsed too (it extended nothing while stopped): B receives the message.
    sqs.change_message_visibility(
        QueueUrl=lset.queue_url("echo"), ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    second = receive(lset)
    _worker_b, item_b = start_on_worker(lset, second)
    assert item_b.attempt == 2
    # A wakes and finishes attempt 1: refused (the job runs attempt 2).
    worker_a.finish(item_a, {"sleep_seconds": 0})
    worker_a.journal.flush()
    worker_a.held.flush_deletes()
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 2
    assert worker_a.inflight.snapshot() == []  # A holds nothing any more
    attrs = sqs.get_queue_attributes(
        QueueUrl=lset.queue_url("echo"), AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"  # B's message still exists
    # B is lost in turn: its message comes back and attempt 3 can run.
    sqs.change_message_visibility(
        QueueUrl=lset.queue_url("echo"), ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0
    )
    assert json.loads(receive(lset)["Body"])["job_id"] == job_id


def test_an_sns_failure_does_not_stop_the_sweep(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos run (tests/e2e/test_chaos.py): a publish that failed in an SNS outage raised
    out of the sweep, so the other lapsed and expired jobs of the round stayed as they were."""
    store = JobStore(lset)
    lapsed = [submit(lset) for _ in range(3)]
    for j in lapsed:
        store.transition(j, from_status="queued", to_status="running", increment_attempts=True)
    due = [submit(lset, ttl_seconds=10) for _ in range(2)]
    calls: list[str] = []

    def failing_publish(self: Any, record: dict[str, Any]) -> None:
        calls.append(record["job_id"])
        raise RuntimeError("SNS is down")

    monkeypatch.setattr(sweeper.EventPublisher, "publish", failing_publish)
    later(monkeypatch, 30)  # past the leases (5 s) and the TTLs (10 s)
    taken = sweeper.take_back_lapsed(lset)
    assert sorted(r["job_id"] for r in taken) == sorted(lapsed)
    assert sorted(sweeper.expire_due(lset)) == sorted(due)
    assert sorted(calls) == sorted(lapsed + due)  # each event was tried
    for j in lapsed:
        rec = store.get(j)
        assert rec is not None and rec["status"] == "queued"


def test_a_page_of_jobs_that_cannot_be_taken_back_does_not_hide_the_others(
    lset: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of issue 14: each round read the first page of the running-lease index again and
    stopped once all of it was seen, so a page of lapsed jobs whose takeover kept failing (an AWS
    fault, a record it cannot handle) left every lapsed job behind them ``running`` for ever."""
    store = JobStore(lset)
    jobs = [submit(lset) for _ in range(3)]
    t = int(time.time())
    for n, j in enumerate(jobs):
        store.transition(j, from_status="queued", to_status="running", increment_attempts=True)
        # Oldest leases first: the two poison jobs fill the first page.
        assert store.update_fields(
            j, status="running", attempts=1, set_fields={LEASE_FIELD: t - 100 + n}
        )
    poison, healthy = set(jobs[:2]), jobs[2]
    real = sweeper._take_back_one

    def take_back_one(store: JobStore, sqs: Any, settings: Settings, job_id: str, e: int) -> Any:
        if job_id in poison:
            raise RuntimeError("cannot take this one back")
        return real(store, sqs, settings, job_id, e)

    monkeypatch.setattr(sweeper, "_take_back_one", take_back_one)
    # A limit of 2 makes pages of 2 (a real sweep: 100 poison jobs in pages of 100).
    assert [r["job_id"] for r in sweeper.take_back_lapsed(lset, limit=2)] == [healthy]
    rec = store.get(healthy)
    assert rec is not None and rec["status"] == "queued"
