"""The worker against a moto server: delivery, retries, dead-lettering and shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from asyncinfer.aws import clients
from asyncinfer.functions.dlq import handler
from asyncinfer.local.event_source import sqs_event_record
from asyncinfer.local.lambda_runtime import LocalContext
from tests.integration.conftest import Env, WorkerThread


def types_for(events: list[dict], job_id: str) -> list[str]:
    return [e["type"] for e in events if e["data"]["id"] == job_id]


def test_echo_job_runs_once_and_message_is_deleted(make_env: Callable[..., Env]) -> None:
    env = make_env()
    job_id = env.submit("echo", {"hello": "world"})
    with WorkerThread(env.settings):
        rec = env.wait_for(job_id, {"succeeded"})
    assert json.loads(rec["output"]) == {"hello": "world"}
    assert rec["attempts"] == 1
    assert rec["started_at"] and rec["completed_at"]
    assert env.queue_counts(env.resources.queues["echo"]) == (0, 0)
    assert types_for(env.events(), job_id) == ["job.queued", "job.started", "job.succeeded"]


@pytest.mark.parametrize("heartbeat", [True, False])
def test_job_longer_than_visibility_timeout_runs_once(
    make_env: Callable[..., Env], heartbeat: bool
) -> None:
    """Visibility timeout 2 s, a 6 s job, two workers on the queue. With heartbeats the message
    is received once and the job runs exactly once; without them (the control) the message is
    delivered again mid-run."""
    env = make_env(visibility_timeout_seconds=2, heartbeat_seconds=0.5 if heartbeat else 1000)
    job_id = env.submit("echo", {"sleep_seconds": 6})
    receipts: list[str] = []

    def count(parsed: dict, **_: object) -> None:
        for m in parsed.get("Messages", []):
            if job_id in m["Body"]:
                receipts.append(m["ReceiptHandle"])

    sqs = clients.client("sqs", env.settings)  # the client the workers share
    sqs.meta.events.register("after-call.sqs.ReceiveMessage", count)
    try:
        with WorkerThread(env.settings), WorkerThread(env.settings):
            rec = env.wait_for(job_id, {"succeeded"}, timeout=30)
            time.sleep(1.5)
    finally:
        sqs.meta.events.unregister("after-call.sqs.ReceiveMessage", count)
    started = types_for(env.events(), job_id).count("job.started")
    if heartbeat:
        assert len(receipts) == 1
        assert rec["attempts"] == 1
        assert started == 1
        assert rec["output"] == json.dumps({"sleep_seconds": 6}, separators=(",", ":"))
    else:
        assert len(receipts) >= 2


def test_retryable_error_then_success(make_env: Callable[..., Env]) -> None:
    env = make_env()
    job_id = env.submit("echo", {"fail": {"kind": "retryable", "attempts": 1}})
    with WorkerThread(env.settings):
        rec = env.wait_for(job_id, {"succeeded"})
    assert rec["attempts"] == 2
    assert types_for(env.events(), job_id) == [
        "job.queued",
        "job.started",
        "job.queued",
        "job.started",
        "job.succeeded",
    ]


def test_permanent_error_fails_at_once(make_env: Callable[..., Env]) -> None:
    env = make_env()
    job_id = env.submit("echo", {"fail": {"kind": "permanent"}})
    with WorkerThread(env.settings):
        rec = env.wait_for(job_id, {"failed"})
    assert rec["attempts"] == 1
    assert rec["error"]["code"] == "invalid_input"
    assert env.queue_counts(env.resources.queues["echo"]) == (0, 0)
    assert types_for(env.events(), job_id)[-1] == "job.failed"


def test_poison_message_goes_to_dlq_and_fails_with_max_attempts(
    make_env: Callable[..., Env],
) -> None:
    env = make_env(max_receive_count=2)
    job_id = env.submit("echo", {"fail": {"kind": "retryable"}})
    sqs = clients.client("sqs", env.settings)
    dlq = env.resources.dlqs["echo"]
    with WorkerThread(env.settings):
        deadline = time.monotonic() + 30
        while env.queue_counts(dlq)[0] == 0:
            assert time.monotonic() < deadline, "message never reached the DLQ"
            time.sleep(0.2)
    assert env.job(job_id)["attempts"] == 2
    msgs = sqs.receive_message(QueueUrl=dlq, MessageSystemAttributeNames=["All"])["Messages"]
    event = {"Records": [sqs_event_record(m, dlq) for m in msgs]}
    os.environ.update(env.env)
    from tests.conftest import reset_caches

    reset_caches()
    result = handler(event, LocalContext())
    assert result == {"batchItemFailures": []}
    rec = env.job(job_id)
    assert rec["status"] == "failed"
    assert rec["error"]["code"] == "max_attempts"
    assert types_for(env.events(), job_id)[-1] == "job.failed"
    # A second delivery of the same dead letter changes nothing.
    assert handler(event, LocalContext()) == {"batchItemFailures": []}
    assert env.job(job_id)["status"] == "failed"


def test_lost_worker_late_write_is_refused(make_env: Callable[..., Env]) -> None:
    """A job found 'running' on redelivery goes back to queued and runs as attempt 2; the lost
    attempt's late 'succeeded' write is refused."""
    env = make_env()
    job_id = env.submit("echo", {"n": 1})
    store = env.store
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    with WorkerThread(env.settings):
        rec = env.wait_for(job_id, {"succeeded"})
    assert rec["attempts"] == 2
    from asyncinfer.core.errors import TransitionRefused

    with pytest.raises(TransitionRefused):
        store.transition(job_id, from_status="running", to_status="succeeded", attempts=1)


def test_cancelled_job_is_skipped(make_env: Callable[..., Env]) -> None:
    env = make_env()
    from asyncinfer.jobs.service import JobService

    job_id = env.submit("echo", {"n": 1})
    JobService(env.settings).cancel("t1", job_id)
    with WorkerThread(env.settings):
        deadline = time.monotonic() + 10
        while env.queue_counts(env.resources.queues["echo"]) != (0, 0):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    rec = env.job(job_id)
    assert rec["status"] == "cancelled" and rec["attempts"] == 0


def test_running_job_is_cancelled_at_a_step_boundary(make_env: Callable[..., Env]) -> None:
    env = make_env()
    from asyncinfer.jobs.service import JobService

    job_id = env.submit("echo", {"sleep_seconds": 30})
    with WorkerThread(env.settings):
        env.wait_for(job_id, {"running"})
        t0 = time.monotonic()
        view = JobService(env.settings).cancel("t1", job_id)
        assert view["status"] == "running"
        rec = env.wait_for(job_id, {"cancelled"}, timeout=10)
        assert time.monotonic() - t0 < 5
    assert rec["error"]["code"] == "cancelled"


def test_job_past_timeout_fails_with_timeout(make_env: Callable[..., Env]) -> None:
    env = make_env()
    job_id = env.submit("echo", {"sleep_seconds": 10}, timeout_seconds=1)
    with WorkerThread(env.settings):
        rec = env.wait_for(job_id, {"failed"}, timeout=15)
    assert rec["error"]["code"] == "timeout"


@pytest.mark.parametrize(("sleep", "expected"), [(10, "queued"), (1, "succeeded")])
def test_sigterm_mid_job_leaves_no_job_running(
    make_env: Callable[..., Env], sleep: float, expected: str
) -> None:
    """SIGTERM while a job runs: a job that ends within the drain period (2 s) finishes; a longer
    one is released back to queued with its message visible. The worker exits 0 either way."""
    env = make_env(drain_seconds=2)
    job_id = env.submit("echo", {"sleep_seconds": sleep})
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncinfer.worker", "--model", "echo"],
        env={**os.environ, **env.env},
    )
    try:
        env.wait_for(job_id, {"running"}, timeout=30)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    rec = env.job(job_id)
    assert rec["status"] == expected
    if expected == "queued":
        assert env.queue_counts(env.resources.queues["echo"]) == (1, 0)
        assert types_for(env.events(), job_id)[-1] == "job.queued"


def test_a_bad_message_fails_its_own_job_and_spares_the_batch(
    make_env: Callable[..., Env],
) -> None:
    """A job whose input cannot be read (here a message naming an S3 location S3 would refuse,
    sent past the API's checks) fails with invalid_input; the jobs batched with it succeed and
    the worker keeps running."""
    from asyncinfer.jobs.messages import JobMessage

    env = make_env()
    good = [env.submit("echo", {"n": i}) for i in range(4)]
    bad = env.submit("echo", {"n": "bad"})
    rec = env.job(bad)
    # Replace the bad job's message with one whose input_ref S3 would refuse.
    sqs = clients.client("sqs", env.settings)
    url = env.resources.queues["echo"]
    msgs = []
    while len(msgs) < 5:
        msgs += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    for m in msgs:
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
        if bad in m["Body"]:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    forged = JobMessage(
        job_id=bad,
        tenant="t1",
        model="echo",
        expires_at=rec["expires_at"],
        timeout_seconds=60,
        input_ref="s3://asyncinfer-payloads:80/uploads/t1/x.json",
    )
    sqs.send_message(QueueUrl=url, MessageBody=forged.dumps())
    with WorkerThread(env.settings):
        failed = env.wait_for(bad, {"failed", "succeeded"})
        for job_id in good:
            assert env.wait_for(job_id, {"succeeded", "failed"})["status"] == "succeeded"
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "invalid_input"


def test_redelivered_message_of_a_finished_job_republishes_its_event(
    make_env: Callable[..., Env],
) -> None:
    """A worker that died after the terminal write but before publishing and deleting: the
    next receive finds the job finished, publishes its terminal event again, deletes the
    message, and runs nothing."""
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
        to_status="succeeded",
        attempts=1,
        set_fields={"output": "{}"},
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
    assert types_for(env.events(), job_id) == ["job.succeeded"]
    assert env.job(job_id)["attempts"] == 1
