"""The worker's AWS requests per job against a moto server (issue 6: at most 7 a job from submit
to terminal state): jobs taken together are marked running in one TransactWriteItems call and
finished in another, a refused item falls back to the per-job path, and what the worker
publishes equals the records it wrote."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.view import render_job
from tests.integration.conftest import Env, WorkerThread


@contextmanager
def counting(env: Env) -> Iterator[Counter[str]]:
    """Counts the requests of the (shared) SQS, SNS and DynamoDB clients; receives that
    returned no message (idle polling) and the test's own reads are left out."""
    calls: Counter[str] = Counter()

    def hook(model: Any, parsed: Any = None, **_: Any) -> None:
        if model.name == "ReceiveMessage" and not (parsed or {}).get("Messages"):
            return
        if model.name in ("GetItem", "GetQueueAttributes"):  # wait_for, queue_counts
            return
        calls[model.name] += 1

    hooked = [clients.client(s, env.settings) for s in ("sqs", "sns", "dynamodb")]
    for c in hooked:
        c.meta.events.register("after-call", hook, unique_id="count-requests")
    try:
        yield calls
    finally:
        for c in hooked:
            c.meta.events.unregister("after-call", unique_id="count-requests")


def events_of(events: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["data"]["id"] == job_id]


def wait_empty(env: Env) -> None:
    import time

    deadline = time.monotonic() + 15
    while env.queue_counts(env.resources.queues["echo"]) != (0, 0):
        assert time.monotonic() < deadline, "messages left in the queue"
        time.sleep(0.2)


def test_jobs_taken_together_cost_two_writes_and_two_publishes(
    make_env: Callable[..., Env],
) -> None:
    """Five jobs waiting when the worker starts: one receive, one transaction marks them
    running, one marks them succeeded, one PublishBatch each for the started and the terminal
    events, one DeleteMessageBatch. With the submit's three requests that is 4.2 a job."""
    env = make_env()
    ids = [env.submit("echo", {"n": n}, metadata={"ref": f"r{n}"}) for n in range(5)]
    with counting(env) as calls:
        with WorkerThread(env.settings):
            for j in ids:
                env.wait_for(j, {"succeeded"})
        wait_empty(env)
    assert calls == Counter(
        {
            "ReceiveMessage": 1,
            "TransactWriteItems": 2,
            "PublishBatch": 2,
            "DeleteMessageBatch": 1,
        }
    ), calls
    events = env.events()
    for j in ids:
        evs = events_of(events, j)
        assert [e["type"] for e in evs] == ["job.queued", "job.started", "job.succeeded"]
        rec = env.job(j)
        assert rec["attempts"] == 1
        # The records the worker did not read back are the ones it wrote.
        assert evs[2]["data"] == render_job(rec)
        # ...and the started event shows the record as the start left it.
        # (Less what only the terminal write sets: its time, output and compute cost.)
        terminal_only = ("completed_at", "output", "compute_seconds", "cost_usd")
        at_start = {k: v for k, v in rec.items() if k not in terminal_only}
        assert evs[1]["data"] == render_job({**at_start, "status": "running"})
        assert evs[1]["data"]["metadata"] == {"ref": f"r{ids.index(j)}"}


def test_a_refused_start_falls_back_to_the_job_alone(make_env: Callable[..., Env]) -> None:
    """Of four jobs taken together, one was cancelled while queued and one was put back to the
    queue after an attempt (its message is on its first delivery, the record at attempt 1): the
    transaction is refused for those two; the cancelled one is skipped, the other starts alone
    as attempt 2, and the two others start in a second transaction."""
    env = make_env()
    ids = [env.submit("echo", {"n": n}) for n in range(4)]
    JobService(env.settings).cancel("t1", ids[1])
    store = env.store
    store.transition(ids[2], from_status="queued", to_status="running", increment_attempts=True)
    store.transition(ids[2], from_status="running", to_status="queued", attempts=1)
    with WorkerThread(env.settings):
        done = [env.wait_for(j, {"succeeded", "cancelled"}) for j in ids]
        wait_empty(env)
    assert [r["status"] for r in done] == ["succeeded", "cancelled", "succeeded", "succeeded"]
    assert [r["attempts"] for r in done] == [1, 0, 2, 1]
    events = env.events()
    assert [e["type"] for e in events_of(events, ids[1])] == ["job.queued", "job.cancelled"]
    for j in (ids[0], ids[2], ids[3]):
        evs = events_of(events, j)
        assert evs[-1]["type"] == "job.succeeded"
        assert evs[-1]["data"] == render_job(env.job(j))


def test_a_redelivered_job_and_a_lost_attempt_still_refuse_late_writes(
    make_env: Callable[..., Env],
) -> None:
    """A job found running (its worker lost) among jobs started together: it goes back to
    queued and runs as attempt 2; the lost attempt's late terminal write is refused, in a batch
    as alone."""
    from asyncinfer.core.errors import TransitionRefused
    from asyncinfer.jobs.transitions import Transition

    env = make_env()
    ids = [env.submit("echo", {"n": n}) for n in range(3)]
    store = env.store
    store.transition(ids[0], from_status="queued", to_status="running", increment_attempts=True)
    with WorkerThread(env.settings):
        done = [env.wait_for(j, {"succeeded"}) for j in ids]
    assert [r["attempts"] for r in done] == [2, 1, 1]
    late = Transition(ids[0], from_status="running", to_status="succeeded", attempts=1)
    outcome = store.transition_many([late, Transition(ids[1], "running", "failed", attempts=1)])
    assert all(isinstance(o, TransitionRefused) for o in outcome)
    assert env.job(ids[0])["status"] == "succeeded" and env.job(ids[0])["attempts"] == 2


def test_a_job_whose_webhook_takes_started_events_is_written_alone(
    make_env: Callable[..., Env],
) -> None:
    """The webhook dispatcher writes delivery state on such a job while it runs, so the worker
    writes it with UpdateItem and publishes the records DynamoDB returns; the job beside it
    still goes in transactions."""
    env = make_env(local_mode=True)
    hook = {"url": "http://127.0.0.1:9/hook", "events": ["job.started", "job.succeeded"]}
    loud = env.submit("echo", {"n": 1}, webhook=hook)
    quiet = [env.submit("echo", {"n": n}) for n in range(2)]
    with counting(env) as calls, WorkerThread(env.settings):
        for j in (loud, *quiet):
            env.wait_for(j, {"succeeded"})
    assert calls["UpdateItem"] == 2  # running and succeeded, the loud job's
    assert calls["TransactWriteItems"] == 2
    rec = env.job(loud)
    assert json.loads(rec["webhook"])["events"] == hook["events"]
    evs = events_of(env.events(), loud)
    assert [e["type"] for e in evs] == ["job.queued", "job.started", "job.succeeded"]
    assert evs[-1]["data"] == render_job(rec)
